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
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang ids, boundary - 1 on Llama).
- ``vllm``: the top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM ids = boundaries).
- ``none``: no ids at all (each engine then feeds its default boundaries 2, N//2, N-3).

:func:`read_drafter_folder` returns what the folder declares; :func:`check_belongs` refuses a
drafter for another target before any work; :func:`loadable_copy` writes the folder in the form
:func:`eagle3nb.drafter.export.load_drafter` reads (the original is never touched).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3nb.drafter.engine_read import check_config_flags
from eagle3nb.drafter.export import ARCH

__all__ = ["FORMATS", "DrafterFolder", "read_drafter_folder", "check_belongs", "loadable_copy"]

FORMATS = ("eagle3nb", "speculators", "sglang", "vllm", "none")
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
    :data:`eagle3nb.drafter.export.ARCH`), ``declared`` (the boundaries the folder says it was
    trained on, or None when it names no ids), ``declared_how`` (which key and reading)."""

    path: Path
    format: str
    config: dict
    plain: dict
    declared: list[int] | None
    declared_how: str
    notes: list[str] = field(default_factory=list)


def _detect(cfg: dict) -> str:
    if isinstance(cfg.get("eagle3nb"), dict) and cfg["eagle3nb"].get("aux_boundaries"):
        return "eagle3nb"
    if "speculators_config" in cfg or SPECULATORS_ARCH in (cfg.get("architectures") or []):
        return "speculators"
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        return "vllm"
    if (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"):
        return "sglang"
    return "none"


def _plain(cfg: dict, fmt: str) -> dict:
    """``cfg`` with the speculators widths hoisted and eagle3nb's architecture (a copy)."""
    out = json.loads(json.dumps(cfg))
    if fmt == "speculators":
        for k, v in (cfg.get("transformer_layer_config") or {}).items():
            if k in _LAYER_KEYS:
                out.setdefault(k, v)
        out.pop("speculators_version", None)
    out["architectures"] = [ARCH]
    if "head_dim" not in out and "hidden_size" in out and "num_attention_heads" in out:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    out.setdefault("rope_theta", 10000.0)  # both engines' llama default
    out.setdefault("max_position_embeddings", 2048)  # rope table length: no effect on outputs
    out.setdefault("num_key_value_heads", out.get("num_attention_heads"))
    return out


def read_drafter_folder(path: str | os.PathLike, n_layers: int) -> DrafterFolder:
    """Read ``path``/config.json in any of :data:`FORMATS` for a target of ``n_layers`` layers.

    The declared boundaries: ``eagle3nb.aux_boundaries`` (eagle3nb), the top-level ids read as vLLM
    ids (vllm, speculators: vLLM's reader, ``gpu_model_runner.py`` ``_get_eagle3_aux_layers_from_
    config``), the nested ids read as SGLang ids (boundary = id + 1, SGLang ``llama.py:929-941``),
    None for ``none``.

    Raises:
        FileNotFoundError: no folder, config.json or model.safetensors (named).
        ValueError: config.json is not a JSON object; ids that name no boundary of the target.
    """
    p = Path(path)
    for f in (p / "config.json", p / "model.safetensors"):
        if not f.is_file():
            raise FileNotFoundError(
                f"drafter={str(p)!r}: {f.name} is missing; point at a drafter folder"
            )
    cfg = json.loads((p / "config.json").read_text())
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}/config.json is not a JSON object")
    fmt = _detect(cfg)
    declared, how, key = None, "no ids in config.json", None
    if fmt == "eagle3nb":
        declared, how = list(cfg["eagle3nb"]["aux_boundaries"]), "eagle3nb.aux_boundaries"
    elif fmt in ("vllm", "speculators") and cfg.get("eagle_aux_hidden_state_layer_ids"):
        key = "eagle_aux_hidden_state_layer_ids"
        ids = cfg[key]
        declared = [int(i) for i in ids]  # vLLM: id L = boundary L (interfaces.py:1601-1611)
        how = f"{key}={ids} read as vLLM ids (id = boundary)"
    elif fmt == "sglang":
        key = "eagle_config.eagle_aux_hidden_state_layer_ids"
        ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        # SGLang on Llama-like classes: id L = boundary L + 1 (llama.py:929-941); whether SGLang
        # can capture them is its reading's business (audit.measure.engine_readings)
        declared = [int(i) + 1 for i in ids]
        how = f"{key}={ids} read as SGLang ids (boundary = id + 1)"
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
    return DrafterFolder(p, fmt, cfg, _plain(cfg, fmt), declared, how, notes)


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
            does not implement (:func:`eagle3nb.drafter.engine_read.check_config_flags`).
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
    flags = check_config_flags(c, where, n_aux)
    _check_flag_weights(folder.path, flags, n_aux)


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
    """``out_dir``: the drafter's files with config.json in eagle3nb's form (``folder.plain``) and
    speculators' ``layers.0.*`` weights renamed ``midlayer.*`` (as vLLM's load_weights does), so
    :func:`eagle3nb.drafter.export.load_drafter` reads it. Other files are copied unchanged.
    Returns ``out_dir``."""
    out = Path(out_dir)
    if out.resolve() == folder.path.resolve():
        raise ValueError(f"out_dir={str(out)!r} is the drafter folder itself; never overwritten")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in folder.path.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy2(f, out / f.name)
    sd = load_file(str(folder.path / "model.safetensors"))
    if any(k.startswith("layers.0.") for k in sd):
        sd = {("midlayer." + k[9:] if k.startswith("layers.0.") else k): v for k, v in sd.items()}
        save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        shutil.copy2(folder.path / "model.safetensors", out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(folder.plain, indent=2) + "\n")
    return out
