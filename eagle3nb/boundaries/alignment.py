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


# relative error under which a slot "is" a boundary: float32 kernels agree to ~1e-6; bf16 storage
# alone costs ~4e-3 relative, engine kernels in bf16 a few 1e-2
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
# an engine on CUDA: its float32 kernels use TF32 dots (Triton attention's tl.dot default):
# vLLM 0.26.0 on an H200 matched HF float32 to 1.3e-3 at every boundary, adjacent boundaries
# >= 0.45 apart (../shared/reference/gpu_engines_h200.md); bfloat16 there 2.1e-2
TOLERANCE_CUDA = {"float32": 1e-2, "float16": 2e-2, "bfloat16": 5e-2}
# half precision above the tolerance: still the nearest boundary when this many times nearer than
# any other (adjacent boundaries of a deep target lie ~0.2 apart), up to this error
DRIFT_SEPARATION, DRIFT_MAX = 3.0, 0.25


def tolerance(dtype: str, device: str = "cpu") -> float:
    """Relative error under which a captured slot "is" a boundary, for an engine that ran in
    ``dtype`` on ``device`` (``cpu``, ``cuda``, ``cuda:N``): :data:`TOLERANCE`, or
    :data:`TOLERANCE_CUDA` on a GPU; 5e-2 for a dtype neither names."""
    table = TOLERANCE_CUDA if str(device).startswith("cuda") else TOLERANCE
    return table.get(dtype, 5e-2)


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
    c = captured.double().reshape(T, n_slots, H)  # captured may be a view (vLLM backend)
    err = torch.zeros(n_slots, len(bnds), dtype=torch.float64)
    for j, b in enumerate(bnds):
        r = reference[b].double()
        diff = c - r[:, None, :]  # [T, n_slots, H]
        err[:, j] = diff.pow(2).sum(dim=(0, 2)).sqrt() / r.norm().clamp_min(1e-12)
    return err, bnds


def alignment_verdict(
    err: torch.Tensor,
    boundaries: list[int],
    declared: Sequence[int],
    dtype: str,
    device: str = "cpu",
) -> dict:
    """Best boundary per slot and a verdict against the declared boundaries (tolerance
    :func:`tolerance` of ``dtype`` on the capturing engine's ``device``).

    In bfloat16/float16 a slot above the tolerance still names its nearest boundary when that
    boundary is at least :data:`DRIFT_SEPARATION` times nearer than any other and the error is at
    most :data:`DRIFT_MAX`: verdict ``matches (drift)`` / ``off by ...``, ``"drift": True``. Deep
    targets need this: half-precision kernels of two engines drift apart with depth (a random
    Llama-3.1-8B-shaped target in bf16 on an H200 exceeded 5e-2 at boundary 29 of 32 while
    boundaries 2 and 16 matched, bench/h200_2026-12-04/workbook_llama-3.1-8b.json), and naming
    the boundary, not the drift, is what this check is for (05_drift measures the drift). Float32
    keeps the plain tolerance: there a slot that far off means another computation.

    Returns:
        ``{"measured": [...], "declared": [...], "slots": [{"declared", "measured", "error",
        "next_error", "drift", "verdict"}], "ok": bool, "tolerance": float}``.
    """
    tol = tolerance(dtype, device)
    slots, measured = [], []
    for i, d in enumerate(declared):
        row = err[i]
        j = int(row.argmin())
        e = float(row[j])
        nxt = float(row[torch.arange(len(row)) != j].min()) if len(row) > 1 else float("inf")
        drift = e > tol and dtype in ("bfloat16", "float16") and e <= DRIFT_MAX
        drift = drift and e * DRIFT_SEPARATION <= nxt
        m = boundaries[j] if e <= tol or drift else None
        measured.append(m)
        verdict = "no match" if m is None else ("matches" if m == d else f"off by {m - d:+d}")
        verdict += " (drift)" if drift else ""
        slots.append({"declared": int(d), "measured": m, "error": e, "next_error": nxt,
            "drift": drift, "verdict": verdict})  # fmt: skip
    return {
        "declared": list(declared),
        "measured": measured,
        "slots": slots,
        "ok": all(s["measured"] == s["declared"] for s in slots),
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
