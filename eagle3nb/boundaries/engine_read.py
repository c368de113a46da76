"""Read an exported drafter config the way each serving engine reads it, and report what it ignores.

An exported flag only matters if the serving engine reads it. These readers mirror what the
engines' EAGLE-3 model files read (``../shared/reference/conventions.md`` section 2):

- SGLang ``srt/models/llama_eagle3.py`` + ``llama.py`` (0.5.x): ids only from its nested key
  (:mod:`eagle3nb.boundaries.config_ids`; id = boundary - 1; absent -> its default
  ``[2, N//2, N-3]`` unshifted), ``draft_vocab_size``, ``target_hidden_size`` (fc input width /
  n_aux). It does not read ``norm_before_residual`` (residual = un-normed hidden).
- vLLM ``model_executor/models/llama_eagle3.py`` (0.3x): ``draft_vocab_size``,
  ``target_hidden_size``, ``norm_before_residual``; ids (id = boundary) as 0.32.0's
  ``_get_eagle3_aux_layers_from_config`` reads them (:func:`eagle3nb.boundaries.config_ids.vllm_ids`);
  none -> ``(2, N//2, N-3)`` (``model_executor/models/interfaces.py:1712-1733``). So a config
  carrying only SGLang's nested ids (boundary - 1) is read by vLLM as boundaries one lower.

- vLLM given the *drafter* as its model (``vllm serve DRAFTER``, 0.32
  ``transformers_utils/config.py`` ``maybe_override_with_speculators``): when config.json has
  ``speculators_config`` it serves ``speculators_config.verifier.name_or_path`` (model and
  tokenizer) with ``{"method": speculators_model_type, "num_speculative_tokens":
  proposal_methods[0].speculative_tokens, "model": DRAFTER}``, user ``--speculative-config`` keys
  applied on top (method and model locked). See :func:`vllm_serve_drafter`. SGLang reads none of
  these keys (0.5.23 has no "speculators" in its source).

Ids are read with the engine version's rule for the drafter's target class when the export recorded
it (``eagle3nb.engine_ids``, :mod:`eagle3nb.boundaries.rules`), else with the engine's plain
convention.

Drafter variants (both engines implement them; the flag lookups are the same in both):
- ``norm_before_fc``: vLLM 0.32.0 ``model_executor/models/llama_eagle3.py:184-188`` and SGLang
  0.5.23 ``srt/models/llama_eagle3.py:173-175`` read ``eagle_config.norm_before_fc``, else the
  top-level ``norm_before_fc``; vLLM's speculators reader (``vllm serve DRAFTER``,
  ``transformers_utils/configs/speculators/algos.py:36``) copies only the top-level key. Export
  writes the top-level key alone; :func:`check_config_flags` refuses a nested one that disagrees.
- ``norm_output`` (EAGLE-3.1): top-level only, vLLM ``llama_eagle3.py:252`` (speculators reader
  ``algos.py:38``), SGLang ``llama_eagle3.py:207``.
- ``fc_norm`` (per-aux RMSNorms ``fc_norm.{i}.weight``, EAGLE-3.1 of the EAGLE authors/SGLang/
  SpecForge): top-level only, vLLM ``llama_eagle3.py:231-240, 411-416`` (speculators reader
  ``algos.py:37``), SGLang ``185-196, 241-246``. SGLang also reads ``use_aux_norm`` as its legacy
  name, vLLM does not: a file setting ``use_aux_norm`` without ``fc_norm`` is refused (the engines
  would serve two functions); SGLang's legacy weight names ``aux_norm_low/mid/high`` are read as
  ``fc_norm.0/1/2`` as SGLang reads them (``337-343``).
- Which engine versions read which variant flag: :mod:`eagle3nb.boundaries.flavours`.
- ``norm_before_residual``: vLLM ``llama_eagle3.py:101-104``; SGLang 0.5.23 does not read it
  (its residual is the un-normed hidden, ``llama_eagle3.py:97-102``). vLLM's speculators reader
  assumes True when the key is absent (``algos.py:33-35``), its plain reader False.

Versions change: when an engine is upgraded, re-read its source and update the table.
"""

from __future__ import annotations

from eagle3nb.boundaries.config_ids import IDS_KEY, IDS_PATH, get_ids, vllm_ids
from eagle3nb.boundaries.conventions import get_convention
from eagle3nb.boundaries.rules import EngineRule, engine_rule

__all__ = [
    "ENGINE_READS",
    "read_as_engine",
    "engine_report",
    "rule_readings",
    "vllm_serve_drafter",
    "check_config_flags",
    "refused_engines",
    "trainer_flags",
    "IMPLEMENTED_FLAGS",
    "UNIMPLEMENTED_FLAGS",
]

# flag -> engines that read it (flags the trainer sets that change the computed function)
ENGINE_READS = {
    "sglang": {
        "ids_key": IDS_PATH["sglang"],
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
            "norm_before_fc",
            "norm_output",
            "fc_norm",
        },
    },
    "vllm": {
        "ids_key": IDS_PATH["vllm"],
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
            "norm_before_fc",
            "norm_output",
            "fc_norm",
        },
    },
}
# Behavioural flags eagle3nb's drafter implements (trained with, honoured by the simulator).
IMPLEMENTED_FLAGS = ("norm_before_residual", "norm_before_fc", "norm_output", "fc_norm")
# value an engine assumes for a flag it does not read (or when the key is absent)
ENGINE_ASSUMES = dict.fromkeys(IMPLEMENTED_FLAGS, False)
# Flags the engines act on that eagle3nb does not implement -> the value under which they change
# nothing (vLLM 0.32.0 / SGLang 0.5.23 model_executor|srt/models/llama_eagle3.py lines):
UNIMPLEMENTED_FLAGS = {
    "bias": False,  # bias on fc: SGLang 166
    "attention_bias": False,  # q/k/v bias: vLLM 85; SGLang through llama.py:339
    "qkv_bias": False,  # vLLM llama.py:268-274, SGLang llama.py:339-341
    "mlp_bias": False,  # vLLM llama.py:305
    "logit_scale": 1.0,  # vLLM 328 (logits scaled)
    "parallel_drafting": False,  # vLLM parallel drafting (mask_hidden)
    "num_hidden_layers": 1,  # several decoder layers: vLLM 198-208, SGLang 198-204
    "hidden_act": "silu",
    "rope_scaling": None,
    "rope_parameters": None,
    "tie_word_embeddings": False,  # lm_head = embedding (SGLang 303-304)
    "num_aux_hidden_states": None,  # checked against the aux count below
}
# Keys that change nothing the drafter computes, or that load_drafter reads and checks itself.
_READ_OR_INERT = {
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
    "vocab_size", "draft_vocab_size", "target_hidden_size", "bos_token_id", "eos_token_id",
    "pad_token_id", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
    "initializer_range", "use_cache", "attention_dropout", "pretraining_tp", "eagle_config",
    IDS_KEY, "eagle3nb", "speculators_model_type",
    "speculators_config", "transformer_layer_config", "speculators_version",
    "use_aux_norm",  # SGLang's legacy fc_norm (185-187): checked against fc_norm below
}  # fmt: skip
_EAGLE_CONFIG_KEYS = {IDS_KEY, "use_aux_hidden_state", "norm_before_fc"}


def _id_rule(cfg: dict, engine: str):
    """The id rule ``engine`` applies to this drafter's target: the engine_rules row the export
    recorded (``eagle3nb.target_architecture`` + ``eagle3nb.engine_ids[engine]``), else the
    engine's plain convention (configs without them, refused or unknown classes)."""
    meta = cfg.get("eagle3nb") or {}
    rec = (meta.get("engine_ids") or {}).get(engine) or {}
    if meta.get("target_architecture") and rec.get("rule") and not rec.get("refused"):
        if rec.get("rule_record"):  # a measured rule, carried by the config itself
            return EngineRule.from_record(rec["rule_record"])
        return engine_rule(engine, rec["version"], meta["target_architecture"])
    return get_convention(engine)


def _constant_plus1(conv) -> bool:
    """Whether ``conv`` maps every id to id + 1 (SGLang's Llama/Qwen rule), not a rule whose shift
    depends on the ids (SGLang DeepSeek's first-id-1, gpt-oss's unless-N)."""
    kind = getattr(conv, "kind", None)
    return kind == "plus1" if kind is not None else getattr(conv, "offset", 0) == 1


def _served_boundaries(conv, ids: list[int], n_layers: int, engine: str) -> list[int]:
    """Boundaries ``engine`` feeds a drafter served with ``ids``. SGLang 0.5.23 serves id -1 as
    boundary 0 where its model file adds 1 to every id (``srt/models/llama.py:929-941``
    ``[val + 1 for val in layer_ids]``; layer index 0 captures the embeddings); only its
    capture-only mode refuses negative ids (``arg_groups/validation_hook.py``), so reading a served
    config, -1 is boundary 0 there. Every other id goes through ``conv`` unchanged."""
    if engine == "sglang" and ids and min(ids) == -1 and _constant_plus1(conv):
        rest = [i for i in ids if i != -1]
        return [0] * (len(ids) - len(rest)) + (
            conv.ids_to_boundaries(rest, n_layers) if rest else []
        )
    return conv.ids_to_boundaries(ids, n_layers)


def ids_key_text(spec: dict, ids: list) -> str:
    """``key=ids`` for a message (the ids as written, strings included)."""
    return f"{spec['ids_key']}={ids}"


def read_as_engine(cfg: dict, engine: str, target_n_layers: int, rule=None) -> dict:
    """What ``engine`` will use from a drafter ``config.json`` dict. Explicit ids are read by
    ``rule`` when given (an :class:`eagle3nb.boundaries.rules.EngineRule` of the engine's version
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
    ids, src = get_ids(cfg, engine), "config"
    if engine == "vllm":
        ids, src = vllm_ids(cfg)
    if ids is None:
        b, src = conv.default_boundaries(target_n_layers), "engine default"
    elif any(isinstance(i, str) for i in ids):  # the audit's mark on an engine it refused
        raise ValueError(f"{engine} cannot serve this config: {ids_key_text(spec, ids)}")
    else:
        b = _served_boundaries(conv, [int(i) for i in ids], target_n_layers, engine)
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
    (:mod:`eagle3nb.boundaries.rules`), against the ``trained`` boundaries.

    Args:
        versions: ``{engine: installed version}`` (engines not installed are left out).
        by_rule: as the export writes them (``export_layer_ids`` other than ``convention``).

    Returns:
        ``{engine: {"version", "ids", "reads", "matches"}}``, or ``{"version", "error",
        "matches": None}`` where the ids cannot be written or the table refuses or lacks the key.
    """
    from eagle3nb.boundaries.export_ids import engine_ids

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
        ``{engine: {"boundaries", "matches_training", "ignored_flags": [...], "ok"}}``, plus
        ``"refused"`` (why) for an engine the export refused (:func:`refused_engines`): its
        ``boundaries`` are None where its ids key holds the refusal mark (it stops on it,
        :mod:`eagle3nb.boundaries.refusal`), else what it would use from that file (a class it
        refuses: the convention ids), ``ok`` False.
    """
    out = {}
    refused = refused_engines(cfg)
    for engine in ENGINE_READS:
        try:
            r = read_as_engine(cfg, engine, target_n_layers)
        except ValueError:  # the audit's mark on a refused engine's ids (it cannot load them)
            if engine not in refused:
                raise
            r = {"boundaries": None, "ids_source": "refused"}
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
            "ok": match and not ignored and engine not in refused,
        }
        if engine in refused:
            out[engine]["refused"] = refused[engine]
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


def check_config_flags(cfg: dict, where: str, n_aux: int) -> dict:
    """The variant flags a drafter ``config.json`` asks the engines for, refusing any this
    drafter does not implement (rather than loading it as another function than they serve).

    Args:
        cfg: the config.json dict; where: the file, for messages; n_aux: aux states the file's
            fc takes (its width / target_hidden_size).

    Returns:
        ``{"norm_before_residual", "norm_before_fc", "norm_output", "fc_norm"}`` as the engines
        resolve them
        (``norm_before_fc``: nested ``eagle_config`` first, as both engines do).

    Raises:
        ValueError: naming the key, its value and ``where``: a flag of :data:`UNIMPLEMENTED_FLAGS`
            set to a value that changes the function; a key neither implemented, read nor known to
            be inert; ``eagle_config.use_aux_hidden_state`` false; a nested ``norm_before_fc``
            that disagrees with the top-level one (vLLM's speculators reader takes the top-level,
            its plain reader and SGLang the nested); ``norm_before_residual`` absent from a
            speculators-format file (vLLM assumes True there, False elsewhere); ``use_aux_norm``
            set without ``fc_norm`` (SGLang reads it, vLLM does not).
    """
    for key, value in cfg.items():
        if key in UNIMPLEMENTED_FLAGS:
            ok = UNIMPLEMENTED_FLAGS[key]
            if key == "num_aux_hidden_states":
                ok = n_aux
            if value != ok and not (value is None and ok in (False, None)):
                raise ValueError(
                    f"{where}: {key}={value!r} asks the engines for a drafter variant eagle3nb does "
                    f"not implement (implemented flags: {list(IMPLEMENTED_FLAGS)}); its simulator "
                    f"and training would compute another function than the engines serve. Use a "
                    f"drafter without it ({key}={ok!r})"
                )
        elif key not in _READ_OR_INERT and key not in IMPLEMENTED_FLAGS:
            raise ValueError(
                f"{where}: unknown config key {key!r} (value {value!r}); eagle3nb does not know "
                f"whether an engine changes the drafter's function for it. Known flags: "
                f"implemented {list(IMPLEMENTED_FLAGS)}, refused when set "
                f"{sorted(UNIMPLEMENTED_FLAGS)}; remove the key if it is metadata"
            )
    ec = cfg.get("eagle_config") or {}
    for key in ec:
        if key not in _EAGLE_CONFIG_KEYS:
            raise ValueError(
                f"{where}: unknown key eagle_config.{key} (value {ec[key]!r}); known nested keys: "
                f"{sorted(_EAGLE_CONFIG_KEYS)}"
            )
    if ec.get("use_aux_hidden_state", True) is not True:
        raise ValueError(
            f"{where}: eagle_config.use_aux_hidden_state={ec['use_aux_hidden_state']!r}: a drafter "
            "without aux states (EAGLE-1/2 style) is not implemented; EAGLE-3 drafters set it true"
        )
    top = bool(cfg.get("norm_before_fc", False))
    if "norm_before_fc" in ec and bool(ec["norm_before_fc"]) != top:
        raise ValueError(
            f"{where}: eagle_config.norm_before_fc={ec['norm_before_fc']!r} but top-level "
            f"norm_before_fc={cfg.get('norm_before_fc')!r}: vLLM's speculators reader takes the "
            "top-level key, its plain reader and SGLang the nested one; make them agree"
        )
    if "speculators_model_type" in cfg and "norm_before_residual" not in cfg:
        raise ValueError(
            f"{where}: speculators-format config without norm_before_residual: vLLM's speculators "
            "reader assumes true (speculators/algos.py:33-35), its plain reader false; write it"
        )
    if cfg.get("use_aux_norm") and not cfg.get("fc_norm"):
        raise ValueError(
            f"{where}: use_aux_norm={cfg['use_aux_norm']!r} without fc_norm: SGLang reads it as "
            "fc_norm (llama_eagle3.py:185-187), vLLM does not (llama_eagle3.py:231), so the two "
            "engines would serve different drafters; write fc_norm: true (the key both read)"
        )
    return {
        "norm_before_residual": bool(cfg.get("norm_before_residual", False)),
        "norm_before_fc": bool(ec.get("norm_before_fc", top)),
        "norm_output": bool(cfg.get("norm_output", False)),
        "fc_norm": bool(cfg.get("fc_norm", False)),
    }


def refused_engines(cfg: dict) -> dict:
    """``{engine: why}`` for the engines an export refused (``eagle3nb.refused_engines`` in
    config.json, e.g. SGLang for boundary N on a class whose SGLang rule cannot capture it)."""
    return dict((cfg.get("eagle3nb") or {}).get("refused_engines") or {})


def trainer_flags(drafter_config) -> dict:
    """``{flag: value}`` of the :data:`IMPLEMENTED_FLAGS` a drafter was trained with (its
    :class:`eagle3nb.drafter.model.DrafterConfig`), for :func:`engine_report`."""
    return {k: bool(getattr(drafter_config, k)) for k in IMPLEMENTED_FLAGS}
