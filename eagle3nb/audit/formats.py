"""A drafter folder as engines and peers write it, read into one form, and refused when it cannot
belong to the target.

Formats (told apart by the keys of ``config.json``, first match wins):

- ``eagle3nb``: eagle3nb's export (:func:`eagle3nb.drafter.export.export_drafter`): an ``eagle3nb``
  block recording the trained ``aux_boundaries``; both engines' ids written.
- ``speculators``: RedHat speculators' ``speculators_model_type`` / ``speculators_config`` /
  ``transformer_layer_config`` (architectures ``Eagle3Speculator``; the drafter's widths nested in
  ``transformer_layer_config``; ids at the top level, as vLLM 0.32
  ``transformers_utils/configs/speculators/algos.py:update_eagle3`` copies them; decoder weights
  ``layers.0.*``, which vLLM's ``llama_eagle3.py`` load_weights maps to ``midlayer.*``).
- ``sglang``: SpecForge / SGLang ``LlamaForCausalLMEagle3`` with only the nested
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang ids, read by SGLang's rule for the
  target's class: boundary - 1 on Llama, unshifted on DeepSeek unless the first id is 1).
- ``vllm``: the top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM ids = boundaries).
- ``none``: no ids at all (each engine then feeds its default boundaries 2, N//2, N-3).

Each format may hold either head (``DrafterFolder.head``, told by ``architectures``): ``llama``
(GQA attention) or ``mla``, the multi-head latent attention drafter of DeepSeek-V3 / Kimi-K2
targets (:data:`eagle3nb.drafter.mla.MLA_ARCH`, both engines' ``Eagle3DeepseekV2ForCausalLM``;
:mod:`eagle3nb.drafter.mla`): its keys (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``, ``rope_scaling``, ``rope_interleave``) are kept, its
``layers.0.*`` weights (SGLang's checkpoint names) read as ``midlayer.*``; its ranks may differ
from the target's (the engines size the drafter from its own config). speculators has no MLA form (its Eagle-3 layers are Llama and Qwen3 only,
``src/speculators/models/eagle3/model_definitions.py``; vLLM 0.32's speculators reader refuses
other model types, ``transformers_utils/configs/speculators/algos.py:39-45``): such a folder is
refused by name.

:func:`read_drafter_folder` returns what the folder declares; :func:`check_belongs` refuses a
drafter for another target before any work; :func:`loadable_copy` writes the folder in the form
:func:`eagle3nb.drafter.export.load_drafter` reads (the original is never touched).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3nb.audit.servable import full_vocab_without_d2t, weights_fix
from eagle3nb.drafter import mla
from eagle3nb.boundaries.config_ids import IDS_PATH, get_ids
from eagle3nb.boundaries.conventions import get_convention
from eagle3nb.boundaries.engine_read import check_config_flags
from eagle3nb.drafter.export import ARCH
from eagle3nb.drafter.model import DrafterConfig
from eagle3nb.boundaries.rules import engine_rule, known_versions

__all__ = ["FORMATS", "DrafterFolder", "read_drafter_folder", "check_belongs", "loadable_copy"]

FORMATS = ("eagle3nb", "speculators", "sglang", "vllm", "none")
HEADS = ("llama", "mla")
SPECULATORS_ARCH = "Eagle3Speculator"
# widths speculators nests in transformer_layer_config (vLLM's speculators reader hoists them)
_LAYER_KEYS = (
    "model_type", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
    "vocab_size", "tie_word_embeddings", "hidden_act", "num_hidden_layers", "num_aux_hidden_states",
)  # fmt: skip


@dataclass
class DrafterFolder:
    """A drafter folder read: ``format`` (one of :data:`FORMATS`), ``config`` (its config.json as
    written), ``plain`` (the same config in eagle3nb's form: widths at the top level, architecture
    :data:`eagle3nb.drafter.export.ARCH`, or :data:`eagle3nb.drafter.mla.MLA_ARCH` for an MLA
    drafter), ``declared`` (the boundaries the folder says it was trained on, or None when it names
    no ids), ``declared_how`` (which key and reading), ``head`` (one of :data:`HEADS`)."""

    path: Path
    format: str
    config: dict
    plain: dict
    declared: list[int] | None
    declared_how: str
    notes: list[str] = field(default_factory=list)
    head: str = "llama"


def _detect(cfg: dict) -> str:
    if isinstance(cfg.get("eagle3nb"), dict) and cfg["eagle3nb"].get("aux_boundaries"):
        return "eagle3nb"
    if "speculators_config" in cfg or SPECULATORS_ARCH in (cfg.get("architectures") or []):
        return "speculators"
    if get_ids(cfg, "vllm"):
        return "vllm"
    if get_ids(cfg, "sglang"):
        return "sglang"
    return "none"


def _plain(cfg: dict, fmt: str, head: str) -> dict:
    """``cfg`` with the speculators widths hoisted and eagle3nb's architecture for ``head`` (a
    copy; an MLA config keeps its MLA keys, and head_dim is the rope width as its export writes)."""
    out = json.loads(json.dumps(cfg))
    if fmt == "speculators":
        for k, v in (cfg.get("transformer_layer_config") or {}).items():
            if k in _LAYER_KEYS:
                out.setdefault(k, v)
        out.pop("speculators_version", None)
    out["architectures"] = [mla.MLA_ARCH if head == "mla" else ARCH]
    if head == "mla" and "qk_rope_head_dim" in out:
        out.setdefault("head_dim", out["qk_rope_head_dim"])  # mla.mla_config_json
    if "head_dim" not in out and "hidden_size" in out and "num_attention_heads" in out:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    out.setdefault("rope_theta", 10000.0)  # both engines' llama default
    out.setdefault("max_position_embeddings", 2048)  # rope table length: no effect on outputs
    out.setdefault("num_key_value_heads", out.get("num_attention_heads"))
    return out


def read_drafter_folder(
    path: str | os.PathLike, n_layers: int, arch: str | None = None
) -> DrafterFolder:
    """Read ``path``/config.json in any of :data:`FORMATS` for a target of ``n_layers`` layers
    whose class is ``arch`` (the HF class, :func:`eagle3nb.target.models.target_arch`).

    The declared boundaries: ``eagle3nb.aux_boundaries`` (eagle3nb), the top-level ids read as vLLM
    ids (vllm, speculators: vLLM's reader, ``gpu_model_runner.py`` ``_get_eagle3_aux_layers_from_
    config``), the nested ids read as SGLang ids by the newest SGLang rule the table holds for
    ``arch`` (:mod:`eagle3nb.boundaries.rules`; e.g. DeepSeek-V3 ``first_id_1``), or, without
    ``arch`` or a rule for it, as on Llama (boundary = id + 1, SGLang ``llama.py:929-941``); None
    for ``none``. ``head``: ``mla`` when ``architectures`` names
    :data:`eagle3nb.drafter.mla.MLA_ARCH`.

    Raises:
        FileNotFoundError: no folder, config.json or model.safetensors (named; with
            ``pytorch_model.bin`` there, the command that converts it).
        ValueError: config.json is not a JSON object; ids that name no boundary of the target; MLA
            keys without the MLA architecture; a speculators folder with an MLA layer (module
            docstring).
    """
    p = Path(path)
    for f in (p / "config.json", p / "model.safetensors"):
        if not f.is_file():
            raise FileNotFoundError(f"drafter={str(p)!r}: {f.name} is missing; {weights_fix(p, f)}")
    cfg = json.loads((p / "config.json").read_text())
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}/config.json is not a JSON object")
    fmt = _detect(cfg)
    head = _head(cfg, fmt, p)
    declared, how, key = None, "no ids in config.json", None
    if fmt == "eagle3nb":
        declared, how = list(cfg["eagle3nb"]["aux_boundaries"]), "eagle3nb.aux_boundaries"
    elif fmt in ("vllm", "speculators") and get_ids(cfg, "vllm"):
        key, ids = IDS_PATH["vllm"], get_ids(cfg, "vllm")
        declared = [int(i) for i in ids]  # vLLM: id L = boundary L (interfaces.py:1601-1611)
        how = f"{key}={ids} read as vLLM ids (id = boundary)"
    elif fmt == "sglang":
        key, ids = IDS_PATH["sglang"], get_ids(cfg, "sglang")
        declared, reading = _sglang_reading([int(i) for i in ids], n_layers, arch)
        how = f"{key}={ids} read as {reading}"
    if declared is not None and not all(0 <= b <= n_layers for b in declared):
        raise ValueError(
            f"{p}/config.json: {key or how}: boundaries {declared} outside 0..{n_layers} of the "
            f"target ({n_layers} layers): written for a deeper model?"
        )
    notes = []
    if fmt == "speculators":
        notes.append(
            "speculators format: vLLM serves it (`vllm serve DRAFTER` or --speculative-config); "
            "SGLang 0.5.23 reads no speculators keys and no Eagle3Speculator architecture"
        )
    return DrafterFolder(p, fmt, cfg, _plain(cfg, fmt, head), declared, how, notes, head)


def _head(cfg: dict, fmt: str, p: Path) -> str:
    """``mla`` or ``llama`` from ``architectures``; refuses what no engine builds as written."""
    archs = cfg.get("architectures") or []
    if fmt == "speculators":
        layer = cfg.get("transformer_layer_config") or {}
        keys = [k for k in mla.MLA_KEYS if k in layer or k in cfg]
        mt = layer.get("model_type")
        if keys or mla.MLA_ARCH in archs or mt in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
            raise ValueError(
                f"{p}/config.json: a speculators folder with an MLA layer (transformer_layer_config"
                f".model_type={mt!r}, MLA keys {keys}): speculators builds Eagle-3 layers for "
                "llama and qwen3 only (src/speculators/models/eagle3/model_definitions.py) and "
                "vLLM 0.32's speculators reader refuses other model types (transformers_utils/"
                "configs/speculators/algos.py:39-45), so no engine reads it as written. Write it "
                f"in SGLang's form: architectures [{mla.MLA_ARCH!r}], the transformer_layer_config"
                " keys at the top level, no speculators_* keys (eagle3nb's MLA export)"
            )
        if mt == "qwen3":  # vLLM builds Eagle3Qwen3ForCausalLM: q/k RMSNorm per head
            raise ValueError(
                f"{p}/config.json: a speculators folder with a Qwen3 layer (transformer_layer_config"
                ".model_type='qwen3'): vLLM 0.32 serves it as Eagle3Qwen3ForCausalLM (transformers_"
                "utils/configs/speculators/algos.py eagle3_arch_map), whose attention normalises q "
                "and k per head; eagle3nb reads Llama and MLA heads only, so it cannot measure this "
                "drafter as served; audit a Llama-layer drafter (model_type 'llama') instead"
            )
        return "llama"
    if mla.MLA_ARCH in archs:
        return "mla"
    keys = [k for k in mla.MLA_KEYS if k in cfg]
    if keys:
        raise ValueError(
            f"{p}/config.json: MLA keys {keys} but architectures={archs}: the engines would build "
            f"a Llama (GQA) layer and skip them. An MLA drafter names {mla.MLA_ARCH!r} (both "
            "engines' class); set architectures to it, or drop the keys of a Llama-head drafter"
        )
    return "llama"


def _sglang_reading(ids: list[int], n_layers: int, arch: str | None) -> tuple[list[int], str]:
    """(boundaries, how) of SGLang ids by the newest SGLang rule the table holds for ``arch``;
    without one, as on Llama-like classes (id L = boundary L + 1, llama.py:929-941). The capture
    range is not applied here: whether SGLang can capture them is its reading's business
    (:func:`eagle3nb.audit.measure.engine_readings`)."""
    try:
        rule = engine_rule("sglang", known_versions("sglang")[-1], arch) if arch else None
    except ValueError:  # a class the table does not hold
        rule = None
    if rule is None or rule.refused or rule.kind == "plus1":
        return get_convention("sglang").shift_boundaries(ids), "SGLang ids (boundary = id + 1)"
    wide = replace(rule, lo=0, hi_below_n=0)  # the rule's shift alone
    how = f"SGLang {rule.version} ids on {arch} (rule {rule.kind}, {rule.source})"
    try:
        return wide.ids_to_boundaries(ids, n_layers), how
    except ValueError:  # ids past N or negative: refused by the caller's range check, named
        return ids, how


def _d2t_range(path: Path) -> tuple[int, int] | None:
    """(lowest, highest) target id d2t maps draft ids to, or None without d2t (full vocab)."""
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        if "d2t" not in f.keys():
            return None
        d2t = f.get_tensor("d2t").long()
    import torch

    tgt = torch.arange(d2t.numel()) + d2t
    return int(tgt.min()), int(tgt.max())


def check_belongs(folder: DrafterFolder, target_cfg: dict, tokenizer_size: int) -> None:
    """Refuse a drafter that cannot belong to the target, before any work.

    Args:
        target_cfg: the target's text config (``hidden_size``, ``vocab_size``,
            ``num_hidden_layers``); tokenizer_size: ``len(tokenizer)``.

    Raises:
        ValueError: naming the field, both values and why: ``target_hidden_size`` (or
            ``hidden_size``) unlike the target's hidden size; ``vocab_size`` unlike the target's;
            a tokenizer with more tokens than the drafter's vocabulary; ``draft_vocab_size`` above
            ``vocab_size``; ``d2t`` mapping to target ids outside the target's vocabulary;
            ``eagle3nb.target_num_hidden_layers`` unlike the target's layer count; a flag eagle3nb
            does not implement (:func:`eagle3nb.boundaries.engine_read.check_config_flags`). An MLA
            drafter (``folder.head == "mla"``) also: a target without ``kv_lora_rank``; an MLA
            key missing (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
            ``qk_rope_head_dim``, ``v_head_dim``); what
            :mod:`eagle3nb.drafter.mla` refuses to load (``rope_interleave`` false, a rope scaling
            other than YaRN, ``norm_before_fc`` / ``norm_before_residual``).
    """
    c, where = folder.plain, f"{folder.path}/config.json"
    H, V = int(target_cfg["hidden_size"]), int(target_cfg["vocab_size"])
    key = "target_hidden_size" if "target_hidden_size" in c else "hidden_size"
    if key not in c or "vocab_size" not in c:
        raise ValueError(
            f"{where}: no {key if key not in c else 'vocab_size'}; not a drafter config"
        )
    if int(c[key]) != H:
        raise ValueError(
            f"{where}: {key}={c[key]} but the target's hidden_size is {H}: the drafter reads "
            "another model's hidden states; audit it against the target it was trained for"
        )
    if int(c["vocab_size"]) != V:
        raise ValueError(
            f"{where}: vocab_size={c['vocab_size']} but the target's vocab_size is {V}: the "
            "drafter was made for another vocabulary"
        )
    if tokenizer_size > V:
        raise ValueError(
            f"{where}: vocab_size={V} but the target's tokenizer has {tokenizer_size} tokens"
        )
    dv = int(c.get("draft_vocab_size", V))
    if not 1 <= dv <= V:
        raise ValueError(f"{where}: draft_vocab_size={dv} outside 1..vocab_size={V}")
    rng = _d2t_range(folder.path)
    if rng is not None and not (0 <= rng[0] and rng[1] < V):
        raise ValueError(
            f"{folder.path}/model.safetensors: d2t maps draft ids to target ids {rng[0]}..{rng[1]},"
            f" outside the target's vocabulary 0..{V - 1} (another tokenizer, or absolute ids)"
        )
    n = (c.get("eagle3nb") or {}).get("target_num_hidden_layers")
    if n is not None and int(n) != int(target_cfg["num_hidden_layers"]):
        raise ValueError(
            f"{where}: eagle3nb.target_num_hidden_layers={n} but the target has "
            f"{target_cfg['num_hidden_layers']} layers: exported for another target"
        )
    # aux states the fc reads: the config's count, else both engines' default of 3
    n_aux = int(c.get("num_aux_hidden_states") or 3)
    if folder.head == "mla":  # the MLA head reads its own keys (as load_drafter leaves them out)
        flags = check_config_flags(
            {k: v for k, v in c.items() if k not in mla.MLA_READ}, where, n_aux
        )
        _check_mla(c, where, target_cfg, flags, n_aux)
    else:
        flags = check_config_flags(c, where, n_aux)
    _check_flag_weights(folder.path, flags, n_aux)


def _check_mla(c: dict, where: str, target_cfg: dict, flags: dict, n_aux: int) -> None:
    """An MLA drafter's keys against the target's and what :mod:`eagle3nb.drafter.mla` loads."""
    if not target_cfg.get("kv_lora_rank"):
        raise ValueError(
            f"{where}: architectures [{mla.MLA_ARCH!r}] (an MLA drafter, for DeepSeek-V2/V3 or "
            f"Kimi-K2 targets) but the target ({(target_cfg.get('architectures') or ['?'])[0]}) "
            "has no kv_lora_rank: no engine here serves an MLA drafter beside a non-MLA target "
            "(drafter/mla.py MLAConfig.for_target); audit it against the target it was trained for"
        )
    missing = [k for k in mla.MLA_KEYS if not c.get(k)]
    if missing:
        have = {k: target_cfg[k] for k in missing if target_cfg.get(k)}
        raise ValueError(
            f"{where}: architectures [{mla.MLA_ARCH!r}] but config.json lacks {missing}, which "
            f"size its attention; take them from the target ({have or 'its config.json'}) if it "
            "was trained with the target's ranks, as eagle3nb's MLA export writes them"
        )
    # ranks unlike the target's are not refused: both engines and load_drafter size the drafter's
    # attention from its own config.json (a drafter may be trained narrower than its target)
    h, v = int(c["hidden_size"]), int(c["vocab_size"])
    base = DrafterConfig(  # the Llama fields load_drafter reads, for mla.mla_config_from_json
        hidden_size=h,
        target_hidden_size=int(c.get("target_hidden_size") or h),
        intermediate_size=int(c.get("intermediate_size") or 1),
        num_attention_heads=int(c["num_attention_heads"]),
        num_key_value_heads=int(c["num_attention_heads"]),
        head_dim=int(c["qk_rope_head_dim"]),
        vocab_size=v,
        draft_vocab_size=int(c.get("draft_vocab_size", v)),
        n_aux=n_aux,
        rope_theta=float(c.get("rope_theta", 10000.0)),
        **flags,
    )
    try:  # what load_drafter would refuse, before any weight is read
        mc = mla.mla_config_from_json(c, base)
        mla.check_mla_flags(mc)
        mla.rope_inv_freq(mc)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _check_flag_weights(path: Path, flags: dict, n_aux: int) -> None:
    """The norm weights the variant flags ask for are in model.safetensors (SGLang's legacy
    ``aux_norm_low/mid/high`` count as ``fc_norm.0/1/2``), checked before the target loads."""
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        have = set(f.keys())
    legacy = ("aux_norm_low", "aux_norm_mid", "aux_norm_high")
    have |= {f"fc_norm.{i}.weight" for i, n in enumerate(legacy) if f"{n}.weight" in have}
    need = {
        "norm_before_fc": ["input_norm.weight"],
        "fc_norm": [f"fc_norm.{i}.weight" for i in range(n_aux)],
    }
    for flag, names in need.items():
        lack = [x for x in names if flags[flag] and x not in have]
        if lack:
            raise ValueError(
                f"{path}/model.safetensors lacks {lack}, which config.json's {flag}=true asks "
                "for: an engine would serve untrained norms (or refuse to load); re-export it"
            )


def loadable_copy(folder: DrafterFolder, out_dir: str | os.PathLike) -> Path:
    """``out_dir``: the drafter's files with config.json in eagle3nb's form (``folder.plain``: an
    MLA drafter keeps :data:`eagle3nb.drafter.mla.MLA_ARCH` and its MLA keys) and ``layers.0.*``
    weights (speculators', SGLang's MLA checkpoints) renamed ``midlayer.*``
    (:func:`eagle3nb.drafter.mla.our_names`, as vLLM's and SGLang's load_weights map them), so
    :func:`eagle3nb.drafter.export.load_drafter` reads it; a full vocabulary without ``d2t``/``t2d``
    (:func:`eagle3nb.audit.servable.full_vocab_without_d2t`). Other files are copied unchanged."""
    out = Path(out_dir)
    if out.resolve() == folder.path.resolve():
        raise ValueError(f"out_dir={str(out)!r} is the drafter folder itself; never overwritten")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in folder.path.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy2(f, out / f.name)
    sd = load_file(str(folder.path / "model.safetensors"))
    renamed = any(k.startswith("layers.0.") for k in sd)
    c = folder.plain
    full = int(c.get("draft_vocab_size") or c["vocab_size"]) == int(c["vocab_size"])
    if renamed or (full and "d2t" in sd):
        sd = mla.our_names(sd) if renamed else sd
        sd = full_vocab_without_d2t(sd) if full else sd
        save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        shutil.copy2(folder.path / "model.safetensors", out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(folder.plain, indent=2) + "\n")
    return out
