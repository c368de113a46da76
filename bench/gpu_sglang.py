"""SGLang 0.5.17 on the GPU host (issue 45), each number next to its baseline measured in the same
run; one JSON per stage in ``--out`` (device, versions, commit, code digest: gpu_workbook's head).

    SG/python bench/gpu_sglang.py --stages capture,capture_speed:llama-3.1-8b --out DIR
    python3 bench/gpu_sglang.py --stages job,serve:sglang,serve:vllm --sglang-python SG/python --out DIR

Stages (each in try/except; an error is written into its JSON and the next stage runs):

- ``capture`` (run with the SGLang bundle's python): the default target captured by SGLang's
  in-process ModelRunner (:mod:`eagle3nb.engines.sglang_runner`) at SGLang ids [0, 1, 3], in
  float32 with torch ops on the original and in bfloat16 on the MLP-padded copy
  (stories260K-hd32-mlp176, the same function), every slot against HF's float32 states at every
  boundary on the same GPU (relative error; the id must name boundary id + 1), and SGLang's
  log-probabilities against HF's.
- ``capture_speed:<shape>`` (SGLang's python): a random-weight target of that shape (bench/real_shape.py;
  ``load_format=dummy``, bf16), 02b's capture (rows to host memory) against the same runner's
  plain prefill, alternating rounds, tokens/s with their spread.
- ``job`` (the host's python): ``python -m eagle3nb.run params/gpu_sglang.yaml``: 01 by vLLM, 02b
  captured by SGLang, 03 on CUDA, 04 served by SGLang and vLLM on the same prompts next to the
  simulator; its metrics.json's served tables.
- ``serve:<engine>`` (the host's python; ``sglang`` or ``vllm``): the job's drafter served on the
  default target, tokens/s with and without it at each batch size, alternating rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

import gpu_workbook as gw  # noqa: E402  (versions, device_info, the job runner)

IDS = [0, 1, 3]  # SGLang ids -> boundaries 1, 2, 4 of the 5-layer default target
GPU_KW = {"attention_backend": "triton", "sampling_backend": "pytorch", "mem_fraction_static": 0.3}


def _rounds(fns: dict, rounds: int) -> dict:
    """Each callable ``rounds`` times, alternating; seconds per call: median, min, max."""
    t = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            t[k].append(time.perf_counter() - t0)
    return {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "n": len(v)}
            for k, v in t.items()}  # fmt: skip


def _samples(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g)
    return [[1] + torch.randint(3, vocab, (int(m) - 1,), generator=g).tolist() for m in lens]


def stage_capture(a) -> dict:
    from eagle3nb.engines.sglang_runner import RunnerCapture
    from eagle3nb.target import models

    from transformers import AutoModelForCausalLM

    out = {}
    samples = _samples(24, 8, 200, 512)
    for label, name, dtype, native in (("float32_torch_ops", "stories260K-hd32", "float32", True),
                                       ("bfloat16_padded", "stories260K-hd32-mlp176", "bfloat16",
                                        False)):  # fmt: skip
        path = str(models.resolve_model(name))
        cuda = a.device == "cuda"  # cpu: the plumbing, with SGLang 0.5.23's CPU venv
        t0 = time.perf_counter()
        rc = RunnerCapture(path, dtype, a.device, max_total_tokens=8192, native=native and cuda,
                           server_kwargs=GPU_KW if cuda else {})  # fmt: skip
        start_s = time.perf_counter() - t0
        res = rc.capture(samples, IDS, logprobs=True)
        rc.close()
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(a.device).eval()
        H = hf.config.hidden_size
        err = [[0.0] * (hf.config.num_hidden_layers + 1) for _ in IDS]  # [slot][boundary] max
        lp_err = 0.0
        for s, r in zip(samples, res):
            with torch.no_grad():
                o = hf(torch.tensor([s], device=a.device), output_hidden_states=True)
            for j in range(len(IDS)):
                got = r["aux"][:, j * H : (j + 1) * H].to(a.device)
                for b, hs in enumerate(o.hidden_states):
                    e = ((got - hs[0]).norm() / hs[0].norm()).item()
                    err[j][b] = max(err[j][b], e)
            lp = torch.log_softmax(o.logits[0].float(), -1)[:-1]
            want = lp.gather(1, torch.tensor(s[1:], device=a.device)[:, None])[:, 0].cpu()
            lp_err = max(lp_err, (r["input_logprobs"][1:] - want).abs().max().item())
        named = [min(range(len(e)), key=e.__getitem__) for e in err]
        out[label] = {"model": path, "dtype": dtype, "native_ops": native and cuda, "runner_start_s":
                      round(start_s, 1), "samples": len(samples), "ids": IDS,
                      "boundary_named_per_slot": named, "expected": [i + 1 for i in IDS],
                      "rel_error_per_slot_per_boundary": err,
                      "max_abs_logprob_diff_vs_hf": lp_err}  # fmt: skip
        del hf
        if cuda:
            torch.cuda.empty_cache()
    out["all_slots_name_id_plus_1"] = all(
        v["boundary_named_per_slot"] == v["expected"] for v in out.values() if isinstance(v, dict)
    )
    return out


def stage_capture_speed(a, name: str) -> dict:
    from eagle3nb.engines.sglang_runner import RunnerCapture
    from real_shape import SHAPES, write_target

    cfg = SHAPES[name]()
    folder = write_target(cfg, Path(a.work) / "models" / name, weights="none")
    n = cfg["num_hidden_layers"]
    ids = [1, n // 2 - 1, n - 4]  # SGLang ids of boundaries 2, N/2, N-3 (its default)
    kw = {**GPU_KW, "load_format": "dummy", "mem_fraction_static": 0.8}
    t0 = time.perf_counter()
    rc = RunnerCapture(str(folder), "bfloat16", "cuda", max_total_tokens=40000, server_kwargs=kw)
    start_s = time.perf_counter() - t0
    samples = _samples(a.samples, a.sample_len, a.sample_len, cfg["vocab_size"])
    calls = [samples[i : i + 32] for i in range(0, len(samples), 32)]
    rc.prefill(calls[0]), rc.capture(calls[0], ids)  # warm-up (kernels compile on first use)
    t = _rounds({"capture": lambda: [rc.capture(c, ids) for c in calls],
                 "plain_prefill": lambda: [rc.prefill(c) for c in calls]}, a.rounds)  # fmt: skip
    rc.close()
    tok = sum(len(s) for s in samples)
    for v in t.values():
        v["tokens_per_s"] = round(tok / v["median_s"])
    return {"shape": name, "ids": ids, "tokens": tok, "calls_of": 32, "runner_start_s":
            round(start_s, 1), "timings": t, "capture_over_prefill":
            round(t["capture"]["median_s"] / t["plain_prefill"]["median_s"], 3),
            "goal": "<= 1.3x (stretch 1.15x)"}  # fmt: skip


def stage_job(a) -> dict:
    od = Path(a.work) / "runs"
    sets = {"outputs_dir": str(od), "run_name": "gpu_sglang", "sglang_python": a.sglang_python}
    rc, run, lines = gw._run_job(a, "params/gpu_sglang.yaml", sets, a.left() - 15)
    res = {"rc": rc, "run": str(run), "sets": sets, "tail": lines[-60:] if rc else lines[-8:]}
    mf = run / "metrics.json"
    if mf.is_file():
        m = json.loads(mf.read_text())
        ev = m.get("eval", {})
        res["metrics"] = {**gw._pick(m), "tau": ev.get("tau"),
                          "served_by_sglang": ev.get("served_by", {}).get("sglang"),
                          "alignment": m.get("alignment"), "twin_check": m.get("twin_check"),
                          "extract": m.get("extract")}  # fmt: skip
    return res


def _drafter(a) -> Path:
    """The job's exported drafter: the run's ``drafter/`` folder (eagle3nb.rundir.RunDir.drafter)."""
    run = Path(a.work) / "runs" / "gpu_sglang" / "drafter"
    if not (run / "config.json").is_file():
        raise FileNotFoundError(f"no exported drafter in {run}: run the job stage first")
    return run


def stage_serve(a, engine: str) -> dict:
    from eagle3nb.target import models

    path = models.resolve_model("stories260K-hd32")
    drafter = _drafter(a)
    if engine == "sglang":
        from eagle3nb.engines.sglang_helpers import start_sglang

        opts = {"native_ops": True, "engine_kwargs": dict(GPU_KW)}
        client = start_sglang(path, "float32", "cuda", 0, a.sglang_python, Path(a.work), 512, opts)
    else:
        from eagle3nb.engines.vllm_helpers import start_vllm
        from eagle3nb.params.load import load_params

        p = load_params(ROOT / "params" / "gpu.yaml")
        client = start_vllm(p, path, "float32", Path(a.work))
    prompts = _samples(max(a.batch_sizes), 16, 48, 512, seed=1)
    out = {"engine": engine, "drafter": str(drafter), "info": client.info(), "k": 5,
           "max_new_tokens": a.serve_tokens, "by_batch": {}}  # fmt: skip
    try:
        client.serve_acceptance(str(drafter), prompts[:1], 5, 4, [])  # warm-up of both modes
        client.generate(prompts[:1], 4, [])
        for bs in a.batch_sizes:
            ps = prompts[:bs]
            got = {}

            def spec(ps=ps, got=got):
                got["spec"] = client.serve_acceptance(str(drafter), ps, 5, a.serve_tokens, [])

            def plain(ps=ps, got=got):
                got["plain"] = client.generate(ps, a.serve_tokens, [])

            t = _rounds({"with_drafter": spec, "without": plain}, a.rounds)
            toks = sum(len(o) for o in got["plain"])
            for v in t.values():
                v["tokens_per_s"] = round(toks / v["median_s"], 1)
            sp = got["spec"]
            out["by_batch"][bs] = {"timings": t, "tokens": toks, "speedup": round(
                t["without"]["median_s"] / t["with_drafter"]["median_s"], 3),
                "tau": sp.get("tau"), "engine_counters": {k: sp.get(k) for k in (
                    "num_drafts", "num_accepted_tokens", "spec_verify_ct",
                    "spec_num_correct_drafts", "engine_accept_length")}}  # fmt: skip
    finally:
        client.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--stages", default="capture")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/e3gpu")
    ap.add_argument("--sglang-python", default="", help="the SGLang bundle's TARGET/python")
    ap.add_argument("--time-budget-s", type=float, default=520)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--sample-len", type=int, default=1024)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--serve-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cuda; cpu runs the capture stage's plumbing")
    a = ap.parse_args(argv)
    a.batch_sizes = [int(x) for x in a.batch_sizes.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(a.work).mkdir(parents=True, exist_ok=True)
    t_end = time.time() + a.time_budget_s
    a.left = lambda: t_end - time.time()
    ver = gw.versions()
    for mod in ("sglang", "sgl_kernel", "flashinfer"):
        try:
            import importlib.metadata as md

            ver[mod] = md.version({"sgl_kernel": "sglang-kernel", "flashinfer":
                                   "flashinfer-python"}.get(mod, mod))  # fmt: skip
        except Exception:  # noqa: BLE001 - not in this python: named as absent
            ver[mod] = None
    head = {"versions": ver, "device": gw.device_info(a.device), "argv": sys.argv[1:],
            "python": sys.executable}  # fmt: skip
    failed = []
    for st in [s for s in a.stages.split(",") if s]:
        kind, _, name = st.partition(":")
        stem = "sglang_" + st.replace(":", "_").replace("/", "_")
        gw.log(f"{st}: start ({a.left():.0f} s left)")
        t0 = time.perf_counter()
        try:
            fns = {"capture": lambda: stage_capture(a), "job": lambda: stage_job(a),
                   "capture_speed": lambda: stage_capture_speed(a, name),
                   "serve": lambda: stage_serve(a, name)}  # fmt: skip
            body = fns[kind]()
        except Exception as e:  # noqa: BLE001 (one stage failing keeps the others)
            body = {
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-4000:],
            }
            failed.append(st)
        body["wall_s"] = round(time.perf_counter() - t0, 1)
        (out / f"{stem}.json").write_text(
            json.dumps({**head, "stage": st, **body}, indent=1, default=str)
        )
        gw.log(f"{st}: {'ERROR ' + body['error'][:300] if 'error' in body else 'done'} "
               f"in {body['wall_s']} s")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("EAGLE3NB_ENGINE_NETNS", "off")  # the GPU host is a closed machine
    sys.exit(main())
