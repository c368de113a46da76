"""01's turn-by-turn regeneration through one engine (HF, vLLM or SGLang) from this process, or spread over
``generate_workers`` processes (data parallel by conversation chunk: worker w takes the chunks
``k % W == w``, each with its own resume file; on a GPU box worker w sees GPU ``w % n_gpus``).

``python -m eagle3nb.steps.generate.workers PLAN w W`` runs one worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Sequence

from eagle3nb.engines.sglang_helpers import start_sglang
from eagle3nb.engines.vllm_helpers import start_vllm
from eagle3nb.manifest import atomic_write_json, read_json
from eagle3nb.params import RunParams, resolve_device
from eagle3nb.rundir import RunDir
from eagle3nb.steps.shared.checks import progress_bar
from eagle3nb.target import models
from eagle3nb.text.generation import generate_batch
from eagle3nb.text.regenerate import regenerate

__all__ = ["clean_partials", "regenerate_share", "run_workers", "start_engine", "worker_main"]


def start_engine(p: RunParams, rd: RunDir, path, ctx: int):
    """The engine client 01 generates through (``generate_engine``: vllm or sglang, each in its
    own venv, started here), or None for HF transformers in this process."""
    if p.generate_engine == "vllm":
        return start_vllm(p, path, p.dtype, rd.root)
    if p.generate_engine == "sglang":
        return start_sglang(
            path,
            p.dtype,
            resolve_device(p),
            p.seed,
            p.sglang_python,
            rd.root,
            ctx,
            p.sglang_options,
        )
    return None


def _partial(rd: RunDir, w: int | None = None, W: int = 1) -> Path:
    name = "generated.partial.jsonl" if w is None else f"generated.partial.w{w}of{W}.jsonl"
    return rd.generated.with_name(name)


def regenerate_share(
    p: RunParams, rd: RunDir, model, tok, path, job: dict, partial, chunks=None, progress=False
) -> tuple[dict, float, list[dict]]:
    """Regenerate ``job["records"]`` (the ``chunks`` given, None for all) through HF, vLLM or SGLang,
    resuming from ``partial`` (see :func:`eagle3nb.text.regenerate.regenerate`).

    ``job``: ``{"records", "key", "template", "kwargs", "eos", "ctx"}``.

    Returns:
        ``(manifest engine block, seconds of generation (engine start excluded), results)``.
    """
    eos = job["eos"]
    with start_engine(p, rd, path, job["ctx"]) or nullcontext() as client:
        if client is not None:
            info = client.info()
            engine = {"name": info["engine_name"], "version": info["engine_version"]}
            client.generate([[tok.bos_token_id or 0]], 1, eos, 0.0, 1.0, p.seed)  # warm
        else:
            engine = {"name": "hf-transformers", "version": __import__("transformers").__version__}

        def gen(batch, seed):
            args = (batch, p.max_new_tokens, eos, p.temperature, p.top_p, p.seed + seed)
            return client.generate(*args) if client is not None else generate_batch(model, *args)

        bar = progress_bar() if progress else None
        t0 = time.time()
        results = regenerate(
            job["records"],
            gen,
            tok,
            job["template"],
            template_kwargs=job["kwargs"],
            max_new_tokens=p.max_new_tokens,
            ctx=job["ctx"],
            batch_size=p.gen_batch_size,
            partial=partial,
            key=job["key"],
            chunks=chunks,
            progress=(lambda it: bar(it, desc=f"regenerate ({engine['name']})")) if bar else None,
        )
        secs = time.time() - t0
    return engine, secs, results


def _share(n_records: int, batch: int, w: int, W: int) -> list[int]:
    return [k for k in range((n_records + batch - 1) // batch) if k % W == w]


def run_workers(p: RunParams, rd: RunDir, tok, job: dict) -> tuple[dict, float, list[dict]]:
    """Regenerate with ``p.generate_workers`` processes and merge their results in record order.

    Returns:
        As :func:`regenerate_share`; seconds = the slowest worker's generation time.

    Raises:
        RuntimeError: a worker failed or left chunks undone (its log tail quoted); a rerun of 01
            redoes only those chunks.
    """
    W = p.generate_workers
    plan = rd.generated.with_name("generate_plan.json")
    atomic_write_json(plan, {"params": p.model_dump(), "job": job})
    procs, logs = [], []
    n_gpu = _gpu_count()
    for w in range(W):
        env = dict(os.environ)
        if n_gpu > 1:
            env["CUDA_VISIBLE_DEVICES"] = str(w % n_gpu)
        logs.append(rd.generated.with_name(f"generate-worker-{w}.log"))
        cmd = [
            sys.executable,
            "-m",
            "eagle3nb.steps.generate.workers",
            str(plan),
            str(w),
            str(W),
        ]
        with open(logs[-1], "w") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
    codes = [pr.wait() for pr in procs]
    results, engine, secs = {}, None, 0.0
    for w in range(W):

        def missing(batch, seed, w=w):
            tail = logs[w].read_text()[-400:] if logs[w].exists() else ""
            raise RuntimeError(
                f"generate worker {w} of {W} exit code {codes[w]} left conversations undone; "
                f"rerun 01 to redo only those. Log tail: {tail.strip()}"
            )

        share = _share(len(job["records"]), p.gen_batch_size, w, W)
        got = regenerate(
            job["records"], missing, tok, job["template"], template_kwargs=job["kwargs"],
            max_new_tokens=p.max_new_tokens, ctx=job["ctx"], batch_size=p.gen_batch_size,
            partial=_partial(rd, w, W), key=job["key"], chunks=share,
        )  # fmt: skip
        results.update({r["id"]: r for r in got})
        info = read_json(rd.generated.with_name(f"generate-worker-{w}.json"))
        engine, secs = info["engine"], max(secs, info["seconds"])
    return engine, secs, [results[r["id"]] for r in job["records"]]


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch CUDA build: CPU workers
        return 0


def clean_partials(rd: RunDir) -> None:
    """Remove the resume files, worker plan, logs and reports once generated.jsonl is written."""
    for f in rd.generated.parent.glob("generate*"):
        if f.name.startswith(("generated.partial", "generate_plan", "generate-worker-")):
            f.unlink(missing_ok=True)


def worker_main(argv: Sequence[str]) -> int:
    """Entry of one regeneration worker: ``python -m eagle3nb.steps.generate.workers PLAN w W``."""
    import torch

    plan_file, w, W = Path(argv[0]), int(argv[1]), int(argv[2])
    plan = json.loads(plan_file.read_text())
    p, job = RunParams(**plan["params"]), plan["job"]
    dev = resolve_device(p)
    if dev == "cpu":  # share the cores instead of oversubscribing them W times
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // W))
    model, tok, path = models.load_target(p.model, p.dtype, dev)
    rd = RunDir(p)
    share = _share(len(job["records"]), p.gen_batch_size, w, W)
    engine, secs, got = regenerate_share(p, rd, model, tok, path, job, _partial(rd, w, W), share)
    report = {"engine": engine, "seconds": round(secs, 3), "chunks": share}
    atomic_write_json(rd.generated.with_name(f"generate-worker-{w}.json"), report)
    print(f"worker {w}/{W}: {len(got)} conversations in {secs:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
