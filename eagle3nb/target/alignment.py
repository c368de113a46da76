"""Which boundary did an engine really capture? Compare captured slots with the HF reference.

For the same token ids, every captured aux slot is compared with the Hugging Face reference
residual stream at every boundary 0..N (relative Frobenius error). The best-matching boundary per
slot, against the declared one, gives the verdict: ``matches``, ``off by +k / -k`` or ``no match``
(no boundary within the dtype's tolerance). This is how a layer-id convention is *measured* rather
than trusted from a table (engines changed their rule between versions).
"""

from __future__ import annotations

from typing import Sequence

import torch

from eagle3nb.target.capture import capture_boundaries, n_layers_of


# relative error under which a slot "is" a boundary: float32 kernels agree to ~1e-6; bf16 storage
# alone costs ~4e-3 relative, engine kernels in bf16 a few 1e-2
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def reference_states(model, input_ids: Sequence[int]) -> dict[int, torch.Tensor]:
    """HF reference ``{b: [T, H] float32}`` for every boundary 0..N of one sample."""
    n = n_layers_of(model)  # the text model's layers (wrappers too)
    st = capture_boundaries(
        model, torch.tensor([list(input_ids)], device=next(model.parameters()).device), range(n + 1)
    )
    return {b: t[0].float().cpu() for b, t in st.items()}


def alignment_matrix(
    captured: torch.Tensor, reference: dict[int, torch.Tensor], n_slots: int
) -> tuple[torch.Tensor, list[int]]:
    """Relative error of each captured slot against each reference boundary.

    Args:
        captured: ``[T, n_slots*H]`` aux states from an engine.
        reference: ``{b: [T, H]}`` HF states for the same tokens.

    Returns:
        ``(err [n_slots, len(reference)] float64, boundaries in column order)``;
        err = ||slot - ref_b||_F / ||ref_b||_F.

    Raises:
        ValueError: row count or width does not match the reference.
    """
    bnds = sorted(reference)
    T, H = reference[bnds[0]].shape
    if captured.shape != (T, n_slots * H):
        raise ValueError(
            f"captured shape {tuple(captured.shape)} != (T, n_slots*H) = ({T}, {n_slots * H}): the engine returned other rows or widths than the reference"
        )
    c = captured.double().view(T, n_slots, H)
    err = torch.zeros(n_slots, len(bnds), dtype=torch.float64)
    for j, b in enumerate(bnds):
        r = reference[b].double()
        diff = c - r[:, None, :]  # [T, n_slots, H]
        err[:, j] = diff.pow(2).sum(dim=(0, 2)).sqrt() / r.norm().clamp_min(1e-12)
    return err, bnds


def alignment_verdict(
    err: torch.Tensor, boundaries: list[int], declared: Sequence[int], dtype: str
) -> dict:
    """Best boundary per slot and a verdict against the declared boundaries.

    Returns:
        ``{"measured": [...], "declared": [...], "slots": [{"declared", "measured", "error",
        "verdict"}], "ok": bool, "tolerance": float}``.
    """
    tol = TOLERANCE.get(dtype, 5e-2)
    slots, measured = [], []
    for i, d in enumerate(declared):
        j = int(err[i].argmin())
        e = float(err[i, j])
        m = boundaries[j] if e <= tol else None
        measured.append(m)
        verdict = "no match" if m is None else ("matches" if m == d else f"off by {m - d:+d}")
        slots.append({"declared": int(d), "measured": m, "error": e, "verdict": verdict})
    return {
        "declared": list(declared),
        "measured": measured,
        "slots": slots,
        "ok": all(s["verdict"] == "matches" for s in slots),
        "tolerance": tol,
    }


def boundary_separation(reference: dict[int, torch.Tensor]) -> float:
    """Smallest relative difference between adjacent reference boundaries,
    min_b ||ref_{b+1} - ref_b||_F / ||ref_b||_F: how far apart the states a slot could be named
    by lie (a naming is sound only when this is far above the tolerance)."""
    bnds = sorted(reference)
    return min(
        float(
            (reference[b1].double() - reference[b0].double()).norm()
            / reference[b0].double().norm().clamp_min(1e-12)
        )
        for b0, b1 in zip(bnds, bnds[1:])
    )
