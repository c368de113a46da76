"""02b_extract_sglang: aux states through SGLang's own model path (or HF at SGLang's capture point),
checked against the HF reference, written as shards; drift across engines and dtypes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eagle3nb.manifest import provenance, template_fields
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.steps.extract import sharded as extract
from eagle3nb.steps.extract.twin_gate import run_twin_check, twin_summary
from eagle3nb.steps.shared.checks import (
    check_alignment,
    check_engine_boundaries,
    extraction_check_lines,
    extraction_inputs,
    merge_engine_metrics,
    progress_bar,
    record_alignment,
    record_checks,
    record_engine_threads,
)
from eagle3nb.steps.shared.recorded import run_or_read
from eagle3nb.steps.extract.engine_drift import (
    DRIFT_REFERENCE,
    drift_summary,
    hf_states,
    other_engine_datasets,
    split_aux,
)
from eagle3nb.boundaries import conventions
from eagle3nb.target import models
from eagle3nb.target.capture import HFCaptureEngine

WHY_FINAL_FROM_HF = (
    "SGLang 0.5.23 cannot return boundary N: its capture hooks take layer inputs only, and "
    "capture-only mode returns the aux states in place of the last-layer states (sglang_backend "
    "docstring); final is HF's boundary N, checked against SGLang's own next-token log-probs"
)


@dataclass
class _Capture:
    """02b's capture engine, started, and what it returned for the probe samples."""

    engine: object  # HFCaptureEngine, or EngineCaptureEngine over the SGLang client
    ids: list[int]  # the engine's ids for the run's boundaries
    block: dict  # manifest "engine" block
    probe_aux: list[torch.Tensor]  # [T_i, n_aux*H] per probe sample
    timed: object = None  # TimedCapture around the SGLang client (None with HF)
    final: dict = field(default_factory=dict)  # extra keys of the manifest's "final_state" block
    checks: list[str] = field(default_factory=list)  # metrics.json["checks"] lines of the start


def extract_sglang_step(p: RunParams, progress=True) -> dict:
    """02b: capture aux states into shards through SGLang's own model path
    (``extract_engine="sglang"``, the SGLang worker in its venv, loopback-only) or with HF at
    SGLang's capture point (``extract_engine="hf"``). Boundary N (``final``) comes from HF in both
    cases (SGLang cannot give it; see :mod:`eagle3nb.engines.sglang_backend`); the manifest names
    both engines.

    Before writing, the disk plan is checked, the engine's ids must name the run's boundaries and
    a probe sample's captured slots must match the HF reference (``allow_boundary_mismatch``
    overrides); with SGLang, HF's final state must give SGLang's own next-token log-probs. After
    writing, the probe samples' states are compared across engines and dtypes (``drift``).

    Raises:
        ValueError: no sample to extract; ``extract_workers`` > 1 with SGLang; a boundary or
            log-prob mismatch (see above).
        OSError: not enough disk for the dataset.
        RuntimeError: an extraction worker was lost (rerun to redo its shards).

    A re-run on unchanged parameters and inputs reads the recorded result (``reuse_results``,
    :mod:`eagle3nb.steps.shared.recorded`) and starts no engine.
    """
    root = RunDir(p).root
    inputs = ("data", "dataset", "dataset_vllm", "twin")  # dataset_vllm: the drift's other engine
    return run_or_read(p, root, "02b_extract_sglang", inputs, lambda: _extract(p, progress))


def _extract(p: RunParams, progress: bool) -> dict:
    from eagle3nb.engines.sglang_helpers import start_sglang

    rd, gman, device, model, tok, path, tinfo, ids, bnds = extraction_inputs(p)
    n = tinfo["n_layers"]
    samples = _checked_samples(p, rd)
    disk = extract.disk_plan(p, samples, len(bnds), tinfo["hidden_size"])
    # exact shard bytes vs free space, and shards vs memory, before any capture
    extract.check_disk(disk, workers=p.extract_workers)
    probe_n = max(1, min(p.drift_samples, len(samples)))
    probes = [s[1] for s in samples[:probe_n]]
    client = None
    try:
        if p.extract_engine == "sglang":
            ctx, kw = model.config.max_position_embeddings, p.sglang_options
            client = start_sglang(path, p.dtype, device, p.seed, p.sglang_python, rd.root, ctx, kw)
            record_engine_threads(rd, client)
            sg_ids = conventions.get_convention("sglang").boundaries_to_ids(bnds, n)
            twin = run_twin_check(p, rd, client, sg_ids, bnds, path)  # SGLang's rule, on a twin
            cap = _sglang_capture(p, client, model, n, bnds, probes)
        else:
            twin, cap = None, _hf_capture(p, model, ids, probes)
        engine = cap.engine
        check_engine_boundaries(engine.engine_name, engine, cap.ids, bnds)
        # measure, before writing anything, which boundaries the engine really captured
        conv = engine.convention.name
        dev = cap.block.get("device", "cpu") if client is not None else "cpu"  # HF: exact
        align, err, ref_b = check_alignment(
            p, engine.engine_name, conv, cap.ids, bnds, cap.probe_aux[0], model, probes[0], dev
        )
        man = _manifest(p, gman, tinfo, cap, ids, bnds, twin)
        t0 = time.time()
        bar = progress_bar() if progress else None
        m = extract.write(p, rd, samples, engine, cap.ids, man, bar)
        secs = time.time() - t0
        # speeds first, on the running engine; the drift's other dtype then restarts it, once
        extra = _speeds(p, rd, client, cap, model, tok, samples, ids)
        drift = _drift(p, rd, model, device, client, cap, samples[:probe_n], bnds)
    finally:
        if client is not None:
            client.close()
    stats = _stats(p, cap, man, ids, bnds, m, disk, extra, secs)
    update_metrics(rd.metrics, "extract", stats)
    if summary := drift_summary(drift, bnds):
        block = {"median_relative_deviation_from_hf_float32": summary, "samples": probe_n}
        update_metrics(rd.metrics, "engine_drift", block)
    ids_line = (
        f"{p.convention} ids {ids} -> boundaries {bnds}: capturable, strictly increasing; "
        f"{engine.engine_name} asked with its ids {cap.ids}"
    )
    checks = cap.checks + extraction_check_lines(gman, ids_line, align, disk, m)
    record_checks(rd, "02b_extract_sglang", checks)
    record_alignment(rd, engine.engine_name, align)
    return {
        "manifest": m,
        "boundary_table": conventions.boundary_table(bnds, n),
        "stats": stats,
        "alignment": align,
        "alignment_error": err,
        "reference_boundaries": ref_b,
        "drift": drift,
        "drift_reference": DRIFT_REFERENCE,
        "speed": extra.get("speed"),
        "twin": twin,
    }


def _checked_samples(p: RunParams, rd: RunDir) -> list[tuple[int, list[int], list[int]]]:
    """01's train samples (both modes: the served prompt, chat: the template's prefix rendering,
    plus exactly the generated ids), the same list each extraction worker rebuilds.

    Raises:
        ValueError: no sample; or ``extract_workers`` > 1 with SGLang.
    """
    samples = extract.checked_train_samples(rd)
    if p.extract_engine == "sglang" and p.extract_workers > 1:
        raise ValueError(
            f"extract_workers={p.extract_workers} with extract_engine='sglang': sharded "
            "extraction starts one HF engine per worker; use extract_workers: 1 with SGLang (it "
            "batches inside its own engine), or extract_engine: hf"
        )
    return samples


def _hf_capture(p: RunParams, model, ids: list[int], probes: list[list[int]]) -> _Capture:
    """HF capturing at ``p.convention``'s capture point (the run's ids are its ids)."""
    engine = HFCaptureEngine(model, p.convention, p.capture_batch_size)
    block = {
        "name": engine.engine_name,
        "version": engine.engine_version,
        "capture_point_of": p.convention,
    }
    return _Capture(engine, ids, block, [c.aux for c in engine.capture(probes, ids)])


def _sglang_capture(p: RunParams, client, model, n: int, bnds, probes) -> _Capture:
    """SGLang's capture engine, started by capturing the probe samples (with SGLang's own input
    log-probs); boundary N from HF, checked against those log-probs.

    Raises:
        ValueError: log-probs from HF's final state differ from SGLang's (unless
            ``p.allow_boundary_mismatch``).
    """
    from eagle3nb.engines.adapter import EngineCaptureEngine
    from eagle3nb.engines.sglang_helpers import hf_final, namespace_report
    from eagle3nb.engines.speed import TimedCapture

    info = client.info()
    engine = EngineCaptureEngine(
        client,
        n,
        p.capture_batch_size,
        final_from=lambda xs: hf_final(model, xs, p.capture_batch_size),
    )
    eng_ids = engine.convention.boundaries_to_ids(bnds, n)  # SGLang's ids for the run's boundaries
    probe = client.capture(probes, eng_ids, logprobs=True)  # starts SGLang's capture engine
    net = namespace_report(client.pid)  # now that the scheduler (and its TCPStore) is up
    isolated = client.pid and net.get("loopback_only")
    block = {
        "name": info["engine_name"],
        "version": info["engine_version"],
        "torch": info["torch_version"],
        "convention": info["convention"],
        "layer_ids": eng_ids,
        "device": info["device"],
        "cpu_shim": info["cpu_shim"],
        "network": "loopback-only namespace" if isolated else "host namespace",
    }
    lp = _check_final_logprobs(p, model, probes[0], probe[0]["input_logprobs"])
    if "error" not in net:
        net_line = (
            f"SGLang worker network namespace: interfaces {net.get('interfaces')}, "
            f"TCP listeners {net.get('listeners')}"
        )
    else:
        net_line = f"SGLang network namespace not inspected: {net['error']}"
    lp_line = (
        f"final (boundary {n}) from hf-transformers; its next-token log-probs vs SGLang's own on "
        f"a probe sample: max |diff| {lp['max_abs_diff']:.2e} (tolerance {lp['tolerance']})"
    )
    # time the engine's capture calls during extraction (engine already started by the probe)
    engine.client = timed = TimedCapture(client)
    final = {"why": WHY_FINAL_FROM_HF, "check_vs_sglang_logprobs": lp}
    aux = [r["aux"] for r in probe]
    return _Capture(engine, eng_ids, block, aux, timed, final, [net_line, lp_line])


def _check_final_logprobs(p: RunParams, model, sample, sglang_logprobs) -> dict:
    """Does HF's boundary N give SGLang's own next-token log-probs on ``sample``? Returns
    :func:`eagle3nb.engines.sglang_helpers.final_logprob_check`'s dict.

    Raises:
        ValueError: they differ beyond the dtype's tolerance (unless ``allow_boundary_mismatch``).
    """
    from eagle3nb.engines.sglang_helpers import final_logprob_check, hf_final

    final = hf_final(model, [sample])[0]
    lp = final_logprob_check(model, sample, final, sglang_logprobs, p.dtype)
    if not lp["ok"] and not p.allow_boundary_mismatch:
        raise ValueError(
            f"log p(next token) from HF's final state differs from SGLang's own by "
            f"{lp['max_abs_diff']:.3g} > {lp['tolerance']} ({p.dtype}): the stored target "
            "distribution would not be SGLang's; check dtype/model, or set "
            "allow_boundary_mismatch=True to continue"
        )
    return lp


def _manifest(p: RunParams, gman: dict, tinfo: dict, cap: _Capture, ids, bnds, twin) -> dict:
    """Provenance of dataset/: the capture engine for the aux slots, HF for boundary N."""
    import transformers

    n = tinfo["n_layers"]
    final = {
        "engine": "hf-transformers",
        "version": transformers.__version__,
        "boundary": n,
        "dtype": p.dtype,
        **cap.final,
    }
    return provenance(
        p.seed,
        target=tinfo,
        engine=cap.block,
        final_state=final,
        convention=p.convention,
        layer_ids=ids,
        aux_boundaries=bnds,
        final_boundary=n,
        dtype=p.dtype,
        **template_fields(gman),  # the template and the kwargs 01 rendered with
        generation_sha256=gman["file_sha256"],
        twin_check=twin_summary(twin) if twin else None,
    )


def _drift(p: RunParams, rd: RunDir, model, device, client, cap: _Capture, probe_samples, bnds):
    """States of the probe samples at the run's boundaries from HF float32 (the reference), HF
    bfloat16, the capture engine, SGLang in the other dtype (``drift_both_dtypes``: the running
    SGLang worker ``client`` restarts its engine in that dtype, its last use in 02b) and other
    engines' datasets in this run folder: ``{label: {b: [sum T, H] float32}}`` ({} when
    ``drift_samples`` is 0). Same tokens and boundaries, so layer offsets are excluded."""
    drift = {}
    if not p.drift_samples:
        return drift
    probes = [s[1] for s in probe_samples]
    ref32 = model if p.dtype == "float32" else models.load_target(p.model, "float32", device)[0]
    drift[DRIFT_REFERENCE] = hf_states(ref32, probes, bnds)
    bf = model if p.dtype == "bfloat16" else models.load_target(p.model, "bfloat16", device)[0]
    drift["hf-transformers bfloat16"] = hf_states(bf, probes, bnds)
    if p.extract_engine != "hf":  # HF's own capture is the HF entries above
        drift[f"{cap.engine.engine_name} {p.dtype}"] = split_aux(cap.probe_aux, bnds)
    if p.extract_engine == "sglang" and p.drift_both_dtypes:
        other = "bfloat16" if p.dtype == "float32" else "float32"
        rows = [r["aux"] for r in client.capture(probes, cap.ids, dtype=other)]
        drift[f"sglang {other}"] = split_aux(rows, bnds)
    drift.update(other_engine_datasets(rd, cap.engine.engine_name, [s[0] for s in probe_samples]))
    return drift


def _speeds(p: RunParams, rd: RunDir, client, cap: _Capture, model, tok, samples, ids) -> dict:
    """HF: capture overhead in this process (same batches, forward with vs without capture).
    SGLang with ``measure_engine_speed``: the server's tokens/s, also merged into
    ``metrics.json["engines"]["sglang"]``. Returns ``{"capture_speed"?, "speed"?}``."""
    extra = {}
    if p.extract_engine == "hf":
        extra["capture_speed"] = extract.capture_overhead(model, cap.engine, samples, ids)
    if p.extract_engine == "sglang" and p.measure_engine_speed:
        # prefill timed in measure_speed's default calls of 32 samples, as 02b has measured it;
        # the plain requests run on the capture engine already started (no restart)
        kw = {"on_capture_engine": True}
        extra["speed"] = extract.engine_speed(
            p, client, cap.timed, samples, cap.ids, model, tok, generate_kw=kw, interleave=True
        )
        merge_engine_metrics(
            rd,
            "sglang",
            dict(
                extra["speed"],
                engine_version=cap.block["version"],
                device=cap.block["device"],
                dtype=p.dtype,
            ),
        )
    return extra


def _stats(p: RunParams, cap: _Capture, man, ids, bnds, m, disk, extra, secs) -> dict:
    """metrics.json["extract"]: what was written, by which engines, how big and how fast."""
    stats = {
        "engine": cap.engine.engine_name,
        "engine_version": cap.block["version"],
        "final_state_engine": man["final_state"]["engine"],
        "layer_ids": ids,
        "engine_layer_ids": cap.ids,
        "aux_boundaries": bnds,
        "n_samples": m["n_samples"],
        "n_tokens": m["n_tokens"],
        "estimated_bytes": disk["total_bytes"],
        "disk": disk,
        "workers": p.extract_workers,
        "aux_storage": p.aux_storage,
        "aux_quantization": m.get("aux_quantization"),
        "capture_speed": extra.get("capture_speed"),
        "skipped": {k: len(v) for k, v in m["skipped"].items()},
        "seconds": round(secs, 3),
        "tokens_per_s": round(m["n_tokens"] / secs, 1) if secs else None,
    }
    if "capture_point_of" in cap.block:
        stats["capture_point_of"] = cap.block["capture_point_of"]
    return stats
