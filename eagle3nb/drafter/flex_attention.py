"""Training-time-test attention through PyTorch flex attention (the fast path of the drafter).

Computes the same function as the eager attention of :mod:`eagle3nb.drafter.model` (the
reference; tests/drafter/test_drafter_attention.py) for the training layout, with a block mask over the
concatenated keys of all TTT steps instead of score matrices in memory: masked blocks are skipped,
and on CUDA the kernel is compiled.

Which flex function runs is chosen per call by :func:`pick_flex`, with no module-level state: inside
a ``torch.compile`` region (a compiled decoder layer) the plain ``flex_attention`` is traced into the
enclosing graph; outside one, on CUDA, the compiled handle the caller owns (made by
:func:`compiled_flex`, held by each attention module); on CPU the plain function. A compile can
therefore never leave an uncompiled function where a later uncompiled CUDA call looks for the fused
kernel (tests/drafter/test_flex_compile.py).
"""

from __future__ import annotations

from typing import Optional

import torch

try:  # flex attention: torch >= 2.5
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - older torch keeps the eager path
    create_block_mask = flex_attention = None

__all__ = [
    "ttt_flex_attention",
    "flex_attention",
    "compiled_flex",
    "pick_flex",
    "raise_recompile_limits",
]

# graphs one compiled function may hold: TTT steps (key lengths) x sequence lengths
RECOMPILE_LIMIT = 512


def raise_recompile_limits(n: int = RECOMPILE_LIMIT) -> None:
    """Let torch.compile keep ``n`` graphs per function (and 4n in all) instead of its default 8:
    each TTT step and each sequence length is a graph, and past the limit dynamo silently runs
    the function uncompiled (for flex attention: the unfused reference, scores in memory)."""
    cfg = torch._dynamo.config
    for name, v in (("recompile_limit", n), ("cache_size_limit", n)):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), v))
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 4 * n))


def compiled_flex():
    """A new compiled handle of flex_attention (uncompiled, on CUDA, it is the slow unfused
    reference: scores in memory). Compilation happens at its first call, once per shape."""
    raise_recompile_limits()
    return torch.compile(flex_attention, dynamic=False)


def pick_flex(on_gpu: bool, handle=None):
    """The flex function for one call: plain ``flex_attention`` while ``torch.compile`` traces
    (the enclosing graph compiles it) or off the GPU; else ``handle`` (a :func:`compiled_flex`
    handle, owned by the caller), or plain ``flex_attention`` when there is none."""
    if torch.compiler.is_compiling() or not on_gpu or handle is None:
        return flex_attention
    return handle


def ttt_flex_attention(
    q: torch.Tensor,
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    key_mask: Optional[torch.Tensor],
    scale: float,
    attn=None,
) -> torch.Tensor:
    """TTT attention through flex attention, for the training layout (queries = step-0 positions).

    Args:
        q: ``[B, nh, T, d]`` queries of step j = len(ks) - 1 (after RoPE).
        ks, vs: per step 0..j, ``[B, nkv, T, d]`` each (kv heads not repeated: flex does GQA).
        key_mask: ``[B, T]`` bool, False on padding (step-0 keys only, as in the eager path) or None.
        scale: score scale (1/sqrt(d)).
        attn: the flex function to call (:func:`pick_flex`); None for plain ``flex_attention``.

    Returns:
        ``[B, nh, T, d]``. The keys of all steps are concatenated to ``[B, nkv, (j+1)*T, d]``; key
        index s*T + u is step s at position u. Query t sees step-0 keys u <= t (and not padding) and
        the key of each later step at u = t. Blocks the mask rules out (all of the causal upper half,
        all but the diagonal blocks of later steps) are skipped, so the cost stays that of causal
        attention plus a sliver per step. A query that sees no key (a padding position whose
        earlier keys are all padding) gets 0 here and a uniform average in the eager path; both
        are outside the loss.
    """
    B, nh, T, _ = q.shape
    k, v = torch.cat(ks, dim=2), torch.cat(vs, dim=2)  # [B, nkv, (j+1)*T, d]
    # no padding: one mask for the whole batch
    km = None if key_mask is None or bool(key_mask.all()) else key_mask

    def mask_mod(b, h, qi, ki):
        u = ki % T  # position of key ki within its step
        first = (ki < T) & (u <= qi)
        if km is not None:
            first = first & km[b, u]
        return first | ((ki >= T) & (u == qi))

    on_gpu = q.is_cuda
    bm = create_block_mask(
        mask_mod,
        B if km is not None else None,
        None,
        T,
        k.shape[2],
        device=q.device,
        _compile=on_gpu,
    )
    attn = attn or flex_attention
    return attn(q, k, v, block_mask=bm, scale=scale, enable_gqa=k.shape[1] != nh)
