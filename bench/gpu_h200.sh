#!/usr/bin/env bash
# Issue 33 items 3 and 4 on one H200 (device tool), after the offline bundle is installed:
#
#   SITE=/path/to/bundle/site bash bench/gpu_h200.sh part1 "$OUT"   # env, default job, boundaries
#   SITE=/path/to/bundle/site bash bench/gpu_h200.sh part2 "$OUT"   # 8B shape: capture, HF
#   SITE=/path/to/bundle/site bash bench/gpu_h200.sh part3 "$OUT"   # 8B shape: serving
#   SITE=/path/to/bundle/site bash bench/gpu_h200.sh part4 "$OUT"   # Qwen3-MoE shape: capture, HF
#   SITE=/path/to/bundle/site bash bench/gpu_h200.sh part5 "$OUT"   # the workbook on the 8B shape
#
# Each part fits one 10-minute device call (measured on an H200: part2 190 s, part3 410 s,
# part4 172 s plus the fused-MoE compile; bench/h200_2026-12-04/README.md).
#
# SITE: the folder the bundle's packages were installed into (vllm 0.26.0, papermill, ...); it goes
# on PYTHONPATH, for this process and for the notebooks' kernels and engine workers it starts.
# Each part stops starting stages at ~8.5 minutes (--time-budget-s) and writes, under OUT:
# one JSON per stage (results/*.json, rewritten as each stage goes) and the log (run.log);
# at most 8 files, none deeper than OUT/a/b/file. Work files go to $WORK (default /tmp/e3gpu),
# which survives between calls while the machine is held (engines' compile caches too).
set -uo pipefail
part="${1:?usage: bash bench/gpu_h200.sh part1..part5|STAGES OUT}"
OUT="${2:?usage: bash bench/gpu_h200.sh part1..part5|STAGES OUT}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT/results"
WORK="${WORK:-/tmp/e3gpu}"
mkdir -p "$WORK"
REPO=$(pwd)  # the notebooks' kernels start in notebooks/: eagle3nb must be importable there too
export PYTHONPATH="$REPO${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export EAGLE3NB_TWIN_PROOFS="${EAGLE3NB_TWIN_PROOFS:-$WORK/twin_proofs}"
PY="${PYTHON:-python3}"
budget="${BUDGET_S:-510}"
case "$part" in
  part1) stages="env,default,boundaries" ;;
  part2) stages="env,shape:llama-3.1-8b/vllm+hf" ;;
  part3) stages="shape:llama-3.1-8b/serve" ;;
  part4) stages="shape:qwen3-moe/vllm+hf" ;;
  part5) stages="workbook:llama-3.1-8b" ;;
  *) stages="$part" ;;  # any --stages list, e.g. shape:qwen3-moe/serve
esac
{
  echo "== $(date -u +%FT%TZ) $part: stages $stages, budget ${budget}s, PYTHONPATH=${PYTHONPATH:-}"
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv || true
  "$PY" -c "import torch, transformers, vllm; print('torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)" 2>&1 | tail -1
  "$PY" bench/gpu_workbook.py --stages "$stages" --out "$OUT/results" --work "$WORK" \
    --time-budget-s "$budget"
  echo "== rc $? at $(date -u +%FT%TZ)"
} 2>&1 | tee "$OUT/run.log" | grep -v "^INFO\|^(EngineCore" | tail -150
# the executed notebooks' tracebacks stay in the JSONs' "tail"; keep the run's metrics too
for m in "$WORK"/runs/*/metrics.json; do
  [ -f "$m" ] && cp "$m" "$OUT/results/metrics_$(basename "$(dirname "$m")").json"
done
ls -la "$OUT" "$OUT/results"
