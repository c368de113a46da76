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
"""

from __future__ import annotations

import copy

__all__ = ["twin_config"]

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
