"""Training-time test (TTT): the EAGLE-3 training objective.

Alignment at sequence position t and TTT step j (0..k-1), as in SafeAILab/EAGLE ``cnets.py`` and
SpecForge ``core/eagle3.py``, with positions shifted by j as at serve time:

    hidden  : step 0 -> aux states of position t; step j -> drafter pre-norm output of step j-1
    token   : x[t+1+j]        (teacher forcing with the ground-truth token)
    target  : p[t+1+j] = softmax over the draft vocab of lm_head(norm(final[t+1+j])), the target's
              distribution of x[t+2+j]
    weight  : 0.8**j, only where loss_mask[t+2+j] (the predicted token is loss-bearing), the position
              is real (not padding), and the target's argmax lies in the draft vocab.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from eagle3nb.drafter.model import Eagle3Drafter

__all__ = ["shift_left", "ttt_inputs", "target_probs", "soft_ce", "ttt_loss", "TTTResult"]


def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """``y[:, t] = x[:, t+n]`` along dim 1, ``fill`` past the end. x: ``[B, T, ...]``."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)


def ttt_inputs(input_ids: torch.Tensor, loss_mask: torch.Tensor, attn_mask: torch.Tensor, j: int):
    """Token ids and loss weights (before decay and vocab masking) of TTT step j.

    Args:
        input_ids: ``[B, T]`` int64. loss_mask, attn_mask: ``[B, T]`` (1 = loss-bearing / real token).

    Returns:
        ``(tokens [B, T] = x[t+1+j], mask [B, T] bool = loss_mask[t+2+j] & real[t+2+j])``.
    """
    tokens = shift_left(input_ids, 1 + j)
    mask = shift_left((loss_mask.bool() & attn_mask.bool()), 2 + j, False)
    return tokens, mask


@torch.no_grad()
def target_probs(
    final: torch.Tensor, target_norm, target_lm_head, t2d: torch.Tensor, d2t: torch.Tensor
):
    """Target next-token distribution restricted to the draft vocab.

    Args:
        final: ``[B, T, Ht]`` boundary-N states (pre final norm).
        target_norm, target_lm_head: the target's final RMSNorm and lm_head modules.
        t2d: ``[vocab]`` bool; d2t: ``[draft_vocab]`` int64 offsets.

    Returns:
        ``(probs [B, T, draft_vocab] float32, in_vocab [B, T] bool: target argmax in the draft vocab,
        argmax_target [B, T] int64 target ids)``.
    """
    logits = target_lm_head(target_norm(final))  # [B, T, vocab], the head's dtype
    amax = logits.argmax(-1)  # [B, T] (exact in any dtype: no float32 copy of the full vocab)
    draft_ids_in_target = torch.arange(d2t.numel(), device=d2t.device) + d2t  # [draft_vocab]
    probs = torch.softmax(logits[..., draft_ids_in_target].float(), dim=-1)  # [B, T, draft_vocab]
    return probs, t2d[amax], amax


def soft_ce(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Soft cross-entropy per position, in float32: ``logits [B, T, V]`` (any float dtype) against
    the target distribution ``p [B, T, V]`` -> ``[B, T]``. Training on CUDA may run a compiled
    copy (one fused pass over the logits, :mod:`eagle3nb.training.fastpath`)."""
    logp = F.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    return -(p * logp).sum(-1)


@dataclass
class TTTResult:
    """Loss (scalar, with grad), per-step loss and accuracy (python floats), per-step token counts.

    With ``count_reduce`` (several processes), every mean is over the GLOBAL count of scored
    positions: ``loss``, ``step_loss`` and ``step_acc`` are then this process's share (summed over
    processes they give the global value), ``step_count`` counts this process's positions and
    ``step_total`` all processes'. In one process both counts are equal and the shares are the means.
    """

    loss: torch.Tensor
    step_loss: list[float]
    step_acc: list[float]
    step_count: list[int]
    step_total: list[int] = None

    def __post_init__(self):
        if self.step_total is None:
            self.step_total = list(self.step_count)


class _Rows(NamedTuple):
    index: torch.Tensor  # [B, Tq] int64 positions, in order, padded with unscored ones
    valid: torch.Tensor  # [B, Tq] bool, False on the padding


def _scored_rows(masks: list[torch.Tensor]) -> _Rows:
    """Per row, the positions scored at any of ``masks`` (each ``[B, T]`` bool), in order; rows
    with fewer are padded (valid False) with unscored positions of their own row."""
    need = torch.stack(masks).any(0)  # [B, T]
    n = need.sum(1)  # [B]
    tq = max(int(n.max()), 1)
    index = torch.argsort((~need).to(torch.int8), dim=1, stable=True)[:, :tq]  # scored first
    valid = torch.arange(tq, device=need.device)[None] < n[:, None]  # [B, Tq]
    return _Rows(index, valid)


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b, i], ...]``: x ``[B, T, ...]``, index ``[B, Tq]`` -> ``[B, Tq, ...]``."""
    idx = index.reshape(*index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, idx)


def _eager_layout(drafter: Eagle3Drafter, layer, scored_only: bool | None) -> bool:
    """May steps >= 1 run on a subset of the positions? Only on the eager attention path."""
    ok = layer is None and drafter.midlayer.self_attn.attn_impl == "eager"
    if scored_only and not ok:
        raise ValueError(
            "scored_only=True needs the eager attention and no compiled layer (flex attention "
            "and compiled layers take every position); pass scored_only=None or False"
        )
    return ok


def ttt_loss(
    drafter: Eagle3Drafter,
    input_ids,
    aux,
    final,
    loss_mask,
    attn_mask,
    target_norm,
    target_lm_head,
    k: int = 7,
    decay: float = 0.8,
    count_reduce=None,
    layer=None,
    ce=soft_ce,
    scored_only: bool | None = None,
) -> TTTResult:
    """Unroll the drafter k steps and return the weighted soft cross-entropy.

    Args:
        input_ids: ``[B, T]`` int64; aux: ``[B, T, n_aux*Ht]``; final: ``[B, T, Ht]``;
        loss_mask, attn_mask: ``[B, T]`` (right padding); k: TTT steps >= 1; decay: weight base.
        count_reduce: ``[k] int64 -> [k] int64`` summing the per-step counts of scored positions
            over all processes (an all-reduce); None in one process. Dividing each process's sum by
            the global count makes the processes' losses add up to the one-process loss of the
            whole global batch, whatever the split (data-parallel equality).
        layer: the decoder layer callable (None: the drafter's ``midlayer``; a compiled wrapper
            on the fast path). ce: the per-position soft cross-entropy (:func:`soft_ce` or a
            compiled copy of it).
        scored_only: TTT steps 1..k-1 run only on the positions that carry a loss in one of them
            (a position's step j reads step j-1 at the same position and the step-0 keys, never
            another position's later steps, so the loss and gradients are the same): prompt
            tokens, unscored turns and padding are skipped. None: on where the attention takes
            the eager path (no compiled layer, ``attn_impl == "eager"``), where the gathered
            layout is allowed; False: every position (the layout flex attention and compiled
            layers need); True: on, and raises where the layout is not allowed.

    Returns:
        :class:`TTTResult`. Steps with no loss-bearing position contribute 0 (never NaN).

    Raises:
        ValueError: k < 1; ``scored_only=True`` with a compiled layer or flex attention.
    """
    if k < 1:
        raise ValueError(f"k={k}: the number of TTT steps must be >= 1")
    B, T = input_ids.shape
    dev = input_ids.device
    probs, in_vocab, amax = target_probs(
        final, target_norm, target_lm_head, drafter.t2d, drafter.d2t
    )
    # the target of step j is probs shifted left by 1+j: views of one zero-padded copy (not a
    # shifted copy per step: backward keeps one [B, T+k, V] tensor, not k of them)
    probs = torch.cat([probs, probs.new_zeros(B, k, probs.shape[-1])], dim=1)  # [B, T+k, V]
    key_mask = attn_mask.bool()  # [B, T]
    if bool(key_mask.all()):  # no padding: no key mask (one device sync here, not one per step)
        key_mask = None
    q_index = torch.arange(T, device=dev)
    base_pos = q_index[None].expand(B, T)
    steps = []  # (tokens [B, T], mask [B, T] bool) per TTT step, known before the unroll
    for j in range(k):
        tokens, mask = ttt_inputs(input_ids, loss_mask, attn_mask, j)
        steps.append((tokens, mask & shift_left(in_vocab, 1 + j, False)))
    local = torch.stack([m.sum() for _, m in steps])  # [k] int64
    total_n = count_reduce(local.clone()) if count_reduce is not None else local
    denom = total_n.clamp(min=1)  # [k]
    amax_pad = torch.cat([amax, amax.new_zeros(B, k)], dim=1)  # [B, T+k], shifted by views
    rows = None  # steps >= 1 on every position, or only on the scored ones (rows [B, Tq])
    if k > 1 and scored_only is not False and _eager_layout(drafter, layer, scored_only):
        rows = _scored_rows([m for _, m in steps[1:]])
    hidden, cache = aux, []
    total = torch.zeros((), device=dev)
    losses, accs = [], []
    for j, (tokens, mask) in enumerate(steps):
        p_j = probs[:, 1 + j : 1 + j + T]  # [B, T, draft_vocab] target of x[t+2+j]
        a_j = amax_pad[:, 1 + j : 1 + j + T]  # [B, T] the target's argmax there
        pos, qi = base_pos + j, q_index
        if j == 1 and rows is not None:  # from here on only the rows' positions [B, Tq]
            hidden = _take(hidden, rows.index)  # [B, Tq, H]
        if j >= 1 and rows is not None:
            tokens, mask = _take(tokens, rows.index), _take(mask, rows.index) & rows.valid
            p_j, a_j = _take(p_j, rows.index), _take(a_j, rows.index)  # [B, Tq, V], [B, Tq]
            pos, qi = rows.index + j, rows.index
        out, logits, kv = drafter.step(tokens, hidden, pos, cache, qi, key_mask, layer)
        cache.append(kv)
        hidden = out  # pre-norm output feeds the next step (EAGLE-3)
        m = mask.float()
        lj = (ce(logits, p_j) * m).sum() / denom[j]  # soft cross-entropy [B, T], masked
        total = total + (decay**j) * lj
        with torch.no_grad():
            pred = drafter.draft_to_target(logits.argmax(-1))  # [B, T] target ids
            accs.append(((pred == a_j).float() * m).sum() / denom[j])
        losses.append(lj.detach())
    stats = torch.stack(losses + accs).tolist()  # one device sync for all logged numbers
    return TTTResult(total, stats[:k], stats[k:], local.tolist(), total_n.tolist())


class TTTObjective(torch.nn.Module):
    """The drafter plus its TTT loss as one module, so DDP/FSDP hooks see one forward per step.

    The target's final norm and lm_head (frozen; they turn boundary-N states into the target's
    distribution) are held outside the module tree, so DDP/FSDP neither sync nor shard them.
    """

    def __init__(self, drafter: Eagle3Drafter, target_norm, target_head, k: int, decay: float):
        super().__init__()
        self.drafter = drafter
        self._target = (target_norm, target_head)
        self.k, self.decay = k, decay
        self.fast = {}  # compiled layer / soft_ce (eagle3nb.training.fastpath); empty = eager

    def forward(self, b: dict, count_reduce=None) -> TTTResult:
        """``b``: a batch of :class:`BatchSource` on the training device -> :func:`ttt_loss` result."""
        norm, head = self._target
        return ttt_loss(
            self.drafter,
            b["input_ids"],
            b["aux"],
            b["final"],
            b["loss_mask"],
            b["attn_mask"],
            norm,
            head,
            self.k,
            self.decay,
            count_reduce,
            self.fast.get("layer"),
            self.fast.get("ce", soft_ce),
        )
