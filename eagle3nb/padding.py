"""Right padding: ragged per-sample tensors -> one ``[B, L, ...]`` batch plus its attention mask.

Every right-padded batch in eagle3nb (the stored dataset's ``collate``, the online source's batch,
HF capture, the HF final state, the capture-overhead benchmark) is built here. It imports only
torch, so any layer (target, dataset, training, drafter, text, engines, steps) may use it.

Generation pads on the left instead (:func:`eagle3nb.text.generation.generate_batch`: HF
``generate`` appends after the last column, so every prompt must end there) and keeps its own
loop; capture and training need right padding (positions 0..T-1 of each row are its tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["pad_right"]


def pad_right(
    seqs: Sequence[torch.Tensor | Sequence[int]],
    pad_value: float = 0,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ragged samples into a right-padded batch.

    Args:
        seqs: B samples, each a tensor ``[T_i, *rest]`` (same ``rest`` and any dtype) or a list
            of token ids (read as ``[T_i]`` int64). ``T_i`` may be 0.
        pad_value: value written after each sample's ``T_i`` rows.
        dtype: dtype of the batch (samples are cast into it); None = the first sample's dtype.

    Returns:
        ``(padded [B, L, *rest] dtype, mask [B, L] int64)`` on the CPU, with ``L = max T_i``;
        row ``r`` holds sample ``r`` in ``padded[r, :T_r]`` and ``pad_value`` after it, and
        ``mask[r, t]`` is 1 for ``t < T_r`` (a token), else 0 (padding).

    Raises:
        ValueError: no samples, or samples whose trailing shapes ``rest`` differ.
    """
    rows = [
        s if isinstance(s, torch.Tensor) else torch.tensor(list(s), dtype=torch.long) for s in seqs
    ]
    if not rows:
        raise ValueError("pad_right got no samples: a batch needs at least one")
    rest = tuple(rows[0].shape[1:])
    if any(tuple(r.shape[1:]) != rest for r in rows):
        shapes = sorted({tuple(r.shape[1:]) for r in rows})
        raise ValueError(f"pad_right: samples differ in trailing shapes {shapes}; only dim 0 may")
    L = max(r.shape[0] for r in rows)
    dtype = rows[0].dtype if dtype is None else dtype
    padded = torch.full((len(rows), L, *rest), pad_value, dtype=dtype)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for r, x in enumerate(rows):
        padded[r, : x.shape[0]] = x
        mask[r, : x.shape[0]] = 1
    return padded, mask
