"""Online training at 8B target shapes, and the offline loader's margin, on one GPU (issue 12, items
4 and 5), through :func:`eagle3nb.training.loop.train_drafter`, the function 03 calls.

Target: a Llama-3.1-8B-shaped model with random bf16 weights made on the GPU (``bench/mfu.py``
``build_target``; nothing is downloaded), 32 layers, aux ids ``[1, 15, 28]`` in SGLang's convention
(boundaries 2, 16, 29; SGLang's default for Llama). Samples: ``--samples`` sequences of ``--seq`` token
ids drawn uniformly from the first 32000 ids (the draft vocabulary), loss on every position after
the first 8. The drafter is 03's CUDA default (bf16-mixed: float32 master weights, compiled layer,
flex attention, fused AdamW) at Llama-3.1-8B drafter shapes, TTT 7, draft vocab 32000, batch 4.

Parts (one process; the JSON is rewritten after each, so a part cut short by the time limit keeps
the ones before it):
  online   :class:`eagle3nb.training.online.OnlineSource` (the target in the loop, its capture by HF
           hooks at the boundaries) -> train_drafter. Timed: median step after ``--warmup``.
           ``capture_s_per_step``: the target's share, timed in OnlineSource.batch after a sync.
           MFU over target + drafter FLOPs: target forward per token
           ``L*(2*(Ht*(nh+2nkv)*hd + nh*hd*Ht + 3*Ht*I) + 4*nh*hd*(T+1)/2)`` (capture runs the
           decoder only; the lm_head is not run), plus the drafter's training FLOPs and the labels'
           ``2*Ht*V`` (``bench/mfu.py`` ``flops_per_token``), over the bf16 matmul peak measured in
           the same job.
  offline  The same samples captured once by the same target and stored with
           :func:`eagle3nb.dataset.write.write_dataset` (bf16, one shard per 8 samples), the page
           cache of the shards dropped, then train_drafter over
           :class:`eagle3nb.dataset.read.AuxDataset` (memory-mapped) with ``loader_workers`` 0 and
           4. ``wait_share``: the part of the step time spent in the loader's ``next()``
           (``report["step_wait_seconds"]``, measured inside the training loop), steps after
           ``--warmup``. Issue 12's margin: <= 0.5.

Usage (GPU): ``python bench/online_gpu.py --out-dir DIR`` (about 6 minutes, mostly compiles);
``--tiny`` runs the plumbing on CPU with small shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

IDS, CONVENTION, SKIP = [1, 15, 28], "sglang", 8  # --tiny: ids [0, 1, 2] of 4 layers


def build_tiny_target():
    """CPU plumbing run: a 4-layer Llama, hidden 64, random float32 weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, vocab_size=512, num_hidden_layers=4,
        tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


def samples(n: int, T: int, vocab: int, seed: int = 3) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, vocab, (T,), generator=g).tolist()
        out.append((i, ids, [0] * SKIP + [1] * (T - SKIP)))
    return out


def manifest(model) -> dict:
    return {"target": {"name": "random-llama-3.1-8b-shape", "sha256": None},
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "template": None, "generation_sha256": "bench-online-gpu", "n_layers": 32}  # fmt: skip


def train_cfg(a, tiny: bool, workers: int = 0):
    from eagle3nb.training.loop import TrainConfig

    return TrainConfig(
        draft_vocab_size=128 if tiny else 32000, draft_num_heads=0, draft_num_kv_heads=0,
        batch_size=a.batch, max_steps=a.steps, lr=1e-4, warmup_steps=5, ttt_steps=7,
        attention="flex", precision="float32" if tiny else "bf16-mixed",
        torch_compile="off" if tiny else "on", log_every=1, checkpoint_every=10**6,
        eval_every=0, seed=0, loader_workers=workers, bucket_by_length=False,
    )  # fmt: skip


def timed(rep: dict, warmup: int) -> dict:
    secs, waits = rep["step_seconds"], rep["step_wait_seconds"]
    s, w = secs[warmup:] or secs, waits[warmup:] or waits
    return {
        "step_s_median": statistics.median(s),
        "wait_s_median": statistics.median(w),
        "wait_share": sum(w) / sum(s),
        "step_s_all": [round(x, 4) for x in secs],
        "wait_s_all": [round(x, 4) for x in waits],
        "first_step_s": secs[0],
        "loss_first_last": [rep["history"][0]["loss"], rep["history"][-1]["loss"]],
        "empty_batches": rep["empty_batches"],
        "fast_path": rep["fast_path"],
    }


def flops(model, a, tiny: bool) -> dict:
    from mfu import flops_per_token

    from eagle3nb.drafter.model import DrafterConfig

    tc = model.config
    c = DrafterConfig.for_target(tc, 128 if tiny else 32000, len(IDS))  # what train_drafter builds
    return flops_per_token(c, a.seq, 7, n_layers=tc.num_hidden_layers)


def part_online(a, model, data, fl, peak, tiny) -> dict:
    from eagle3nb.training.loop import train_drafter
    from eagle3nb.training.online import OnlineSource

    src = OnlineSource(data, model, IDS, CONVENTION, manifest(model))
    out = Path(tempfile.mkdtemp(prefix="online_gpu_"))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    _, rep = train_drafter(src, model, train_cfg(a, tiny), out, tracking=(), stream=None)
    res = {"wall_s": time.time() - t0, **timed(rep, a.warmup)}
    shutil.rmtree(out, ignore_errors=True)
    tok_s = a.batch * a.seq / res["step_s_median"]
    total = fl["target_fwd"] + fl["drafter_train"] + fl["labels"]
    res.update(
        tokens_per_s=tok_s,
        capture_s_per_step=src.capture_seconds / len(rep["step_seconds"]),
        capture_s_is="the target's forward and capture per step (after a sync, so the training "
        "step still queued is not counted), averaged over all steps",
        nonfinite_rows=src.nonfinite_rows,
        gflop_per_token={k: fl[k] / 1e9 for k in ("target_fwd", "drafter_train", "labels")},
        flop_share={k: fl[k] / total for k in ("target_fwd", "drafter_train", "labels")},
    )
    if peak:
        res["mfu_target_plus_drafter"] = total * tok_s / (peak * 1e12)
    if torch.cuda.is_available():
        res["max_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return res


def part_offline(a, model, data, tiny, workdir: Path) -> dict:
    from eagle3nb.dataset.read import AuxDataset
    from eagle3nb.dataset.write import write_dataset
    from eagle3nb.target.capture import HFCaptureEngine
    from eagle3nb.training.loop import train_drafter

    eng = HFCaptureEngine(model, CONVENTION, batch_size=a.batch)
    man = dict(manifest(model), engine={"name": eng.engine_name, "version": eng.engine_version},
        convention=CONVENTION, layer_ids=IDS, aux_boundaries=eng.boundaries(IDS),
        final_boundary=model.config.num_hidden_layers)  # fmt: skip
    ds_dir = workdir / "dataset"
    t0 = time.time()
    dt = torch.float32 if tiny else torch.bfloat16
    write_dataset(ds_dir, data, lambda s: eng.capture(s, IDS), man, shard_size=8, dtype=dt)
    res = {"write_s": time.time() - t0,
        "dataset_gib": sum(f.stat().st_size for f in ds_dir.glob("*.safetensors")) / 2**30}  # fmt: skip
    for workers in (0, 4):
        for f in ds_dir.glob("*.safetensors"):  # cold page cache: the reads hit the disk
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        out = workdir / f"train_w{workers}"
        ds = AuxDataset(ds_dir, mmap=True)
        t0 = time.time()
        _, rep = train_drafter(
            ds, model, train_cfg(a, tiny, workers), out, tracking=(), stream=None
        )
        r = {"wall_s": time.time() - t0, **timed(rep, a.warmup)}
        r["tokens_per_s"] = a.batch * a.seq / r["step_s_median"]
        r["margin_met"] = r["wait_share"] <= 0.5
        res[f"loader_workers_{workers}"] = r
        shutil.rmtree(out, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results" / "online_gpu"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--parts", default="online,offline")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        global IDS
        a.seq, a.samples, a.steps, a.warmup, IDS = 64, 8, 6, 2, [0, 1, 2]
    od = Path(a.out_dir)
    od.mkdir(parents=True, exist_ok=True)
    res = {"started": time.time(), "args": vars(a)}
    res["git_commit"] = os.environ.get("EAGLE3NB_COMMIT") or subprocess.run(["git", "rev-parse",
        "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # fmt: skip
    cuda = torch.cuda.is_available() and not a.tiny
    peak = 0.0
    if cuda:
        from mfu import build_target, gpu_info, matmul_peak

        res["info"], res["peak"] = gpu_info(), matmul_peak()
        peak = res["peak"]["tflops_median"]
        torch.cuda.empty_cache()
        t0 = time.time()
        model = build_target()
        res["target_build_s"] = time.time() - t0
    else:
        model = build_tiny_target()
    data = samples(a.samples, a.seq, 128 if a.tiny else 32000)
    fl = flops(model, a, a.tiny)

    def save():
        res["wall_s"] = time.time() - res["started"]
        (od / "online_gpu.json").write_text(json.dumps(res, indent=1, default=str))

    work = Path(tempfile.mkdtemp(prefix="online_gpu_data_"))
    try:
        for part in a.parts.split(","):
            try:
                if part == "online":
                    res["online"] = part_online(a, model, data, fl, peak, a.tiny)
                elif part == "offline":
                    res["offline"] = part_offline(a, model, data, a.tiny, work)
            except Exception as e:  # keep the other part's numbers; say what failed
                import traceback

                res[part] = {"error": repr(e), "traceback": traceback.format_exc()[-3000:]}
            save()
            print(json.dumps({part: {k: v for k, v in res[part].items() if not k.endswith("_all")}},
                indent=1, default=str)[:4000], flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["targets"] = {"online_mfu": 0.60, "loader_wait_share_max": 0.5}
    save()


if __name__ == "__main__":
    main()
