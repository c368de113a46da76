"""The per-run numeric proof of an engine's layer-id rule on a tiny twin of the target.

A target too large for an HF reference on the same machine cannot have its captured slots named by
comparison with HF. Its class's rule can still be measured: :func:`twin_proof` builds a tiny
random-weight twin from the target's own config.json (:func:`eagle3nb.target.twin.build_twin`: layers,
widths and experts shrunk; rope, MLA ranks, router and chunk sizes kept), has the *same* engine and
version capture it at the run's ids (in the running engine worker, ``capture_model``: no new
process), computes the HF reference of the twin at every boundary 0..n, and names every captured
slot by the boundary it equals (adjacent boundaries of such twins differ by ~0.45 relative or more;
the separation is measured and recorded). The measured id -> boundary map is then compared with
:mod:`eagle3nb.boundaries.rules`; a disagreement is the verdict ``disagrees``.

Imported on the notebook's side (it needs transformers and the rest of ``eagle3nb``).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

from eagle3nb.engines import twin_cache
from eagle3nb.target import models
from eagle3nb.boundaries.alignment import tolerance, alignment_matrix, boundary_separation
from eagle3nb.target.capture import reference_states
from eagle3nb.boundaries.rules import engine_rule
from eagle3nb.target.twin import build_twin, name_slots, probe_samples, twin_ids, twin_layers

__all__ = ["twin_proof", "ENGINE_TOLERANCE", "TWIN_ENGINE_OPTIONS", "MIN_SEPARATION_FACTOR"]

# (engine, class) -> relative tolerance where the engine's kernels are not exact in float32:
# vLLM gpt-oss matched HF to 8.6e-3..3.3e-2 at every boundary (../shared/reference/architectures.md
# section 4: bf16-level kernel error at every token, not a shift)
ENGINE_TOLERANCE = {("vllm", "GptOssForCausalLM"): 6e-2}
# a twin needs no long context: a small KV cache and a quick engine build
TWIN_ENGINE_OPTIONS = {"vllm": {"max_model_len": 256}, "sglang": {"context_length": 256}}
# the twin's adjacent boundaries must lie at least this many tolerances apart to name a slot
MIN_SEPARATION_FACTOR = 4.0


def twin_proof(
    capture: Callable[[str, list[list[int]], list[int]], list[dict]],
    engine: str,
    version: str,
    target_path: str | Path,
    engine_ids: Sequence[int],
    dtype: str,
    twin_dir: str | Path,
    seed: int = 0,
    cache: str | Path | None = None,
    cache_extra: dict | None = None,
    device: str = "cpu",
) -> dict:
    """Measure which boundaries ``engine`` at ``version`` captures for ``engine_ids`` on a twin of
    the target in ``target_path``, and compare with the engine_rules table.

    Args:
        capture: ``(model_path, samples, ids) -> [{"aux": [T, n_ids*H]}, ...]``, the engine's own
            capture of another model folder (``EngineClient.capture_model``).
        engine, version: what the engine reported about itself (keys the table).
        engine_ids: the ids the run gives this engine (its own ids, in its own convention).
        dtype: the engine's dtype, and ``device`` where it ran (they set the tolerance,
            :func:`eagle3nb.boundaries.alignment.tolerance`: TF32 kernels on CUDA).
        twin_dir: where the twin folder is built (reused when already built for this config).
        cache: folder of cached measurements (:mod:`eagle3nb.engines.twin_cache`); None measures
            without reading or writing one. A cached measurement under the same key
            (:func:`eagle3nb.engines.twin_cache.key_fields`) is used instead of calling
            ``capture``; a miss measures and writes it. Only a real engine's measurement belongs
            there (a fake reporting a real engine's name and version would poison it).
        cache_extra: the engine's further facts entering the key (torch version, options).

    Returns:
        ``{"engine", "version", "arch", "twin": {"path", "n_layers", "hidden_size", "vocab_size"},
        "ids", "twin_ids", "measured" (boundary per slot, None where no boundary is within
        tolerance), "table" (the table's boundaries for ``twin_ids``, None where it refuses them),
        "table_error", "rule" (kind), "source", "shift" (measured boundary - id per slot),
        "target_boundaries" (the run's ids + the measured shift), "agrees" (measured == table),
        "verdict" (a sentence), "slots" ([{"id", "boundary", "error", "next_error"}]),
        "separation", "tolerance", "seconds": {"build", "capture", "reference", "total"},
        "error_matrix" ([n_slots, n+1] nested list), "reference_boundaries", "cache" (None without
        ``cache``; else ``{"hit", "path", "key_sha256", "measured_at" (UTC ISO 8601),
        "measured_commit" (eagle3nb git commit of the measurement)}``)}``; the measurement part is
        the cached one on a hit (``seconds`` then has capture = reference = 0).

    Raises:
        ValueError: a class or version the table lacks (:func:`engine_rule`).
    """
    t0 = time.perf_counter()
    cfg = models.text_config(models.read_model_config(target_path))
    arch = models.target_arch(cfg, str(target_path))
    rule = engine_rule(engine, version, arch)  # raises for a key the table lacks
    n = int(cfg["num_hidden_layers"])
    nt = twin_layers(n)
    tdir = build_twin(target_path, twin_dir, nt, seed, arch, models.MODEL_TYPE_ALIASES)
    t_build = time.perf_counter()
    tids = twin_ids(engine_ids, n, nt)
    tcfg = models.text_config(models.read_model_config(tdir))
    samples = probe_samples(int(tcfg["vocab_size"]), seed)
    tol = ENGINE_TOLERANCE.get((engine, arch), tolerance(dtype, device))
    fields, entry = None, None
    if cache is not None:
        fields = twin_cache.key_fields(
            engine, version, arch, tdir, tids, engine_ids, samples, dtype, tol, seed, cache_extra
        )
        entry = twin_cache.load(cache, fields)
    t_key = time.perf_counter()
    hit = entry is not None
    if hit:
        meas = entry["measurement"]
        t_cap = t_ref = t_key
    else:
        got = capture(str(tdir), samples, tids)
        t_cap = time.perf_counter()
        meas = _measure(got, samples, tdir, len(tids), tol)
        t_ref = time.perf_counter()
        if fields is not None:
            try:
                entry = twin_cache.store(cache, fields, meas)
            except OSError as e:  # an unwritable cache costs the next run a measurement, no more
                warnings.warn(f"twin proof not cached in {cache}: {e}", stacklevel=2)
    cache_info = None
    if entry is not None:
        cache_info = {
            "hit": hit,
            "path": entry["path"],
            "key_sha256": entry["sha256"],
            "measured_at": entry["measured_at"],
            "measured_commit": entry["eagle3nb_commit"],
        }
    slots, sep = meas["slots"], meas["separation"]
    measured = [s["boundary"] for s in slots]
    table, table_error = None, None
    try:
        table = rule.ids_to_boundaries(tids, nt)
    except ValueError as e:
        table_error = str(e)
    named = all(m is not None for m in measured) and sep >= MIN_SEPARATION_FACTOR * tol
    shift = [m - i for m, i in zip(measured, tids)] if named else None
    agrees = named and table is not None and measured == table
    target_b = [i + d for i, d in zip(engine_ids, shift)] if shift is not None else None
    if agrees:
        verdict = (
            f"agrees: {engine} {version} captured boundaries {measured} for ids {tids} on the "
            f"{nt}-layer twin, as engine_rules says (rule {rule.kind!r}, {rule.source})"
        )
    elif not named:
        verdict = (
            f"inconclusive: slots named {measured} (tolerance {tol:g}), adjacent boundaries "
            f"{sep:.3g} apart (need >= {MIN_SEPARATION_FACTOR * tol:.3g})"
        )
    else:
        verdict = (
            f"disagrees: {engine} {version} captured boundaries {measured} for ids {tids} on the "
            f"{nt}-layer twin; engine_rules says {table if table is not None else table_error} "
            f"(rule {rule.kind!r}, {rule.source})"
        )
    return {
        "engine": engine,
        "version": version,
        "arch": arch,
        "twin": {
            "path": str(tdir),
            "n_layers": nt,
            "hidden_size": int(tcfg["hidden_size"]),
            "vocab_size": int(tcfg["vocab_size"]),
            "probe_tokens": [len(s) for s in samples],
        },
        "ids": [int(i) for i in engine_ids],
        "twin_ids": tids,
        "measured": measured,
        "table": table,
        "table_error": table_error,
        "rule": rule.kind,
        "source": rule.source,
        "shift": shift,
        "target_boundaries": target_b,
        "agrees": bool(agrees),
        "verdict": verdict,
        "slots": [dict(s, id=i) for s, i in zip(slots, tids)],
        "cache": cache_info,
        "separation": sep,
        "tolerance": tol,
        "seconds": {
            "build": round(t_build - t0, 3),
            "capture": round(t_cap - t_key, 3),
            "reference": round(t_ref - t_cap, 3),
            "total": round(t_ref - t0, 3),
        },
        "error_matrix": meas["error_matrix"],
        "reference_boundaries": list(meas["reference_boundaries"]),
    }


def _measure(got: list[dict], samples, tdir, n_slots: int, tol: float) -> dict:
    """The HF reference of the twin in ``tdir`` at every boundary, each captured slot of ``got``
    (``[{"aux": [T, n_slots*H]}]`` per sample) named by the boundary it equals: ``{"slots",
    "separation", "error_matrix" ([n_slots, n+1], the worst sample), "reference_boundaries"}``."""
    model = models.load_target(tdir, "float32")[0]
    err, sep, bnds = None, float("inf"), None
    for s, g in zip(samples, got):
        ref = reference_states(model, s)
        e, bnds = alignment_matrix(g["aux"].float(), ref, n_slots)
        err = e if err is None else err.maximum(e)  # the worst sample per slot and boundary
        sep = min(sep, boundary_separation(ref))
    return {
        "slots": name_slots(err, bnds, tol),
        "separation": sep,
        "error_matrix": err.tolist(),
        "reference_boundaries": [int(b) for b in bnds],
    }
