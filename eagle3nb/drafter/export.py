"""Export a trained drafter to a folder SGLang and vLLM load, and load it back (refusing broken ones).

Config keys (``../shared/reference/conventions.md`` section 2):
- ``architectures: ["LlamaForCausalLMEagle3"]``: SGLang's ``srt/models/llama_eagle3.py`` class name;
  vLLM's model registry maps the same name to its ``Eagle3LlamaForCausalLM``.
- ids for each engine in its own convention, so both capture the boundaries the drafter was trained
  on: SGLang reads only nested ``eagle_config.eagle_aux_hidden_state_layer_ids`` (id = boundary - 1);
  vLLM reads top-level ``eagle_aux_hidden_state_layer_ids`` (id = boundary).
- ``draft_vocab_size``, ``target_hidden_size``, ``num_aux_hidden_states`` (both engines read it
  before counting the nested ids: vLLM ``llama_eagle3.py:210-216``, SGLang ``157-161``),
  ``tie_word_embeddings: false`` when the vocab is reduced, ``norm_before_residual``, and the
  variants ``norm_before_fc`` / ``fc_norm`` / ``norm_output`` at the top level, each written true or
  false (every reader finds them there, :mod:`eagle3nb.boundaries.engine_read`; the EAGLE-3.1 flavour
  is then unambiguous to each: ``fc_norm`` for the EAGLE authors'/SGLang's, ``norm_before_fc`` for
  speculators'), its name under ``eagle3nb.flavour`` (:func:`eagle3nb.drafter.model.flavour_of`).
  An engine version that does not read a flag the drafter sets (or whose reading is not in
  :data:`eagle3nb.boundaries.flavours.FLAG_READS`) is refused by name as below.
- per engine, ids from that engine's rule for the target's class (:mod:`eagle3nb.boundaries.rules`;
  without a class, the generic convention). An engine that cannot capture the served boundaries
  (SGLang on Llama-like classes for boundary N: its final norm captures nothing) is refused by name:
  its ids key holds eagle3nb's refusal mark instead (:func:`eagle3nb.boundaries.refusal.
  refuse_engine`, as the audit's corrected copy: the engine stops on it when it loads, where
  without ids it would serve its default ids), the reason is written to
  ``eagle3nb.refused_engines`` and the set to retrain at to ``eagle3nb.retrain``
  (:func:`eagle3nb.boundaries.refusal.retrain_set`), and the export for the other engine goes on.
  It fails only when every engine is refused.
- the target, named as vLLM reads it from speculators-format checkpoints: ``speculators_model_type:
  "eagle3"``, ``speculators_config.verifier.name_or_path`` (the target folder) and
  ``proposal_methods[0].speculative_tokens`` (k), plus the ``transformer_layer_config`` vLLM's
  validator asks for. vLLM 0.32 (``transformers_utils/config.py`` ``maybe_override_with_speculators``,
  called by ``EngineArgs.create_engine_config``) reads them only when the *model* it is given is the
  drafter (``vllm serve DRAFTER``): it then serves the verifier with this drafter. Given the target
  with an explicit ``speculative_config`` it ignores them (the draft config is still parsed as
  ``model_type: llama``), and SGLang never reads them (tested: ``tests/engines``).
Ids per engine follow that engine version's rule for the target's class
(:func:`eagle3nb.boundaries.rules.engine_rule`: e.g. SGLang 0.5.23 gpt-oss reads ids that include
N unshifted), recorded with version, rule and source under ``eagle3nb.engine_ids``; a class the
table lacks, or refuses for that engine, gets the engine's plain convention (recorded as such).

Weights (``model.safetensors``): ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``,
``d2t`` (int64 offsets), ``t2d`` (bool), ``input_norm.weight`` with ``norm_before_fc`` and
``fc_norm.{i}.weight`` with ``fc_norm`` (the names both engines load). The embedding is omitted: both engines share the target's.
A full draft vocabulary (``draft_vocab_size == vocab_size``, d2t all zeros) is written **without**
``d2t``/``t2d``: vLLM 0.32 creates ``draft_id_to_target_id`` only when the sizes differ
(``model_executor/models/llama_eagle3.py:338-344``, else None), and its loader maps a stored ``d2t``
to that parameter (``llama_eagle3.py:428-430``), so a full-size ``d2t`` fails the load ("There is no
module or parameter named 'draft_id_to_target_id'"); SGLang without ``d2t`` keeps
``hot_token_id`` None (``srt/models/llama_eagle3.py:323, 350-356``), i.e. the identity.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eagle3nb.boundaries.conventions import check_boundaries
from eagle3nb.boundaries.config_ids import get_ids, set_ids
from eagle3nb.boundaries.rules import known_versions
from eagle3nb.boundaries.export_ids import engine_ids
from eagle3nb.boundaries.engine_read import check_config_flags, trainer_flags
from eagle3nb.boundaries.flavours import flag_refusals
from eagle3nb.boundaries.refusal import refuse_engine, retrain_set
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter, flavour_of
from eagle3nb.drafter import mla
from eagle3nb.manifest import atomic_write_json, publish_permissions
from eagle3nb.drafter.vocab import check_draft_vocab

__all__ = [
    "export_drafter",
    "load_drafter",
    "REQUIRED_TENSORS",
    "VOCAB_TENSORS",
    "engine_ids",
    "drafter_config_json",
    "speculators_keys",
]

ARCH = "LlamaForCausalLMEagle3"
VOCAB_TENSORS = ("d2t", "t2d")  # absent exactly when the draft vocab is the full vocab
REQUIRED_TENSORS = ["fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"] + [
    f"midlayer.{n}.weight"
    for n in [
        "input_layernorm",
        "hidden_norm",
        "post_attention_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]
]


def drafter_config_json(
    c: DrafterConfig,
    aux_boundaries: list[int],
    target_n_layers: int,
    bos: int | None,
    eos: int | None,
    serve_boundaries: list[int] | None = None,
    verifier: dict | None = None,
    num_speculative_tokens: int = 5,
    target_arch: str | None = None,
    engine_versions: dict | None = None,
    by_rule: bool = True,
    tau_table: tuple[list[dict], str] | None = None,
) -> dict:
    """The config.json for both engines (ids in each engine's rule for ``target_arch``, see
    :func:`engine_ids`; ``engine_versions`` ``{engine: version}`` names the versions, None or a
    missing engine = the newest the table holds; ``by_rule=False``: generic conventions, see
    :func:`engine_ids`). An engine that cannot capture the serve boundaries (e.g. SGLang boundary N
    on Llama-like classes) or lacks a flag the drafter sets is refused: its ids key holds the
    refusal mark (:func:`eagle3nb.boundaries.refusal.refuse_engine`), the reason is named in
    ``eagle3nb.refused_engines`` and, for boundaries it cannot capture, the set to retrain at in
    ``eagle3nb.retrain`` (:func:`eagle3nb.boundaries.refusal.retrain_set`: the best it captures in
    ``tau_table`` ``(rows {"boundaries", "tau"} best first, where they come from)``, else the set
    nearest to the serve boundaries). A class the engine refuses keeps its convention ids, named.

    ``verifier``: the target (``{"name_or_path", "architectures"}``), written in the speculators
    form vLLM reads for ``vllm serve DRAFTER`` (module docstring) with ``num_speculative_tokens``;
    None writes no speculators keys.

    ``serve_boundaries`` (default: ``aux_boundaries``) are the boundaries the written ids make the
    engines capture. Only the mismatch reproduction (``export_layer_ids: engine_default``) sets them
    apart from the trained ``aux_boundaries``, which stay recorded under ``eagle3nb``.
    """
    b = check_boundaries(aux_boundaries, target_n_layers, "aux_boundaries")
    sb = (
        b
        if serve_boundaries is None
        else check_boundaries(serve_boundaries, target_n_layers, "serve_boundaries")
    )
    vers = engine_versions or {}
    n, arch = target_n_layers, target_arch
    ids, recs, refused, retrain = {}, {}, {}, {}
    rows, table = tau_table or ([], None)
    for engine in ("sglang", "vllm"):
        v = vers.get(engine) or known_versions(engine)[-1]
        try:
            ids[engine], recs[engine] = engine_ids(engine, sb, n, arch, v, by_rule)
        except ValueError as e:  # this engine cannot capture them: refused by name, not the export
            refused[engine] = f"{engine} {v} refused: {e}"
            retrain[engine] = retrain_set(sb, engine, v, arch, n, rows, table)
            continue
        if recs[engine].get("refused"):  # a refused class: ids by convention, for the record only
            refused[engine] = f"{engine} {v} refused for {arch}: {recs[engine]['refused']}"
        lacks = flag_refusals(trainer_flags(c), {engine: v}).get(engine)
        if lacks:  # it would serve the drafter without a flag: no ids for it, named
            refused[engine] = f"{engine} {v} refused: {lacks}"
            ids.pop(engine)
            recs.pop(engine)
    if not ids:
        raise ValueError(
            f"serve boundaries {sb}: no engine can capture them or serve this drafter "
            f"({'; '.join(refused.values())})"
        )
    cfg = {
        "architectures": [ARCH],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        "tie_word_embeddings": False,
        "num_aux_hidden_states": c.n_aux,
        "norm_before_residual": c.norm_before_residual,
        "norm_before_fc": c.norm_before_fc,
        "norm_output": c.norm_output,
        "fc_norm": c.fc_norm,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
        "eagle_config": {"use_aux_hidden_state": True},
        "eagle3nb": {
            "aux_boundaries": b,
            "target_num_hidden_layers": target_n_layers,
            "n_aux": c.n_aux,
            "target_architecture": target_arch,
            "flavour": flavour_of(c),
            "engine_ids": {e: {"ids": ids[e], **recs[e]} for e in ids},
        },
    }
    if isinstance(c, mla.MLAConfig):  # both engines' MLA drafter class (drafter/mla.py)
        cfg.update(mla.mla_config_json(c))
        verifier = None  # vLLM's speculators reader would build a Llama layer from them
    for engine in ("sglang", "vllm"):
        if engine in ids:  # a class the engine refuses: convention ids, it stops on the class
            set_ids(cfg, engine, ids[engine])
            if engine in refused:
                cfg["eagle3nb"].setdefault("refused_engines", {})[engine] = refused[engine]
        elif engine in refused:  # marked: it cannot serve its default ids instead (issue 43)
            refuse_engine(cfg, engine, refused[engine], c.n_aux, retrain.get(engine))
    if verifier is not None:
        cfg.update(speculators_keys(cfg, verifier, num_speculative_tokens))
    return cfg


def speculators_keys(cfg: dict, verifier: dict, num_speculative_tokens: int) -> dict:
    """The speculators-format keys naming the target (vLLM's ``SpeculatorsConfig`` validator needs
    ``speculators_model_type``, ``speculators_config.proposal_methods[0].speculative_tokens``,
    ``speculators_config.verifier.name_or_path`` and a ``transformer_layer_config`` dict)."""
    layer_keys = [
        "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
        "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
        "rope_theta", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
        "num_aux_hidden_states",
    ]  # fmt: skip
    return {
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": int(num_speculative_tokens)}
            ],
            "verifier": {
                "name_or_path": str(verifier["name_or_path"]),
                "architectures": list(verifier.get("architectures") or []),
            },
        },
        "transformer_layer_config": {key: cfg[key] for key in layer_keys},
    }


def export_drafter(
    drafter: Eagle3Drafter,
    out_dir: str | os.PathLike,
    aux_boundaries: list[int],
    target_n_layers: int,
    manifest: dict,
    bos: int | None = None,
    eos: int | None = None,
    serve_boundaries: list[int] | None = None,
    num_speculative_tokens: int = 5,
    engine_versions: dict | None = None,
    by_rule: bool = True,
    tau_table: tuple[list[dict], str] | None = None,
) -> Path:
    """Write ``config.json``, ``model.safetensors`` and ``manifest.json`` into ``out_dir``.

    Each engine's ids follow its rule for the target's class ``manifest["target"]["architecture"]``
    at ``engine_versions`` (see :func:`drafter_config_json`; ``by_rule=False``: each engine's generic
    convention). A full draft vocabulary is written
    without ``d2t``/``t2d`` (module docstring).

    Raises:
        ValueError: boundaries an engine's rule cannot name; a full-size draft vocab whose d2t is
            not the identity (no engine could load it).

    ``serve_boundaries``, ``tau_table``: see :func:`drafter_config_json` (None = the trained
    boundaries; no table). An engine refused is named in ``manifest.json["refused_engines"]``
    (``{engine: {"why", "retrain"}}``) as in config.json. The
    target named in config.json (speculators form) is ``manifest["target"]["path"]`` when the
    manifest has one, with ``num_speculative_tokens`` as its default k; each engine's ids follow
    its rule for ``manifest["target"]["architecture"]`` (:func:`engine_ids`).

    Raises:
        ValueError: a boundary out of 0..N, or boundaries no engine can capture (an engine that
            cannot while the other can is named in ``config.json["eagle3nb"]["refused_engines"]``
            instead).

    The folder is built in a temp folder and renamed into place, so a crash never leaves a
    half-written drafter. Returns the folder path.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
    try:
        sd = {
            k: v.detach().cpu().contiguous()
            for k, v in drafter.state_dict().items()
            if not k.startswith("embed_tokens")
        }
        if drafter.config.draft_vocab_size == drafter.config.vocab_size:
            if bool(sd["d2t"].any()):
                raise ValueError(
                    f"draft_vocab_size={drafter.config.draft_vocab_size} is the full vocab but d2t "
                    "is not all zeros (a permutation no engine loads at full size); rebuild it with "
                    "build_draft_vocab"
                )
            for k in VOCAB_TENSORS:
                del sd[k]
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        t = manifest.get("target") or {}
        verifier = (
            {"name_or_path": t["path"], "architectures": [t["architecture"]]}
            if t.get("path")
            else None
        )
        cfg = drafter_config_json(
            drafter.config,
            aux_boundaries,
            target_n_layers,
            bos,
            eos,
            serve_boundaries,
            verifier,
            num_speculative_tokens,
            t.get("architecture"),
            engine_versions,
            by_rule,
            tau_table,
        )
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        meta = cfg["eagle3nb"]
        if meta.get("refused_engines"):
            manifest = dict(manifest, refused_engines={
                e: {"why": why, "retrain": (meta.get("retrain") or {}).get(e)}
                for e, why in meta["refused_engines"].items()
            })  # fmt: skip
        atomic_write_json(tmp / "manifest.json", manifest)
        for f in tmp.iterdir():
            publish_permissions(f)
        publish_permissions(tmp, directory=True)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_drafter(
    path: str | os.PathLike, target_embed: torch.Tensor | None = None
) -> tuple[Eagle3Drafter, dict]:
    """Load an exported drafter.

    Args:
        target_embed: ``[vocab, H]`` the target's embedding (exports omit it).

    Returns:
        ``(drafter, config_json)``.

    Raises:
        ValueError: a required tensor is missing (named; ``input_norm.weight`` when
            ``norm_before_fc`` is set, ``fc_norm.{i}.weight`` with ``fc_norm``: SGLang's legacy
            ``aux_norm_low/mid/high`` names are read as SGLang reads them), a shape contradicts the config (e.g. fc width vs n_aux x
            target_hidden_size, lm_head rows vs draft_vocab_size), ``d2t``/``t2d`` are not
            consistent offsets (absolute ids, targets out of range), or config.json sets a flag
            this drafter does not implement or a key it does not know
            (:func:`eagle3nb.boundaries.engine_read.check_config_flags`: the key and file named);
            the message names the folder.
    """
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    is_mla = mla.MLA_ARCH in cfg.get("architectures", [])
    if ARCH not in cfg.get("architectures", []) and not is_mla:
        raise ValueError(
            f"{path}/config.json architectures={cfg.get('architectures')}; expected {ARCH!r} "
            f"or {mla.MLA_ARCH!r} (the MLA head)"
        )
    n_aux = (
        cfg.get("num_aux_hidden_states")
        or cfg.get("eagle3nb", {}).get("n_aux")
        or len(
            get_ids(cfg, "vllm")
            or get_ids(cfg, "sglang")
            or [0, 0, 0]  # both engines' default count (vLLM llama_eagle3.py:216, SGLang 161)
        )
    )
    plain = {k: v for k, v in cfg.items() if not (is_mla and k in mla.MLA_READ)}
    flags = check_config_flags(plain, f"{path}/config.json", n_aux)
    sd = load_file(str(path / "model.safetensors"))
    sd = mla.our_names(sd) if is_mla else sd  # SGLang's checkpoints may say layers.0.
    for i, old in enumerate(("aux_norm_low", "aux_norm_mid", "aux_norm_high")[:n_aux]):
        if f"{old}.weight" in sd:  # SGLang's legacy names (llama_eagle3.py:337-343)
            sd[f"fc_norm.{i}.weight"] = sd.pop(f"{old}.weight")
    full = cfg.get("draft_vocab_size", cfg["vocab_size"]) == cfg["vocab_size"]
    if full and not any(k in sd for k in VOCAB_TENSORS):  # full vocab: identity (module docstring)
        sd["d2t"] = torch.zeros(cfg["vocab_size"], dtype=torch.long)
        sd["t2d"] = torch.ones(cfg["vocab_size"], dtype=torch.bool)
    need = mla.MLA_REQUIRED_TENSORS if is_mla else REQUIRED_TENSORS
    need = need + (["input_norm.weight"] if flags["norm_before_fc"] else [])
    need += [f"fc_norm.{i}.weight" for i in range(n_aux)] if flags["fc_norm"] else []
    missing = [k for k in need if k not in sd]
    if missing:
        raise ValueError(
            f"drafter {path} lacks required tensors {missing}; re-export it (an engine would silently use random weights or an identity vocab)"
        )
    c = DrafterConfig(
        hidden_size=cfg["hidden_size"],
        target_hidden_size=cfg.get("target_hidden_size", cfg["hidden_size"]),
        intermediate_size=cfg["intermediate_size"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg.get("head_dim") or cfg["qk_rope_head_dim"],
        vocab_size=cfg["vocab_size"],
        draft_vocab_size=cfg.get("draft_vocab_size", cfg["vocab_size"]),
        n_aux=n_aux,
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"],
        max_position_embeddings=cfg["max_position_embeddings"],
        **flags,
    )
    c = mla.mla_config_from_json(cfg, c) if is_mla else c
    d = mla.make_drafter(c, target_embed)
    expect = {
        k: tuple(v.shape) for k, v in d.state_dict().items() if not k.startswith("embed_tokens")
    }
    why = {
        "fc.weight": f"fc input width must be n_aux x target_hidden_size = {c.n_aux} x {c.target_hidden_size}",
        "lm_head.weight": f"lm_head rows must equal draft_vocab_size={c.draft_vocab_size}",
        "d2t": f"d2t length must equal draft_vocab_size={c.draft_vocab_size}",
        "t2d": f"t2d length must equal vocab_size={c.vocab_size}",
    }
    bad = [
        f"{k}: file {tuple(sd[k].shape)} vs config {s}" + (f" ({why[k]})" if k in why else "")
        for k, s in expect.items()
        if k in sd and tuple(sd[k].shape) != s
    ]
    bad += [
        f"{k}: in the file but not a weight of this drafter (no flag in config.json uses it)"
        for k in sd
        if k not in expect and not k.startswith("embed_tokens")
    ]
    if bad:
        raise ValueError(
            f"drafter {path}: model.safetensors contradicts config.json ({'; '.join(bad)}); re-export the "
            "drafter, or correct config.json to the shapes it was trained with"
        )
    try:
        check_draft_vocab(sd["d2t"], sd["t2d"])
    except ValueError as e:
        raise ValueError(f"drafter {path}/model.safetensors: {e}") from None
    d.load_state_dict(sd, strict=False)
    return d.eval(), cfg
