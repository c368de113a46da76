"""A tiny random-weight twin of a target's class, built from the target's own config.json (no
download): what an engine's capture rule is measured on when the target itself is too large for an
HF reference on the same machine (issue 11's per-run proof; the engine side is still to build).

Shrunk: layers (default 6), attention heads (4, the GQA ratio kept where it fits), widths of
the MLPs, routed experts (4, top-k <= 2, expert groups <= 2), dense-first layers (<= 1), shared
experts (<= 1), and a wrapper's vision tower (1 layer). Kept: the class, rope parameters (YaRN
included, which the engines' CPU paths require), head_dim where the config sets it (else the per-head
width: hidden = heads x head_dim), MLA ranks (``kv_lora_rank``, ``q_lora_rank``, ``qk_*_head_dim``,
``v_head_dim``: vLLM's CPU MLA accepts only 512 + 64), the router (``scoring_func``,
``topk_method``, ``norm_topk_prob``, routing bias), sliding windows and attention chunk sizes, the
per-layer pattern (``layer_types``, ``no_rope_layers`` cut to the twin's layers), and the vocabulary
(so the target's tokenizer fits; ``vocab_size`` may be overridden). Dropped: ``quantization_config``
(the twin's weights are random float tensors) and ``auto_map`` (no remote code).

:func:`build_twin` writes such a twin as a model folder (random float32 weights, the target's
tokenizer files); :func:`twin_ids` maps a run's ids onto a twin with fewer layers; :func:`name_slots`
names each slot an engine captured on the twin by the HF boundary it equals.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Sequence

__all__ = ["twin_config", "build_twin", "twin_ids", "twin_layers", "name_slots", "probe_samples"]

MAX_TWIN_LAYERS = 12  # a deeper target's ids are mapped onto this many layers (twin_ids)
TWIN_VOCAB = 512  # a twin's vocabulary (the target's when smaller)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)

_EXPERTS = ("n_routed_experts", "num_experts", "num_local_experts")
_PER_LAYER = ("layer_types", "no_rope_layers")  # one entry per layer: cut to the twin's
_LAYER_INDEX = ("moe_layers", "mlp_only_layers")  # layer indices: keep those below N


def _shrink_text(c: dict, n_layers: int, heads: int, experts: int) -> dict:
    h0, heads0 = c.get("hidden_size"), c.get("num_attention_heads")
    if not isinstance(h0, int) or not isinstance(heads0, int) or heads0 < 1:
        raise ValueError(
            f"config has hidden_size={h0!r}, num_attention_heads={heads0!r}: a decoder config "
            "needs both as positive ints to build a twin"
        )
    kv0 = c.get("num_key_value_heads") or heads0
    c["num_hidden_layers"] = n_layers
    c["num_attention_heads"] = heads
    c["num_key_value_heads"] = heads if kv0 >= heads0 else max(1, heads * kv0 // heads0)
    if c.get("head_dim"):
        c["hidden_size"] = 256
    else:  # head_dim = hidden / heads: keep the target's per-head width
        c["hidden_size"] = heads * (h0 // heads0)
    for k, v in (("intermediate_size", 256), ("moe_intermediate_size", 64)):
        if isinstance(c.get(k), int):
            c[k] = v
    if isinstance(c.get("intermediate_size_mlp"), int):
        c["intermediate_size_mlp"] = 256
    for k in _EXPERTS:
        if isinstance(c.get(k), int) and c[k] > 0:
            c[k] = min(c[k], experts)
    if isinstance(c.get("num_experts_per_tok"), int):
        c["num_experts_per_tok"] = min(c["num_experts_per_tok"], 2)
    if isinstance(c.get("n_group"), int) and c["n_group"] > 1:
        c["n_group"] = 2  # grouped routing kept: 2 groups of experts // 2
        c["topk_group"] = min(int(c.get("topk_group") or 1), 2)
    for k in ("n_shared_experts", "first_k_dense_replace"):
        if isinstance(c.get(k), int):
            c[k] = min(c[k], 1)
    for k in _PER_LAYER:
        if isinstance(c.get(k), list):
            c[k] = c[k][:n_layers]
    for k in _LAYER_INDEX:
        if isinstance(c.get(k), list):
            c[k] = [i for i in c[k] if i < n_layers]
    return c


def twin_config(
    cfg: dict, n_layers: int = 6, heads: int = 4, experts: int = 4, vocab_size: int | None = None
) -> dict:
    """A config.json dict for a tiny twin of ``cfg``'s class (see the module docstring).

    Args:
        cfg: the target's config.json dict (a wrapper's text model is under ``text_config``).
        n_layers: decoder layers of the twin (>= 4, so that adjacent boundaries are all present).
        heads, experts: attention heads and routed experts of the twin.
        vocab_size: None keeps the target's (its tokenizer fits the twin).

    Returns:
        A new dict; ``cfg`` is not changed.

    Raises:
        ValueError: ``n_layers`` < 4, or a config without positive ``hidden_size`` and
            ``num_attention_heads`` (in its text model).
    """
    if not isinstance(n_layers, int) or n_layers < 4:
        raise ValueError(f"n_layers={n_layers!r}: a twin needs >= 4 decoder layers")
    c = copy.deepcopy(cfg)
    for k in ("quantization_config", "auto_map"):
        c.pop(k, None)
    text = c.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in c:
        text.pop("quantization_config", None)
        _shrink_text(text, n_layers, heads, experts)
        if vocab_size is not None:
            text["vocab_size"] = int(vocab_size)
        vision = c.get("vision_config")
        if isinstance(vision, dict) and isinstance(vision.get("num_hidden_layers"), int):
            vision["num_hidden_layers"] = 1
        return c
    _shrink_text(c, n_layers, heads, experts)
    if vocab_size is not None:
        c["vocab_size"] = int(vocab_size)
    return c


def twin_layers(n_target: int) -> int:
    """Decoder layers of the twin of an ``n_target``-layer target: the target's own count up to
    :data:`MAX_TWIN_LAYERS` (so ids are captured as given), at least 4."""
    return max(4, min(int(n_target), MAX_TWIN_LAYERS))


def twin_ids(ids: Sequence[int], n_target: int, n_twin: int) -> list[int]:
    """The run's engine ids, as asked of the twin: unchanged when both have the same layer count;
    otherwise 0, 1, N-1 and N (what every rule in :mod:`eagle3nb.boundaries.rules` depends on:
    a first id of 1, an id N, id 0) map to 0, 1, n-1, n, and the ids between keep their order on
    2..n-2 (spread in proportion).

    Raises:
        ValueError: more distinct ids between 2 and N-2 than the twin has layers for.
    """
    ids = [int(i) for i in ids]
    if n_target == n_twin:
        return ids
    fixed = {0: 0, 1: 1, n_target - 1: n_twin - 1, n_target: n_twin}
    mid = sorted({i for i in ids if i not in fixed})
    if len(mid) > n_twin - 3:
        raise ValueError(
            f"ids={ids}: {len(mid)} ids between 2 and {n_target - 2} do not fit the twin's "
            f"{n_twin} layers; build the twin with more layers (n_layers)"
        )
    span = max(1, n_target - 4)
    want = [2 + round((i - 2) * (n_twin - 4) / span) for i in mid]
    if len(set(want)) != len(want):  # collisions: consecutive places instead
        want = list(range(2, 2 + len(mid)))
    m = dict(zip(mid, want))
    return [fixed.get(i, m.get(i)) for i in ids]


_DTYPE_KEYS = ("dtype", "torch_dtype")


def _declare_dtype(saved: dict, cfg: dict) -> None:
    """Make the twin's config.json declare the dtype the target's declares (or none), in place.

    Why: ``save_pretrained`` writes the dtype of the twin's float32 weights, and engines build some
    layers in the declared dtype instead of the run's: SGLang's gpt-oss router and attention take
    ``params_dtype=config.dtype`` (``sglang/srt/models/gpt_oss.py:253, 556`` in 0.5.17, ``:263,
    559`` in 0.5.23), so a bf16 run of a twin declaring float32 failed on every probe with "mat1 and
    mat2 must have the same dtype" (H100, 2026-12-06, ``bench/gpu_2026-12-06/gpu_rules.json``),
    where the released gpt-oss (declaring bfloat16) runs. With no declared dtype SGLang builds those
    layers in the run's dtype (``layers/linear.py:173-174`` in 0.5.17: ``torch.get_default_dtype()``,
    which its loader sets to the run's dtype). The weights stay float32 in the file; engines and HF
    cast them to the dtype they are loaded in."""
    levels = [(saved, cfg)]
    if isinstance(saved.get("text_config"), dict):
        levels.append((saved["text_config"], cfg.get("text_config") or {}))
    for out, src in levels:
        for k in _DTYPE_KEYS:
            out.pop(k, None)
            if src.get(k) is not None:
                out[k] = src[k]


def _source_hash(cfg: dict, n_layers: int, seed: int, vocab: int) -> str:
    # the last item: the twin's format (2: config.json declares the target's dtype)
    blob = json.dumps([cfg, n_layers, seed, vocab, 2], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def build_twin(
    target_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    n_layers: int,
    seed: int = 0,
    arch: str | None = None,
    model_type_aliases: dict | None = None,
    tokenizer_from: str | os.PathLike | None = None,
) -> Path:
    """Write a tiny random-weight twin of the target in ``target_path`` to ``out_dir``.

    The config is :func:`twin_config` of the target's config.json (vocabulary cut to
    :data:`TWIN_VOCAB` when larger), declaring the target's dtype (:func:`_declare_dtype`), the
    weights transformers' random init in float32 with router weights drawn at std 1 (top-k choices
    not near ties), seeded; the target's tokenizer files are copied. Nothing is downloaded. The
    folder is written under a temp name and renamed; an existing twin of the same config, layers
    and seed is reused (``twin.json`` holds the hash).

    Args:
        target_path: folder with the target's config.json (weights are not read).
        arch: the transformers class to build (default: config.json's first ``architectures``).
        model_type_aliases: model_type -> the transformers model_type to build it as (Kimi-K2's
            ``kimi_k2`` -> ``deepseek_v3``); config.json keeps the target's own.
        tokenizer_from: folder whose tokenizer files are copied (default ``target_path``).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: see :func:`twin_config`; FileNotFoundError: no config.json in ``target_path``.
        AttributeError: ``arch`` is not a class of the installed transformers.
    """
    import torch
    import transformers
    from transformers import AutoConfig

    src, out = Path(target_path), Path(out_dir)
    aliases = dict(model_type_aliases or {})
    cfg = json.loads((src / "config.json").read_text())
    text = cfg.get("text_config") if "num_hidden_layers" not in cfg else cfg
    vocab = min(int((text or cfg).get("vocab_size") or TWIN_VOCAB), TWIN_VOCAB)
    digest = _source_hash(cfg, n_layers, seed, vocab)
    stamp = out / "twin.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("sha256") == digest:
        return out
    arch = arch or (cfg.get("architectures") or [None])[0]
    tcfg = twin_config(cfg, n_layers=n_layers, vocab_size=vocab)
    mt = tcfg.get("model_type")
    kw = {k: v for k, v in tcfg.items() if k not in ("model_type", "transformers_version")}
    hf_cfg = AutoConfig.for_model(aliases.get(mt, mt), **kw)
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(hf_cfg).float().eval()
    with torch.no_grad():  # router weights std 1: top-k choices are not near-ties
        for name, p in model.named_parameters():
            if name.endswith(("gate.weight", "router.weight")) and p.dim() == 2:
                p.normal_(0.0, 1.0)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    saved = json.loads((tmp / "config.json").read_text())
    if mt in aliases:  # the target's own model_type (e.g. kimi_k2), as the engines read it
        saved["model_type"] = mt
    saved["architectures"] = cfg.get("architectures") or [arch]
    _declare_dtype(saved, cfg)
    (tmp / "config.json").write_text(json.dumps(saved, indent=2))
    tok = Path(tokenizer_from) if tokenizer_from else src
    for f in _TOKENIZER_FILES:
        if (tok / f).is_file():
            shutil.copy(tok / f, tmp / f)
    (tmp / "twin.json").write_text(
        json.dumps({"sha256": digest, "of": str(src), "n_layers": n_layers, "seed": seed})
    )
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def probe_samples(vocab: int, seed: int = 0, lengths: Sequence[int] = (16, 9)) -> list[list[int]]:
    """Token ids the twin is captured on: seeded random ids in ``2..vocab-1`` (BOS 1 first)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(2, vocab, (t - 1,), generator=g).tolist() for t in lengths]


def name_slots(err, boundaries: Sequence[int], tol: float) -> list[dict]:
    """Name each captured slot by the HF boundary it equals.

    Args:
        err: ``[n_slots, len(boundaries)]`` relative errors
            (:func:`eagle3nb.boundaries.alignment.alignment_matrix`, summed over the probe samples).
        tol: relative error under which a slot *is* a boundary.

    Returns:
        Per slot ``{"boundary" (None when no boundary is within tol), "error", "next_error"}``
        (``next_error``: the second-best boundary's error, the margin of the naming).
    """
    out = []
    for row in err:
        order = sorted(range(len(boundaries)), key=lambda j: float(row[j]))
        j, e = order[0], float(row[order[0]])
        nxt = float(row[order[1]]) if len(order) > 1 else float("inf")
        out.append({"boundary": boundaries[j] if e <= tol else None, "error": e, "next_error": nxt})
    return out
