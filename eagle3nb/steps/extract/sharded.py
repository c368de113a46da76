"""Offline extraction plumbing shared by the 02 notebooks: the samples, the disk plan, the engine
speed, and sharded extraction over N worker processes.

Sharded extraction: the samples are cut into shards exactly as one process would
(:func:`eagle3nb.dataset.write.shard_plan`); worker ``w`` of ``W`` writes the shards ``i % W == w``
with its own engine (HF transformers, loaded in the worker; on GPU machines worker ``w`` uses
``cuda:w % device_count``), recording each finished shard in ``dataset/workers/worker-w.json``.
When all workers ended, :func:`eagle3nb.dataset.write.merge_workers` checks every shard's sha256
and writes one manifest. A lost worker's remaining shards are named by the merge; a rerun (any
worker count) redoes only those.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from eagle3nb import timing
from eagle3nb import threads
from eagle3nb.dataset.layout import (
    check_writer_memory,
    estimate_dataset_bytes,
    shard_file_bytes,
    shard_layout,
)
from eagle3nb.dataset.write import (
    WORKERS_DIR,
    merge_workers,
    prepare_dataset,
    shard_plan,
    write_dataset,
)
from eagle3nb.manifest import atomic_write_json, read_json
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir
from eagle3nb.target import models
from eagle3nb.text import chat
from eagle3nb.text.generation import read_jsonl

__all__ = [
    "capture_overhead",
    "check_disk",
    "checked_train_samples",
    "disk_plan",
    "engine_speed",
    "finish_workers",
    "launch_workers",
    "metadata_bytes_max",
    "train_samples",
    "worker_main",
    "write",
]


def train_samples(rd: RunDir) -> list[tuple[int, list[int], list[int]]]:
    """``(sample_id, input_ids, loss_mask)`` of every train record of 01 with generated tokens: the
    served prompt ids plus exactly the generated ids (see
    :func:`eagle3nb.text.chat.generated_sample`), or a chat dataset's row as 01 stored it
    (``input_ids`` and ``loss_mask`` from served ids, several turns)."""
    recs = [r for r in read_jsonl(rd.generated) if r["split"] == "train"]
    return [
        (r["id"], r["input_ids"], r["loss_mask"])
        if "loss_mask" in r
        else (r["id"], *chat.generated_sample(r["prompt_ids"], r["output_ids"]))
        for r in recs
        if r["output_ids"]
    ]


def checked_train_samples(
    rd: RunDir, purpose: str = "extract"
) -> list[tuple[int, list[int], list[int]]]:
    """:func:`train_samples`, refusing an empty list (``purpose`` names what they were for).

    Raises:
        ValueError: no train record of 01 has generated tokens.
    """
    samples = train_samples(rd)
    if not samples:
        raise ValueError(
            "no train sample with generated tokens: 01_generate produced nothing to "
            f"{purpose}; check prompts_file and max_new_tokens"
        )
    return samples


def metadata_bytes_max(n_shards: int, n_samples: int) -> int:
    """Upper bound on manifest.json in bytes (provenance ~ a few KB, one ~0.5 KB entry per shard,
    skipped ids)."""
    return 64 * 1024 + 640 * n_shards + 24 * n_samples


def disk_plan(
    p: RunParams,
    samples: Sequence | None = None,
    n_aux: int | None = None,
    hidden: int | None = None,
    *,
    out_dir: str | os.PathLike | None = None,
    aux_storage: str | None = None,
) -> dict:
    """Disk need of the offline dataset vs the free space, before any capture (config.json only).

    Args:
        samples, n_aux, hidden: default to 01's train samples and the run's boundaries and H.
        out_dir: the dataset folder (default the run's ``dataset/``; 02a: ``dataset_vllm/``).
        aux_storage: how the aux slots are stored (default ``p.aux_storage``).

    Returns:
        ``{"shard_bytes"`` (exact size of the shard files), ``"metadata_bytes_max"``,
        ``"total_bytes"``, ``"remaining_bytes"`` (shards not yet on disk + metadata),
        ``"free_bytes"``, ``"fits"``, ``"per_token_bytes"``, ``"formula"``, ``"n_tokens"``,
        ``"n_samples"``, ``"n_shards"``, ``"aux_storage"``, ``"dtype"``, ``"path"``}``.
    """
    from eagle3nb.boundaries.conventions import aux_ids_and_boundaries

    rd = RunDir(p)
    out = Path(out_dir) if out_dir is not None else rd.dataset
    storage = aux_storage or p.aux_storage
    if samples is None:
        samples = train_samples(rd)
    if n_aux is None or hidden is None:
        cfg = models.text_config(models.read_model_config(models.resolve_model(p.model)))
        _, bnds = aux_ids_and_boundaries(p.convention, p.layer_ids, cfg["num_hidden_layers"])
        n_aux = len(bnds)
        hidden = cfg["hidden_size"]
    dtype = models.DTYPES[p.dtype]
    plan = shard_plan(list(samples), p.shard_size)
    lens = [[len(s[1]) for s in chunk if any(s[2])] for _, chunk in plan]  # empty masks: skipped
    est = estimate_dataset_bytes(lens, n_aux, hidden, dtype, storage)
    meta = metadata_bytes_max(len(plan), len(samples))
    todo = sum(
        shard_file_bytes(shard_layout(ls, n_aux, hidden, dtype, storage))
        for (name, _), ls in zip(plan, lens)
        if not (out / name).exists()
    )
    where = out if out.exists() else next(x for x in [out, *out.parents] if x.exists())
    free = shutil.disk_usage(where).free
    return dict(
        est,
        metadata_bytes_max=meta,
        total_bytes=est["shard_bytes"] + meta,
        remaining_bytes=todo + meta,
        free_bytes=free,
        fits=todo + meta <= free,
        aux_storage=storage,
        dtype=p.dtype,
        path=str(out),
        shard_size=p.shard_size,
    )


def check_disk(plan: dict, int8_hint: bool = True, workers: int = 1) -> None:
    """Refuse to start an extraction that cannot fit on disk, or whose shards cannot fit in memory
    (``int8_hint``: whether ``aux_storage: int8`` would apply; ``workers``: writer processes).

    Raises:
        OSError: the remaining shards and metadata need more than the free space; the message
            gives both numbers and the fixes. ValueError: ``shard_size`` too large for the host's
            memory (:func:`eagle3nb.dataset.layout.check_writer_memory`).
    """
    check_writer_memory(plan["largest_shard_bytes"], plan["shard_size"], workers=workers)
    if not plan["fits"]:
        hint = "" if plan["aux_storage"] == "int8" or not int8_hint else ", or aux_storage: int8"
        raise OSError(
            f"the dataset needs {plan['remaining_bytes'] / 1e9:.3f} GB more ({plan['formula']}) "
            f"but {plan['path']} has {plan['free_bytes'] / 1e9:.3f} GB free; free space, lower "
            f"max_train_prompts/max_new_tokens, use dtype: bfloat16{hint}, or training_mode: "
            "online (no states on disk)"
        )


def engine_speed(
    p: RunParams,
    client,
    timed,
    samples: Sequence,
    engine_ids,
    model,
    tok,
    batch_size: int = 32,
    generate_kw: dict | None = None,
    interleave: bool = False,
) -> dict:
    """An engine server's tokens/s in this run (see
    :func:`eagle3nb.engines.speed.measure_speed`, which gets ``generate_kw`` and
    ``interleave``): generation of 01's train prompts, prefill without capture and extraction of
    the dataset's samples in calls of ``batch_size``, both on warm engines; the dataset pass
    ``timed`` (a ``TimedCapture``; no calls when the dataset was complete already) is reported
    apart. Without ``interleave`` (separate engines per kind) each pass runs
    :data:`~eagle3nb.engines.speed.PASS_REPEATS` times over a third of the samples and the
    fastest is kept: the same calls in all, less sensitive to a neighbour's load."""
    from eagle3nb.engines.speed import measure_speed, speed_settings

    recs = [r for r in read_jsonl(RunDir(p).generated) if r["split"] == "train"]
    return measure_speed(
        client,
        [r["prompt_ids"] for r in recs],
        [s[1] for s in samples],
        p.max_new_tokens,
        models.stop_token_ids(model, tok),
        p.seed,
        lambda xs: timed.client.capture(xs, engine_ids),
        timed.seconds,
        timed.tokens,
        batch_size,
        generate_kw,
        interleave,
        **speed_settings(interleave),
    )


def write(
    p: RunParams,
    rd: RunDir,
    samples: Sequence,
    engine,
    ids: Sequence[int],
    manifest: dict,
    progress=None,
) -> dict:
    """Write the dataset with ``p.extract_workers`` processes (1: in this process, with ``engine``;
    more: each worker loads its own HF engine). Returns the complete manifest.

    Raises:
        RuntimeError: a worker was lost (its missing shards are named; rerun to redo them).
    """
    dtype = models.DTYPES[p.dtype]
    if p.extract_workers <= 1:
        return write_dataset(
            rd.dataset,
            samples,
            lambda xs: engine.capture(xs, ids),
            manifest,
            p.shard_size,
            dtype,
            progress,
            p.aux_storage,
        )
    # the folder and its incomplete manifest first: refuses other settings before any worker starts
    prepare_dataset(rd.dataset, samples, manifest, p.shard_size, p.aux_storage)
    plan_file = rd.dataset / WORKERS_DIR / "plan.json"
    atomic_write_json(plan_file, {"params": p.model_dump(), "manifest": manifest, "ids": list(ids)})
    return finish_workers(launch_workers(plan_file, p.extract_workers), plan_file)


def launch_workers(plan_file: str | os.PathLike, workers: int) -> list[subprocess.Popen]:
    """Start ``workers`` processes ``python -m eagle3nb.steps.extract.sharded PLAN w W`` (their
    output goes to ``workers/worker-w.log``)."""
    plan_file = Path(plan_file)
    procs = []
    for w in range(workers):
        mod = "eagle3nb.steps.extract.sharded"
        cmd = [sys.executable, "-m", mod, str(plan_file), str(w), str(workers)]
        # the child keeps its own copy of the log's descriptor; ours closes after the start
        with open(plan_file.parent / f"worker-{w:05d}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
    return procs


def finish_workers(procs: list[subprocess.Popen], plan_file: str | os.PathLike) -> dict:
    """Wait for the workers, then merge their shards into one manifest.

    Raises:
        RuntimeError: a worker exited non-zero or was killed (its log tail is quoted), or shards
            are missing; the manifest then lists the finished shards and a rerun redoes the rest.
    """
    plan_file = Path(plan_file)
    codes = [pr.wait() for pr in procs]
    plan = read_json(plan_file)
    p = RunParams(**plan["params"])
    samples = train_samples(RunDir(p))
    try:
        return merge_workers(
            plan_file.parent.parent,
            samples,
            plan["manifest"],
            p.shard_size,
            p.aux_storage,
            len(procs),
        )
    except RuntimeError as e:
        bad = [(w, c) for w, c in enumerate(codes) if c != 0]
        tails = []
        for w, c in bad:
            log = plan_file.parent / f"worker-{w:05d}.log"
            tail = log.read_text()[-600:] if log.exists() else ""
            tails.append(
                f"worker {w} exit code {c}{' (killed)' if c < 0 else ''}: ...{tail.strip()[-400:]}"
            )
        raise RuntimeError(f"{e}. " + " | ".join(tails)) from None


def capture_overhead(
    model, engine, samples: Sequence, ids: Sequence[int], max_samples: int = 128, repeats: int = 3
) -> dict:
    """Extraction speed with and without capture, measured in this process on the same samples:
    the target's plain decoder forward (no hooks) vs the engine's capture (hooks, clones, copies
    to CPU), same batches; the median of ``repeats`` alternating timings after a warm-up.

    Returns: ``{"capture_overhead" (per repeat, :mod:`eagle3nb.timing`), "engine",
    "plain_forward_tokens_per_s", "capture_tokens_per_s", "capture_overhead_ratio" (capture time
    / plain time, medians), "measured_on_tokens", "batch_size"}``."""
    import statistics

    import torch
    from eagle3nb.padding import pad_right
    from eagle3nb.target.capture import _decoder

    xs = [list(s[1]) for s in samples[:max_samples]]
    bs = engine.batch_size
    dev = next(model.parameters()).device
    batches = []
    for i in range(0, len(xs), bs):
        chunk = xs[i : i + bs]
        t, m = pad_right(chunk)
        batches.append((t.to(dev), m.to(dev)))

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    @torch.no_grad()
    def plain():
        for t, m in batches:
            _decoder(model)(input_ids=t, attention_mask=m, use_cache=False)

    def captured():
        for i in range(0, len(xs), bs):
            engine.capture(xs[i : i + bs], ids)

    def timed(fn):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    plain(), captured()  # warm-up (allocator, kernels)
    tp, tc = [], []
    for _ in range(repeats):
        tp.append(timed(plain))
        tc.append(timed(captured))
    n_tok = sum(map(len, xs))
    p_s, c_s = statistics.median(tp), statistics.median(tc)
    m = timing.summarize([c / q for c, q in zip(tc, tp)], "capture / plain time", neutral=1.0)
    return {
        "capture_overhead": m.as_dict(),  # per repeat: median, spread, verdict
        "engine": engine.engine_name,
        "plain_forward_tokens_per_s": round(n_tok / p_s, 1),
        "capture_tokens_per_s": round(n_tok / c_s, 1),
        "capture_overhead_ratio": round(c_s / p_s, 3),
        "measured_on_tokens": n_tok,
        "batch_size": bs,
        "repeats": repeats,
    }


def worker_main(argv: Sequence[str]) -> int:
    """Entry of one extraction worker: ``python -m eagle3nb.steps.extract.sharded PLAN w W``."""
    import torch

    from eagle3nb.target.capture import HFCaptureEngine

    plan_file, w, W = Path(argv[0]), int(argv[1]), int(argv[2])
    plan = read_json(plan_file, "extraction plan")
    p = RunParams(**plan["params"])
    dev = p.device if p.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if dev.startswith("cuda") and torch.cuda.device_count() > 1:
        dev = f"cuda:{w % torch.cuda.device_count()}"
    if dev == "cpu" and p.threads >= 0:  # W workers share the run's thread budget
        threads.apply(threads.plan(p.threads, processes=W))
    elif dev == "cpu":  # threads: -1, share the cores instead of oversubscribing them W times
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // W))
    model, _, _ = models.load_target(p.model, p.dtype, dev)
    engine = HFCaptureEngine(model, p.convention, p.capture_batch_size)
    rd = RunDir(p)
    t0 = time.time()
    rec = write_dataset(
        rd.dataset,
        train_samples(rd),
        lambda xs: engine.capture(xs, plan["ids"]),
        plan["manifest"],
        p.shard_size,
        models.DTYPES[p.dtype],
        None,
        p.aux_storage,
        worker=(w, W),
    )
    print(f"worker {w}/{W}: {len(rec['shards'])} shards in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
