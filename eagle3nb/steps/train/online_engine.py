"""03 online from the serving engine (``training_mode: online``, ``online_engine: vllm | sglang``):
start the engine worker as 02a/02b start it (same ids, dtype and options), run 02a/02b's proofs
before the first step (the twin proof of the engine's rule, the probe sample against HF; SGLang:
HF's boundary N against SGLang's own log-probs), and hand
:class:`eagle3nb.training.engine_online.EngineOnlineSource` the engine's capture.

Where the tensors cross: the worker's capture answer is one safetensors file per engine call (one
training batch, not one per sample) in the worker's temp folder, which here lies in shared memory
(``/dev/shm``, a tmpfs: :func:`shared_memory_dir`), never under the run folder; the client reads it
and deletes it at once (:func:`eagle3nb.engines.worker.load_tensors`). With ``vllm_python: ""``
(the engine imported here, a GPU box) the tensors stay in this process. With ``online_cache_gib``
> 0 the first epoch's states are also kept in ``outputs/<run>/online_cache/`` within that bound
(:mod:`eagle3nb.training.online_cache`); the space is checked before the engine starts. Each batch's
step and sample ids go to ``train/online_batches.jsonl`` (ids only, no states).
"""

from __future__ import annotations

import os
import tempfile

from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir
from eagle3nb.steps.extract import sharded as extract
from eagle3nb.steps.extract.twin_gate import run_twin_check
from eagle3nb.steps.shared.checks import (
    check_alignment,
    check_engine_boundaries,
    checked_generation,
    record_alignment,
    resolve_aux,
)
from eagle3nb.boundaries import conventions
from eagle3nb.target import models
from eagle3nb.training.engine_online import EngineOnlineSource
from eagle3nb.training.online_cache import GIB, check_cache_space

__all__ = ["engine_online_source", "shared_memory_dir", "RECHECK_TOL"]

# re-check tolerance (max |diff|) where bit-equality is not asked (not float32 on CPU): the same
# call asked twice of a GPU engine may take other kernels; unmeasured here (no GPU run yet)
RECHECK_TOL = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 5e-2}


# re-check tolerance of HF's boundary N (SGLang online): float32 over other thread counts
# (measured 2.15e-6, bench/online.py params/default.yaml --steps 500, 2026-12-06); bf16 as above
FINAL_TOL_HF = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 5e-2}


def shared_memory_dir() -> str:
    """``/dev/shm`` when it is a writable folder (a tmpfs: files there are memory), else the system
    temp folder: where the engine worker's capture answers go for online training."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


def engine_online_source(p: RunParams, rd: RunDir, model, tok, path, device: str):
    """The engine-fed batch source of 03 online, its engine started and proven.

    Args:
        model: the HF target loaded by 03 (float32): the reference of the probe check; with
            SGLang also boundary N (in ``p.dtype``, as 02b takes it).

    Raises:
        ValueError: the twin proof or the probe check fails (as in 02a/02b; ``twin_check``,
            ``allow_boundary_mismatch``); no sample to train on.
        FileNotFoundError: the engine's venv is missing.
    """
    from eagle3nb.engines.client import EngineError

    cache_bytes = int(p.online_cache_gib * GIB)
    if cache_bytes:  # refused before the engine starts
        check_cache_space(rd.online_cache, cache_bytes)
    gman, tinfo = checked_generation(p, rd, model, tok, path)
    ids, bnds = resolve_aux(p, tinfo["n_layers"])
    samples = extract.checked_train_samples(rd, "train on")
    ref = model
    # SGLang's boundary N: HF in the run's dtype (vLLM gives its own; a second copy of the target
    # on the GPU beside vLLM's and 03's would only take memory)
    if p.online_engine == "sglang" and model.dtype != models.DTYPES[p.dtype]:
        ref = models.load_target(p.model, p.dtype, model.device)[0]
    start = (lambda: _start_vllm(p, path)) if p.online_engine == "vllm" else None
    start = start or (lambda: _start_sglang(p, path, model, device))
    client = start()
    try:
        prove = _prove_vllm if p.online_engine == "vllm" else _prove_sglang
        engine, eng_ids, man, info = prove(
            p, rd, client, model, ref, gman, tinfo, ids, bnds, samples
        )
    except BaseException:
        client.close()
        raise
    holder = {"client": client}

    def restart():  # the worker died: stop what is left of it and start the same engine again
        try:
            holder["client"].close()
        except Exception:  # noqa: BLE001 (already dead)
            pass
        holder["client"] = start()
        engine.client = holder["client"]

    exact = p.dtype == "float32" and info.get("device", "cpu") == "cpu"
    src = EngineOnlineSource(
        samples,
        lambda xs: engine.capture(xs, eng_ids),
        man,
        prefetch_bytes=p.online_prefetch_mib << 20,
        recheck_every=p.online_recheck_every,
        exact=exact,
        recheck_tol=0.0 if exact else RECHECK_TOL[p.dtype],
        restart=restart,
        restartable=(EngineError,),
        on_close=lambda: holder["client"].close(),
        # SGLang's boundary N is HF's, computed here: its float32 bits follow torch's thread count
        # (a bench run of 500 steps saw 2.15e-6 at step 99 after the thread budget moved)
        final_tol=FINAL_TOL_HF[p.dtype] if p.online_engine == "sglang" else None,
        cache_dir=rd.online_cache if cache_bytes else None,
        cache_bytes=cache_bytes,
        batches_log=rd.train / "online_batches.jsonl",
    )
    return src


def _start_vllm(p: RunParams, path):
    from eagle3nb.engines.vllm_helpers import start_vllm

    return start_vllm(p, path, p.dtype, shared_memory_dir())


def _start_sglang(p: RunParams, path, model, device: str):
    from eagle3nb.engines.sglang_helpers import start_sglang

    ctx, kw = model.config.max_position_embeddings, p.sglang_options
    return start_sglang(
        path, p.dtype, device, p.seed, p.sglang_python, shared_memory_dir(), ctx, kw
    )


def _prove_vllm(p, rd, client, model, ref, gman, tinfo, ids, bnds, samples):
    """02a's proofs on the running vLLM worker; returns ``(engine, vllm ids, manifest, info)``
    with 02a's dataset manifest (:func:`eagle3nb.steps.extract.from_vllm._manifest`)."""
    from eagle3nb.engines.adapter import EngineCaptureEngine
    from eagle3nb.steps.extract.from_vllm import _manifest

    n = tinfo["n_layers"]
    vids = conventions.get_convention("vllm").boundaries_to_ids(bnds, n)
    info = client.info()
    engine = EngineCaptureEngine(client, n, max(p.batch_size, 1))  # one call per training batch
    check_engine_boundaries("vLLM", engine, vids, bnds)
    twin = run_twin_check(p, rd, client, vids, bnds, models.resolve_model(p.model))
    probe = samples[0][1]
    captured = engine.capture([probe], vids)[0].aux
    dev = info.get("device", "cpu")
    align, _, _ = check_alignment(p, "vllm", "vllm", vids, bnds, captured, model, probe, dev)
    record_alignment(rd, "vllm", align, online=True)
    return engine, vids, _manifest(p, info, gman, tinfo, vids, bnds, twin), info


def _prove_sglang(p, rd, client, model, ref, gman, tinfo, ids, bnds, samples):
    """02b's proofs on the running SGLang worker (twin, probe vs HF, HF's boundary N vs SGLang's
    log-probs); returns ``(engine, SGLang ids, manifest, info)`` with 02b's dataset manifest."""
    from eagle3nb.steps.extract.from_sglang import _manifest, _sglang_capture

    n = tinfo["n_layers"]
    sg_ids = conventions.get_convention("sglang").boundaries_to_ids(bnds, n)
    twin = run_twin_check(p, rd, client, sg_ids, bnds, models.resolve_model(p.model))
    probe = samples[0][1]
    cap = _sglang_capture(p, client, ref, n, bnds, [probe])  # final: HF in p.dtype, as 02b
    cap.engine.client = client  # 02b times its calls; here the source times them
    cap.engine.batch_size = max(p.batch_size, 1)
    check_engine_boundaries(cap.engine.engine_name, cap.engine, cap.ids, bnds)
    dev = cap.block.get("device", "cpu")
    conv = cap.engine.convention.name
    align, _, _ = check_alignment(
        p, cap.engine.engine_name, conv, cap.ids, bnds, cap.probe_aux[0], model, probe, dev
    )
    record_alignment(rd, cap.engine.engine_name, align, online=True)
    man = _manifest(p, gman, tinfo, cap, ids, bnds, twin)
    return cap.engine, cap.ids, man, client.info()
