"""02a_extract_vllm: aux states through vLLM's own forward (extract_hidden_states), checked
against the HF reference, written as shards under dataset_vllm/."""

from __future__ import annotations

import time

from eagle3nb.dataset.write import write_dataset
from eagle3nb.engines.speed import TimedCapture
from eagle3nb.engines.vllm_helpers import start_vllm
from eagle3nb.manifest import provenance, template_fields
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.steps.shared.recorded import run_or_read
from eagle3nb.steps.extract import sharded as extract
from eagle3nb.steps.extract.twin_gate import run_twin_check, twin_summary
from eagle3nb.steps.shared.checks import (
    record_engine_threads,
    check_alignment,
    check_engine_boundaries,
    extraction_check_lines,
    extraction_inputs,
    merge_engine_metrics,
    progress_bar,
    record_alignment,
    record_checks,
)
from eagle3nb.boundaries import conventions
from eagle3nb.target import models


def extract_vllm_step(p: RunParams, progress=True) -> dict:
    """02a: capture aux states through vLLM's own forward (``extract_hidden_states``) into
    ``dataset_vllm/``; boundary N (``final``) comes from vLLM too (vLLM id N).

    The run's boundaries (``layer_ids`` in ``convention``) are asked from vLLM with vLLM's ids;
    before writing, a probe sample's captured slots are compared with the HF reference at every
    boundary, and a declared/measured mismatch stops the step (``allow_boundary_mismatch``
    overrides). Also measures vLLM's tokens/s (plain generation, prefill without capture,
    extraction) into ``metrics.json["engines"]["vllm"]``.

    Raises:
        ValueError: no sample to extract; boundaries vLLM cannot capture; measured boundaries differ
            from the declared ones; an engine answer with other rows than asked.
        OSError: not enough disk for the dataset.
        FileNotFoundError: the vLLM venv is missing (``vllm_python``).

    A re-run on unchanged parameters and inputs reads the recorded result (``reuse_results``,
    :mod:`eagle3nb.steps.shared.recorded`) and starts no engine.
    """
    inputs = ("data", "dataset_vllm", "twin")
    return run_or_read(p, RunDir(p).root, "02a_extract_vllm", inputs, lambda: _extract(p, progress))


def _extract(p: RunParams, progress: bool) -> dict:
    from eagle3nb.engines.adapter import EngineCaptureEngine

    rd, gman, _, model, tok, path, tinfo, ids, bnds = extraction_inputs(p)
    n = tinfo["n_layers"]
    vids = conventions.get_convention("vllm").boundaries_to_ids(bnds, n)  # vLLM's ids for bnds
    samples = extract.checked_train_samples(rd)
    # 02a stores aux in the capture dtype whatever aux_storage says (that applies to dataset/)
    disk = extract.disk_plan(
        p, samples, len(bnds), tinfo["hidden_size"], out_dir=rd.dataset_vllm, aux_storage="dtype"
    )
    extract.check_disk(disk, int8_hint=False)
    with start_vllm(p, path, p.dtype, rd.root) as client:
        record_engine_threads(rd, client)
        info = client.info()
        timed = TimedCapture(client)
        engine = EngineCaptureEngine(timed, n, p.capture_batch_size)
        check_engine_boundaries("vLLM", engine, vids, bnds)
        # vLLM's rule measured on a tiny twin of the target, in this worker, before the target
        twin = run_twin_check(p, rd, client, vids, bnds, path)
        # measure, before writing anything, which boundaries vLLM really captured on one sample
        probe = samples[0][1]
        client.capture([probe], vids)  # starts vLLM's capture engine (not timed)
        captured = engine.capture([probe], vids)[0].aux
        align, err, ref_b = check_alignment(
            p, "vllm", "vllm", vids, bnds, captured, model, probe, info["device"]
        )
        man = _manifest(p, info, gman, tinfo, vids, bnds, twin)
        timed.seconds, timed.tokens = 0.0, 0  # the extraction's capture calls only
        t0 = time.time()
        m = write_dataset(
            rd.dataset_vllm,
            samples,
            lambda xs: engine.capture(xs, vids),
            man,
            p.shard_size,
            models.DTYPES[p.dtype],
            progress_bar() if progress else None,
        )
        secs = time.time() - t0
        speed = extract.engine_speed(
            p, client, timed, samples, vids, model, tok, p.capture_batch_size
        )
    version = info["engine_version"]
    merge_engine_metrics(
        rd, "vllm", dict(speed, engine_version=version, device=info["device"], dtype=p.dtype)
    )
    stats = _stats(info, ids, vids, bnds, m, disk, secs)
    update_metrics(rd.metrics, "extract_vllm", stats)
    record_alignment(rd, "vllm", align)
    ids_line = (
        f"{p.convention} ids {ids} -> boundaries {bnds} -> vllm ids {vids} (vLLM {version}: "
        f"id = boundary, id {n} = final pre-norm state)"
    )
    record_checks(rd, "02a_extract_vllm", extraction_check_lines(gman, ids_line, align, disk, m))
    return {
        "manifest": m,
        "boundary_table": conventions.boundary_table(bnds, n),
        "stats": stats,
        "speed": speed,
        "alignment": align,
        "alignment_error": err,
        "reference_boundaries": ref_b,
        "twin": twin,
    }


def _manifest(
    p: RunParams, info: dict, gman: dict, tinfo: dict, vids: list[int], bnds: list[int], twin=None
) -> dict:
    """Provenance of dataset_vllm/: vLLM gives the aux slots and boundary N (its id N)."""
    n = tinfo["n_layers"]
    engine = {
        "name": info["engine_name"],
        "version": info["engine_version"],
        "torch": info["torch_version"],
        "convention": info["convention"],
        "layer_ids": vids,
        "method": "extract_hidden_states",
        "device": info["device"],
    }
    final_state = {
        "engine": info["engine_name"],
        "version": info["engine_version"],
        "boundary": n,
        "layer_id": n,
        "dtype": p.dtype,
    }
    return provenance(
        p.seed,
        target=tinfo,
        engine=engine,
        final_state=final_state,
        convention="vllm",
        layer_ids=vids,
        aux_boundaries=bnds,
        final_boundary=n,
        dtype=p.dtype,
        **template_fields(gman),  # the template and the kwargs 01 rendered with
        generation_sha256=gman["file_sha256"],
        twin_check=twin_summary(twin) if twin else None,
    )


def _stats(info: dict, ids, vids, bnds, m: dict, disk: dict, secs: float) -> dict:
    """metrics.json["extract_vllm"]: what vLLM wrote, how big and how fast."""
    return {
        "engine": info["engine_name"],
        "engine_version": info["engine_version"],
        "convention": "vllm",
        "engine_layer_ids": vids,
        "layer_ids_in_run_convention": ids,
        "aux_boundaries": bnds,
        "n_samples": m["n_samples"],
        "n_tokens": m["n_tokens"],
        "estimated_bytes": disk["total_bytes"],
        "skipped": {k: len(v) for k, v in m["skipped"].items()},
        "seconds": round(secs, 3),
        "tokens_per_s": round(m["n_tokens"] / secs, 1) if secs else None,
    }
