"""Read an exported drafter config the way each serving engine reads it, and report what it ignores.

An exported flag only matters if the serving engine reads it. These readers mirror what the
engines' EAGLE-3 model files read (``../shared/reference/conventions.md`` section 2):

- SGLang ``srt/models/llama_eagle3.py`` + ``llama.py`` (0.5.x): ids only from the nested
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (id = boundary - 1; absent -> its default
  ``[2, N//2, N-3]`` unshifted), ``draft_vocab_size``, ``target_hidden_size`` (fc input width /
  n_aux). It does not read ``norm_before_residual`` (residual = un-normed hidden).
- vLLM ``model_executor/models/llama_eagle3.py`` (0.3x): ``draft_vocab_size``,
  ``target_hidden_size``, ``norm_before_residual``; ids (id = boundary) as 0.32.0's
  ``v1/worker/gpu_model_runner.py:5251-5285`` ``_get_eagle3_aux_layers_from_config`` reads them:
  the top-level ``eagle_aux_hidden_state_layer_ids``; when that is absent or empty, DFlash's
  ``dflash_config.target_layer_ids`` + 1, then (overriding it) the nested
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` when ``eagle_config`` is a dict; none ->
  ``(2, N//2, N-3)`` (``model_executor/models/interfaces.py:1712-1733``). So a config carrying only
  SGLang's nested ids (boundary - 1) is read by vLLM as boundaries one lower.

- vLLM given the *drafter* as its model (``vllm serve DRAFTER``, 0.32
  ``transformers_utils/config.py`` ``maybe_override_with_speculators``): when config.json has
  ``speculators_config`` it serves ``speculators_config.verifier.name_or_path`` (model and
  tokenizer) with ``{"method": speculators_model_type, "num_speculative_tokens":
  proposal_methods[0].speculative_tokens, "model": DRAFTER}``, user ``--speculative-config`` keys
  applied on top (method and model locked). See :func:`vllm_serve_drafter`. SGLang reads none of
  these keys (0.5.23 has no "speculators" in its source).

Ids are read with the engine version's rule for the drafter's target class when the export recorded
it (``eagle3nb.engine_ids``, :mod:`eagle3nb.target.engine_rules`), else with the engine's plain
convention. Versions change: when an engine is upgraded, re-read its source and update the table.
"""

from __future__ import annotations

from eagle3nb.target.conventions import get_convention
from eagle3nb.target.engine_rules import engine_rule

__all__ = [
    "ENGINE_READS",
    "read_as_engine",
    "engine_report",
    "rule_readings",
    "vllm_serve_drafter",
]

# flag -> engines that read it (flags the trainer sets that change the computed function)
ENGINE_READS = {
    "sglang": {
        "ids_key": "eagle_config.eagle_aux_hidden_state_layer_ids",
        "flags": {
            "draft_vocab_size",
            "target_hidden_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "rope_theta",
        },
    },
    "vllm": {
        "ids_key": "eagle_aux_hidden_state_layer_ids",
        "flags": {
            "draft_vocab_size",
            "target_hidden_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "rope_theta",
            "norm_before_residual",
        },
    },
}
# value an engine assumes for a flag it does not read
ENGINE_ASSUMES = {"norm_before_residual": False}


def _get(cfg: dict, dotted: str):
    for part in dotted.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def _vllm_ids(cfg: dict) -> tuple[list[int] | None, str]:
    """The ids vLLM 0.32.0 reads from a drafter config and where from, mirroring
    ``v1/worker/gpu_model_runner.py:5251-5285`` (a falsy value counts as absent there)."""
    ids, src = cfg.get("eagle_aux_hidden_state_layer_ids"), "config"
    if not ids:
        dflash, eagle = cfg.get("dflash_config"), cfg.get("eagle_config")
        if dflash and isinstance(dflash, dict):
            ids = [i + 1 for i in (dflash.get("target_layer_ids") or [])]
            src = "config (dflash_config.target_layer_ids + 1)"
        if eagle and isinstance(eagle, dict):
            ids = eagle.get("eagle_aux_hidden_state_layer_ids")
            src = "config (nested eagle_config: no top-level key)"
    if ids and isinstance(ids, (list, tuple)):
        return list(ids), src
    return None, "engine default"


def _id_rule(cfg: dict, engine: str):
    """The id rule ``engine`` applies to this drafter's target: the engine_rules row the export
    recorded (``eagle3nb.target_architecture`` + ``eagle3nb.engine_ids[engine]``), else the
    engine's plain convention (configs without them, refused or unknown classes)."""
    meta = cfg.get("eagle3nb") or {}
    rec = (meta.get("engine_ids") or {}).get(engine) or {}
    if meta.get("target_architecture") and rec.get("rule") and not rec.get("refused"):
        return engine_rule(engine, rec["version"], meta["target_architecture"])
    return get_convention(engine)


def read_as_engine(cfg: dict, engine: str, target_n_layers: int, rule=None) -> dict:
    """What ``engine`` will use from a drafter ``config.json`` dict. Explicit ids are read by
    ``rule`` when given (an :class:`eagle3nb.target.engine_rules.EngineRule` of the engine's version
    and the target's class), else by the rule the export recorded in the config (:func:`_id_rule`),
    else by the engine's generic convention (SGLang 0.5.23 DeepSeek/Kimi, for one, adds +1 only
    when the first id is 1).

    Returns:
        ``{"boundaries": [...], "ids_source": "config"|"engine default"|"config (...)",
        "flags": {...}}`` (vLLM names where it found ids when not the top-level key).

    Raises:
        ValueError: unknown engine, or ids the engine cannot capture.
    """
    if engine not in ENGINE_READS:
        raise ValueError(f"engine={engine!r}: known engines are {sorted(ENGINE_READS)}")
    spec = ENGINE_READS[engine]
    conv = rule or _id_rule(cfg, engine)
    ids, src = _get(cfg, spec["ids_key"]), "config"
    if engine == "vllm":
        ids, src = _vllm_ids(cfg)
    if ids is None:
        b, src = conv.default_boundaries(target_n_layers), "engine default"
    else:
        b = conv.ids_to_boundaries(ids, target_n_layers)
    flags = {k: cfg.get(k, ENGINE_ASSUMES.get(k)) for k in sorted(spec["flags"])}
    return {"boundaries": b, "ids_source": src, "flags": flags}


def rule_readings(
    trained: list[int],
    served: list[int],
    n_layers: int,
    arch: str,
    versions: dict,
    by_rule: bool = True,
) -> dict:
    """What each engine version really captures for the ids eagle3nb exports for ``served``
    boundaries (:func:`eagle3nb.drafter.export.engine_ids`: by the version's rule for the target's
    class, or with ``by_rule=False`` by the engine's generic convention, SGLang boundary - 1 and vLLM
    boundary, as hand-written configs are), read by that version's rule for the class
    (:mod:`eagle3nb.target.engine_rules`), against the ``trained`` boundaries.

    Args:
        versions: ``{engine: installed version}`` (engines not installed are left out).
        by_rule: as the export writes them (``export_layer_ids`` other than ``convention``).

    Returns:
        ``{engine: {"version", "ids", "reads", "matches"}}``, or ``{"version", "error",
        "matches": None}`` where the ids cannot be written or the table refuses or lacks the key.
    """
    from eagle3nb.drafter.export import engine_ids  # export imports this module's neighbours only

    out = {}
    for engine, version in versions.items():
        try:
            ids = engine_ids(engine, list(served), n_layers, arch, version, by_rule)[0]
            reads = engine_rule(engine, version, arch).ids_to_boundaries(ids, n_layers)
        except ValueError as e:
            out[engine] = {"version": version, "error": str(e), "matches": None}
            continue
        out[engine] = {
            "version": version,
            "ids": ids,
            "reads": reads,
            "matches": reads == list(trained),
        }
    return out


def engine_report(
    cfg: dict, trained_boundaries: list[int], target_n_layers: int, trainer_flags: dict
) -> dict:
    """Per engine: the boundaries it will capture, whether they equal the trained ones, and the
    trainer flags it ignores while they differ from what it assumes (the drafter would compute
    another function there).

    Returns:
        ``{engine: {"boundaries", "matches_training", "ignored_flags": [...], "ok"}}``.
    """
    out = {}
    for engine in ENGINE_READS:
        r = read_as_engine(cfg, engine, target_n_layers)
        ignored = [
            k
            for k, v in trainer_flags.items()
            if k not in ENGINE_READS[engine]["flags"]
            and k in ENGINE_ASSUMES
            and v != ENGINE_ASSUMES[k]
        ]
        match = r["boundaries"] == list(trained_boundaries)
        out[engine] = {
            "boundaries": r["boundaries"],
            "ids_source": r["ids_source"],
            "matches_training": match,
            "ignored_flags": ignored,
            "ok": match and not ignored,
        }
    return out


def vllm_serve_drafter(cfg: dict, drafter_path: str, user_spec: dict | None = None) -> dict | None:
    """What vLLM 0.32 serves for ``vllm serve DRAFTER`` (``cfg``: DRAFTER's config.json dict).

    Returns:
        ``{"model": the target it loads, "tokenizer", "speculative_config"}``, or None when the
        config names no target (vLLM then serves the drafter folder as a plain model).

    Raises:
        ValueError: speculators keys present but incomplete (vLLM: "Invalid speculators config
            structure" / "Must provide transformer_layer_config").
    """
    sc = cfg.get("speculators_config")
    if sc is None:
        return None
    try:
        k = sc["proposal_methods"][0]["speculative_tokens"]
        target = sc["verifier"]["name_or_path"]
        method = cfg["speculators_model_type"]
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"invalid speculators config structure ({e!r})") from None
    if not isinstance(cfg.get("transformer_layer_config"), dict):
        raise ValueError("speculators config without a transformer_layer_config dict")
    spec = {"method": method, "num_speculative_tokens": k}
    spec.update(user_spec or {})
    spec.update(method=method, model=str(drafter_path))
    return {"model": target, "tokenizer": target, "speculative_config": spec}
