"""Training throughput, one process vs N data-parallel processes (torchrun), same global batch:

    python bench/train_scaling.py                         # CPU, gloo: 1 vs 2 processes
    python bench/train_scaling.py --device cuda --nprocs 1,2   # GPUs, nccl: 1 vs 2 GPUs

Uses the run of ``--params`` (default: params/default.yaml, run_name ``bench-scaling``): generates
and extracts its data once (01, 02b), then trains ``--steps`` steps per process count with
``train_step`` (03's own function; N > 1 launches torchrun as the notebook does) and writes
``bench/results/train_scaling[_<device>].json``:

- ``tokens_per_s``: loss-bearing tokens x TTT steps per second over all ranks, whole run (incl. the
  final checkpoint); ``steady_tokens_per_s``: the same over the steps after ``--warmup`` (per-step
  wall times recorded by rank 0), the number to compare;
- ``speedup`` of each N over 1 process (steady);
- ``max_abs_weight_diff_vs_1``: the largest |w_N - w_1| over the exported drafter tensors (the same
  global batch and seed must give the same weights up to float summation order);
- ``padding_fraction``: padded share of the per-rank batches, bucketed plan vs plain shuffle.

On CPU every process gets ``--cpu-threads`` intra-op threads (default 1, as torchrun's default
OMP_NUM_THREADS): one core plays one accelerator, so 1 vs N processes is data-parallel scaling at
fixed work per worker, as 1 vs N GPUs. (With more threads than free cores, OpenMP barriers make a
step many times slower: measured 3.2 s/step with 1 thread vs 42 s/step with 2 on the default job
while the machine's load average was ~12 on 2 cores.) The load average is recorded with the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.steps.train.step import train_step
from eagle3nb.rundir import RunDir, read_metrics
from eagle3nb.params import load_params


def _prepare(p) -> None:
    rd = RunDir(p)
    if not (rd.dataset / "manifest.json").exists() or not json.loads(
        (rd.dataset / "manifest.json").read_text()
    ).get("complete"):
        generate_step(p, progress=False)
        extract_sglang_step(p, progress=False)


def _fresh_copy(p, n: int):
    """A run folder sharing the data of ``p`` with no checkpoint, for process count ``n``."""
    q = p.model_copy(update={"run_name": f"{p.run_name}-np{n}", "nproc_per_node": n})
    src, dst = RunDir(p), RunDir(q)
    shutil.rmtree(dst.root, ignore_errors=True)
    dst.root.mkdir(parents=True)
    for d in (src.dataset, src.generated.parent):
        shutil.copytree(d, dst.root / d.relative_to(src.root))
    shutil.copy(src.metrics, dst.metrics)
    return q


def main(
    params_file: str,
    device: str,
    nprocs: list[int],
    steps_n: int,
    warmup: int,
    batch_size: int | None,
    out: str | None,
    cpu_threads: int = 1,
) -> dict:
    if device == "cpu":
        torch.set_num_threads(cpu_threads)  # the 1-process run trains in this process
        os.environ["OMP_NUM_THREADS"] = str(cpu_threads)  # torchrun's workers
    load_before = os.getloadavg()
    over = {
        "device": device,
        "interactive": False,
        "run_name": "bench-scaling",
        "max_steps": steps_n,
        "checkpoint_every": 10**6,
    }
    if batch_size:
        over["batch_size"] = batch_size
    p = load_params(params_file, **over)
    t0 = time.time()
    _prepare(p)
    prep_s = time.time() - t0
    runs, weights = {}, {}
    for n in nprocs:
        q = _fresh_copy(p, n)
        t0 = time.time()
        res = train_step(q, progress=False)
        wall = time.time() - t0
        s = res["stats"]
        st = json.loads((RunDir(q).train / "step_times.json").read_text())
        secs, toks = st["seconds"][warmup:], st["token_steps"][warmup:]
        runs[str(n)] = {
            "processes": n,
            "parallel": s["parallel"],
            "steps": s["steps"],
            "seconds": s["seconds"],
            "wall_seconds_incl_startup": round(wall, 2),
            "tokens_per_s": s["loss_token_steps_per_s"],
            "steady_tokens_per_s": round(sum(toks) / sum(secs), 1) if secs else None,
            "steady_ms_per_step": round(1000 * sum(secs) / len(secs), 2) if secs else None,
            "padding_fraction": s["padding_fraction"],
        }
        weights[n] = load_file(str(RunDir(q).drafter / "model.safetensors"))
        print(
            f"{n} process(es): {runs[str(n)]['steady_tokens_per_s']} loss-token-steps/s steady ({runs[str(n)]['steady_ms_per_step']} ms/step)",
            flush=True,
        )
    base = nprocs[0]
    for n in nprocs:
        r = runs[str(n)]
        r["speedup_vs_%d" % base] = (
            round(r["steady_tokens_per_s"] / runs[str(base)]["steady_tokens_per_s"], 3)
            if r["steady_tokens_per_s"]
            else None
        )
        r["max_abs_weight_diff_vs_%d" % base] = max(
            float((weights[n][k].double() - weights[base][k].double()).abs().max())
            for k in weights[base]
        )
    res = {
        "what": "drafter training throughput (loss-bearing tokens x TTT steps / s, all ranks) at a fixed global batch, 1 vs N data-parallel processes",
        "device": device,
        "gpu": torch.cuda.get_device_name(0)
        if device.startswith("cuda") and torch.cuda.is_available()
        else None,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "params_file": params_file,
        "global_batch": p.batch_size,
        "ttt_steps": p.ttt_steps,
        "steps": steps_n,
        "warmup_steps_excluded": warmup,
        "model": p.model,
        "drafter": {
            "heads": p.draft_num_heads,
            "kv_heads": p.draft_num_kv_heads,
            "intermediate": p.draft_intermediate_size,
            "draft_vocab": p.draft_vocab_size,
        },
        "cpu_threads_per_process": cpu_threads if device == "cpu" else None,
        "load_average_1_5_15min": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "data_prep_seconds": round(prep_s, 2),
        "n_train_samples": read_metrics(RunDir(p).metrics).get("extract", {}).get("n_samples"),
        "runs": runs,
    }
    path = (
        Path(out)
        if out
        else ROOT
        / "bench"
        / "results"
        / (
            "train_scaling.json"
            if device == "cpu"
            else f"train_scaling_{device.replace(':', '')}.json"
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--params", default="params/default.yaml")
    ap.add_argument(
        "--device", default="cpu", help="cpu (gloo) or cuda (nccl, one GPU per process)"
    )
    ap.add_argument(
        "--nprocs", default="1,2", help="comma-separated process counts; the first is the baseline"
    )
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument(
        "--warmup", type=int, default=10, help="first steps left out of the steady rate"
    )
    ap.add_argument(
        "--batch-size", type=int, default=None, help="global batch (default: the params file's)"
    )
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--cpu-threads", type=int, default=1, help="intra-op threads per process on CPU"
    )
    a = ap.parse_args()
    r = main(
        a.params,
        a.device,
        [int(x) for x in a.nprocs.split(",")],
        a.steps,
        a.warmup,
        a.batch_size,
        a.out,
        a.cpu_threads,
    )
    print(json.dumps(r["runs"], indent=1))
