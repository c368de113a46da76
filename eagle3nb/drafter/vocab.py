"""The draft vocabulary: ``d2t`` offsets and the ``t2d`` mask, from loss-bearing token counts.

Mirrors SpecForge ``data/preprocessing.py`` (``generate_vocab_mapping_file``) and the format SGLang
``llama_eagle3.py`` / vLLM ``llama_eagle3.py`` load: ``d2t`` int64 ``[draft_vocab]`` holds *offsets*
(target id = draft id + d2t[draft id]; all zeros = identity) and ``t2d`` bool ``[vocab]`` marks the
target ids that are in the draft vocab.
"""

from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["count_loss_tokens", "build_draft_vocab", "check_draft_vocab", "coverage"]


def count_loss_tokens(
    samples: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int
) -> torch.Tensor:
    """Counts ``[vocab]`` int64 of target tokens at loss-bearing positions.

    Args:
        samples: ``(input_ids [T] int64, loss_mask [T] bool/int)`` pairs.

    Raises:
        ValueError: a token id outside ``0..vocab_size-1``.
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in samples:
        ids = torch.as_tensor(ids, dtype=torch.long)
        sel = ids[torch.as_tensor(mask).bool()]
        if sel.numel() and (sel.min() < 0 or sel.max() >= vocab_size):
            raise ValueError(
                f"token id {int(sel.max())} outside the target vocab 0..{vocab_size - 1}"
            )
        counts += torch.bincount(sel, minlength=vocab_size)
    return counts


def build_draft_vocab(
    counts: torch.Tensor, draft_vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the ``draft_vocab_size`` most frequent target ids; ties go to the lower id.

    When fewer distinct tokens were seen than ``draft_vocab_size``, the rest is filled with the lowest
    unseen ids (so every draft id maps to a distinct, valid target id). The chosen ids are sorted.

    Args:
        counts: ``[vocab]`` int64 loss-bearing token counts.
        draft_vocab_size: size of the drafter's lm_head output.

    Returns:
        ``(d2t [draft_vocab] int64 offsets, t2d [vocab] bool)``.

    Raises:
        ValueError: ``draft_vocab_size`` not in ``1..vocab``.
    """
    V = counts.numel()
    if not 1 <= draft_vocab_size <= V:
        raise ValueError(
            f"draft_vocab_size={draft_vocab_size}: must be in 1..{V} (target vocab size)"
        )
    # stable sort on -count keeps lower ids first among equal counts (unseen ids count 0 -> padding)
    order = torch.sort(-counts.to(torch.long), stable=True).indices
    chosen = torch.sort(order[:draft_vocab_size]).values  # [draft_vocab] target ids, ascending
    d2t = chosen - torch.arange(draft_vocab_size)  # offsets
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[chosen] = True
    return d2t.to(torch.long), t2d


def check_draft_vocab(d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """Check that ``d2t`` holds offsets consistent with ``t2d``.

    Raises:
        ValueError: wrong dtypes, a target id out of range, duplicate targets, or a ``t2d`` that
            does not mark exactly the targets of ``d2t`` (e.g. ``d2t`` stored as absolute ids).
    """
    if d2t.dtype != torch.long or t2d.dtype != torch.bool:
        raise ValueError(
            f"d2t must be int64 and t2d bool; got {d2t.dtype} and {t2d.dtype}; rebuild both with build_draft_vocab"
        )
    tgt = torch.arange(d2t.numel()) + d2t
    V = t2d.numel()
    if tgt.min() < 0 or tgt.max() >= V:
        raise ValueError(
            f"d2t maps draft ids to target ids {int(tgt.min())}..{int(tgt.max())}, outside 0..{V - 1}: "
            "d2t must hold offsets (target = draft + d2t[draft]), not absolute ids; rebuild it with build_draft_vocab"
        )
    if torch.unique(tgt).numel() != tgt.numel():
        raise ValueError(
            "d2t maps two draft ids to the same target id; rebuild it with build_draft_vocab"
        )
    mask = torch.zeros(V, dtype=torch.bool)
    mask[tgt] = True
    if not torch.equal(mask, t2d):
        extra = int((mask & ~t2d).sum())
        raise ValueError(
            f"d2t reaches {extra} target ids that t2d does not mark: d2t must hold offsets "
            "(target = draft + d2t[draft]) built together with t2d; rebuild both with build_draft_vocab"
        )


def coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """Fraction of loss-bearing tokens whose id is in the draft vocab (0..1)."""
    total = counts.sum().item()
    return float(counts[t2d].sum().item() / total) if total else 0.0
