"""02a/02b: the twin proof of the capture engine's layer-id rule, before any extraction
(``twin_check``; see :mod:`eagle3nb.engines.twin_check`)."""

from __future__ import annotations

import warnings

from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir, update_metrics

__all__ = ["run_twin_check", "twin_summary"]


def run_twin_check(
    p: RunParams, rd: RunDir, client, engine_ids: list[int], bnds: list[int], path
) -> dict | None:
    """Capture a tiny twin of the target through the running engine ``client`` at
    ``engine_ids`` and name its slots (:func:`eagle3nb.engines.twin_check.twin_proof`); the
    engine is the one the run captures with, in the same worker (no new process). The record
    (without the error matrix) goes to ``metrics.json["twin_check"][engine]``.

    A key no version file holds is measured on this engine first (``twin_measure.rule_for_run``,
    kept per user; ``"engine_rule"`` with ``known_by: measured`` in the record). A real engine's
    proof is cached (``twin_cache``, ``$EAGLE3NB_TWIN_PROOFS=off`` bypasses it): a later run with the same key (engine, version,
    torch version, twin config and weights, ids, dtype) reads it instead of starting the engine on
    the twin, and the record's ``"cache"`` says so, with when and at which eagle3nb commit it was
    measured. A client that is not an :class:`~eagle3nb.engines.client.EngineClient` of the engine
    it names (the unit tests' fakes) is never cached.

    Returns:
        The proof's dict, plus ``"run_boundaries"`` (``bnds``), ``"run_boundaries_match"`` (the
        measured rule gives the run's ids ``bnds``; where it does not, eagle3nb's convention and
        the table disagree, which preflight refuses and the direct check against the target's HF
        states, run next, stops) and ``"mode"``; None with ``twin_check: off``.

    Raises:
        ValueError: with ``twin_check: enforce``, a verdict other than ``agrees`` (the engine
            captures other boundaries than engine_rules says, or the slots cannot be named); the
            message names class, engine, version, both boundary lists and the parameter. ``warn``
            records the same and continues with a warning.
    """
    from eagle3nb.engines import twin_cache
    from eagle3nb.engines.twin_check import TWIN_ENGINE_OPTIONS, twin_proof
    from eagle3nb.engines.twin_measure import rule_for_run

    if p.twin_check == "off":
        return None
    info = client.info()
    engine, version = info["engine_name"], info["engine_version"]
    real = _real_engine(client, engine)
    got = rule_for_run(client, path, engine_ids, p.dtype, rd.root / "twin", p.seed, keep=real)

    def capture(model_path, samples, ids):
        return client.capture_model(model_path, samples, ids, TWIN_ENGINE_OPTIONS.get(engine))

    cache, extra = None, None
    if real:
        cache = twin_cache.cache_dir()
        extra = {
            "torch_version": info.get("torch_version"),
            "options": TWIN_ENGINE_OPTIONS.get(engine),
        }
    rec = twin_proof(
        capture,
        engine,
        version,
        path,
        engine_ids,
        p.dtype,
        rd.root / "twin",
        p.seed,
        cache,
        extra,
        device=info.get("device", "cpu"),  # an engine on CUDA: TF32 kernels, a wider tolerance
    )
    rec.update(run_boundaries=list(bnds), mode=p.twin_check, engine_rule=got["rule"].as_record())
    rec.update(rule_known_by=got["known_by"], rule_measured_now=got["measured_now"])
    rec["run_boundaries_match"] = rec["target_boundaries"] == list(bnds)
    update_metrics(rd.metrics, "twin_check", {engine: twin_summary(rec)})
    if not rec["agrees"]:
        msg = (
            f"twin check of {rec['arch']} on {engine} {version}: {rec['verdict']}; the run gives "
            f"{engine} ids {rec['ids']} for boundaries {list(bnds)}, the twin measured "
            f"{rec['target_boundaries']}"
        )
        if p.twin_check == "enforce":
            raise ValueError(
                f"{msg}. Fix its file in eagle3nb/boundaries/versions/ after checking the engine's "
                "source, pick other layer_ids, or set twin_check: warn to continue"
            )
        warnings.warn(msg + " (twin_check: warn, continuing)", stacklevel=2)
    return rec


def _real_engine(client, engine: str) -> bool:
    """True for an EngineClient running the registered engine it reports (not a fake)."""
    from eagle3nb.engines.client import EngineClient
    from eagle3nb.engines.worker import REGISTRY

    return isinstance(client, EngineClient) and client.engine == engine and engine in REGISTRY


def twin_summary(rec: dict) -> dict:
    """The twin record as stored in manifests and metrics.json (no error matrix)."""
    return {k: v for k, v in rec.items() if k not in ("error_matrix", "reference_boundaries")}


def export_readings(p: RunParams, manifest: dict) -> dict:
    """For the alignment figure: per installed engine version, the boundaries its rule for the
    target's class reads from the ids the export will write for this dataset's boundaries
    (:func:`eagle3nb.boundaries.engine_read.rule_readings`), as ``{"<engine> <version> reads exported
    ids [..] as boundaries [..]": [boundaries]}`` (the wording of 03's flag,
    :func:`eagle3nb.steps.shared.checks.export_rule_check`); engines whose ids cannot be written or read
    are left out. The ids follow ``p.export_layer_ids``, which 02a/02b declare for this."""
    from eagle3nb.boundaries.engine_read import rule_readings
    from eagle3nb.steps.shared.checks import engine_versions

    t, b = manifest["target"], list(manifest["aux_boundaries"])
    by_rule = p.export_layer_ids != "convention"
    got = rule_readings(b, b, t["n_layers"], t["architecture"], engine_versions(p), by_rule)
    return {
        f"{e} {r['version']} reads exported ids {r['ids']} as boundaries {r['reads']}": r["reads"]
        for e, r in got.items()
        if r.get("reads") is not None
    }
