#!/usr/bin/env bash
# Issue 45 on one GPU of the offline image (device tool; H100 or H200): SGLang 0.5.17 captures
# (in-process ModelRunner) and serves EAGLE-3 next to vLLM 0.26.0, then what the previous GPU
# round left unrun. One part per device call, each under 10 minutes; the call list, carry paths
# and minutes are in bench/gpu_2026-12-06/README.md.
#
#   bash bench/gpu_2026-12-06.sh stash   "$OUT"  # keep the carried bundle parts outside the repo
#   bash bench/gpu_2026-12-06.sh install "$OUT"  # install both bundles, check each engine
#   bash bench/gpu_2026-12-06.sh capture "$OUT"  # SGLang capture vs HF on the default target
#   bash bench/gpu_2026-12-06.sh job     "$OUT"  # 01, 02b by SGLang, 03 CUDA, 04 SGLang + vLLM
#   bash bench/gpu_2026-12-06.sh serve   "$OUT"  # served tok/s, drafter on/off, batch 1/8/32, both
#   bash bench/gpu_2026-12-06.sh speed   "$OUT"  # SGLang capture vs its plain prefill, 8B shape
#   bash bench/gpu_2026-12-06.sh moe     "$OUT"  # Qwen3-MoE shape capture ratio (vLLM, HF)
#   bash bench/gpu_2026-12-06.sh wb8b    "$OUT"  # the workbook on the Llama-3.1-8B shape
#   bash bench/gpu_2026-12-06.sh install-vllm "$OUT"  # vLLM's bundle only (what online needs)
#   bash bench/gpu_2026-12-06.sh online  "$OUT"  # issue 44: vLLM-fed vs offline vs HF-online, 8B shape
#   bash bench/gpu_2026-12-06.sh online-default "$OUT"  # issue 44: bench/online.py, default target
#   bash bench/gpu_2026-12-06.sh rules   "$OUT"  # issue 42: both engines' rules measured on CUDA, rows hidden
#
# Every number lands in a JSON under OUT/results (device, versions, commit, code digest); the
# log in OUT/run_<part>.log. Work files under $WORK (default /tmp/e3gpu), parts under $PARTS
# (default /root/e3parts), installs under $OFF (default /root/e3off): they stay between calls
# while the machine is held; a fresh machine needs stash + install again.
set -uo pipefail
part="${1:?usage: bash bench/gpu_2026-12-06.sh stash|chunks|install|capture|job|serve|speed|moe|wb8b|install-vllm|online|online-default|rules OUT}"
OUT="${2:?usage: bash bench/gpu_2026-12-06.sh PART OUT}"
cd "$(dirname "$0")/.."
REPO=$(pwd)
mkdir -p "$OUT/results"
WORK="${WORK:-/tmp/e3gpu}" PARTS="${PARTS:-/root/e3parts}" OFF="${OFF:-/root/e3off}"
mkdir -p "$WORK" "$PARTS" "$OFF"
VSTEM=vllm-0.26.0-py3.12-torch2.11.0
SSTEM=sglang-0.5.17-py3.12-torch2.11.0
VSITE="$OFF/$VSTEM/site-packages"
SGPY="$OFF/$SSTEM/python"  # install.sh's wrapper: SGLang's site, then vLLM's, then the host's
export PYTHONPATH="$REPO:$VSITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export EAGLE3NB_ENGINE_NETNS=off  # a closed machine: no namespace needed for SGLang's TCPStore
export EAGLE3NB_TWIN_PROOFS="${EAGLE3NB_TWIN_PROOFS:-$WORK/twin_proofs}"
export EAGLE3NB_CACHE="${EAGLE3NB_CACHE:-$WORK/cache}"  # the MLP-padded copy is written there
export EAGLE3NB_MODEL_PATH="${EAGLE3NB_MODEL_PATH:-/root/models}"  # ../shared does not travel
PY="${PY:-python3}"  # another python only for a CPU dry run of a part
need_sglang() {
  [ -x "$SGPY" ] || { echo "no $SGPY: run the stash calls and 'install' first" >&2; exit 2; }
}
need_vllm() {  # vLLM's bundle alone, installed from the stashed parts if not yet (seconds)
  [ -d "$VSITE/vllm" ] || bash "$PARTS/$VSTEM/install.sh" "$OFF/$VSTEM" ||
    { echo "no vLLM bundle parts in $PARTS/$VSTEM: run the chunks calls first" >&2; exit 2; }
}
run() {  # the part's commands, logged; the engines' INFO chatter kept out of the tail
  { echo "== $(date -u +%FT%TZ) $part"; nvidia-smi --query-gpu=name,memory.used,memory.total \
      --format=csv 2>/dev/null; "$@"; echo "== rc $? at $(date -u +%FT%TZ)"; } 2>&1 \
    | tee "$OUT/run_$part.log" | grep -v "^INFO\|^(EngineCore\|Ignore import error" | tail -120
}
case "$part" in
  stash)  # whatever .offline/<stem>/ parts this call carried, kept for the install call
    for d in .offline/$VSTEM .offline/$SSTEM; do
      [ -d "$d" ] || continue
      mkdir -p "$PARTS/$(basename "$d")"
      cp -v "$d"/* "$PARTS/$(basename "$d")/"
    done
    ls -la "$PARTS"/* | tee "$OUT/run_stash.log" ;;
  chunks)  # fewer calls: one tar of both bundles' folders and models/stories260K-hd32, cut into
    # 60 MB chunks carried as .carry/cN/chunkN (the last call also carries bundle.sha); once every
    # chunk is here the tar is checked against its sha256 and unpacked into PARTS and /root/models
    mkdir -p "$PARTS/in" /root/models
    cp -v .carry/c*/chunk* .carry/c*/bundle.sha "$PARTS/in/" 2>/dev/null
    if [ -f "$PARTS/in/bundle.sha" ]; then
      (cd "$PARTS/in" && cat chunk* > bundle.tar && sed 's#  .*#  bundle.tar#' bundle.sha | sha256sum -c) &&
        tar -xf "$PARTS/in/bundle.tar" -C "$PARTS" && cp -r "$PARTS"/models/* /root/models/ &&
        rm -f "$PARTS/in"/chunk* "$PARTS/in/bundle.tar"
    fi
    ls -la "$PARTS" "$PARTS/in" | tee "$OUT/run_chunks.log" ;;
  install)
    run bash -c "
      bash '$PARTS/$VSTEM/install.sh' '$OFF/$VSTEM' && bash '$PARTS/$SSTEM/install.sh' '$OFF/$SSTEM' &&
      $PY -m eagle3nb.offline check | tee '$OUT/results/check_vllm.txt' | tail -1 > '$OUT/results/check_vllm.json';
      PYTHONPATH='$REPO' '$SGPY' -m eagle3nb.offline check --engine sglang | tee '$OUT/results/check_sglang.txt' | tail -1 > '$OUT/results/check_sglang.json'" ;;
  capture)
    need_sglang
    run env PYTHONPATH="$REPO" "$SGPY" bench/gpu_sglang.py --stages capture --out "$OUT/results" --work "$WORK" \
      --time-budget-s 500 ;;
  job)  # resumable: a second call continues a run the 10-minute limit cut
    need_sglang
    run $PY bench/gpu_sglang.py --stages job --sglang-python "$SGPY" --out "$OUT/results" \
      --work "$WORK" --time-budget-s 540
    for m in "$WORK"/runs/*/metrics.json; do
      [ -f "$m" ] && cp "$m" "$OUT/results/metrics_$(basename "$(dirname "$m")").json"
    done ;;
  serve)
    need_sglang
    run $PY bench/gpu_sglang.py --stages serve:sglang,serve:vllm --sglang-python "$SGPY" \
      --out "$OUT/results" --work "$WORK" --time-budget-s 540 ;;
  speed)
    need_sglang
    run env PYTHONPATH="$REPO" "$SGPY" bench/gpu_sglang.py --stages capture_speed:llama-3.1-8b --out "$OUT/results" \
      --work "$WORK" --time-budget-s 540 ;;
  moe)
    run $PY bench/gpu_workbook.py --stages env,shape:qwen3-moe/vllm+hf --out "$OUT/results" \
      --work "$WORK" --time-budget-s 520 ;;
  wb8b)
    run $PY bench/gpu_workbook.py --stages workbook:llama-3.1-8b --out "$OUT/results" \
      --work "$WORK" --time-budget-s 540 ;;
  install-vllm)  # vLLM's bundle only (no SGLang, no engine checks): what online needs
    need_vllm; ls "$VSITE" | head -3 | tee "$OUT/run_install-vllm.log" ;;
  online)  # issue 44 item 4: resumable (a second call continues the rounds the limit cut)
    need_vllm
    # ONLINE_ARGS: e.g. --tiny for a CPU dry run of this part (PY=the vLLM CPU venv's python)
    run $PY bench/online_engine_gpu.py --out "$OUT/results" --work "$WORK" --time-budget-s 510 \
      ${ONLINE_ARGS:-} ;;
  online-default)  # bench/online.py on the default target, vLLM in this process, bf16; one JSON
    # at the end (not resumable): 01 and 02a by vLLM, then 3 rounds of 03 offline/online + 04 sim
    need_vllm
    run timeout 570 $PY bench/online.py params/gpu.yaml --device cuda --engines vllm --steps 300 \
      --rounds 3 --out "$OUT/results/online_default.json" ;;
  rules)  # issue 42: resumable (a second call continues with the classes not yet measured)
    need_sglang
    run $PY bench/gpu_rules.py --out "$OUT/results" --work "$WORK" --sglang-python "$SGPY" \
      --eager-control --time-budget-s 480 ${RULES_ARGS:-} ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
ls -la "$OUT/results"
