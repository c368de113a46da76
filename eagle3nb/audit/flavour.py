"""The audit's reading of a drafter's EAGLE-3.1 flavour: which flavour its config names (the same
to every engine eagle3nb reads, :data:`eagle3nb.boundaries.flavours.FLAG_READS`), and tau of the same
weights read as the other flavour (``fc_norm`` <-> ``norm_before_fc``), the mix-up of the two
"3.1"s measured like the layer offset."""

from __future__ import annotations

from typing import Sequence

from eagle3nb.audit.measure import measure_candidates
from eagle3nb.drafter.model import flavour_of, swapped_drafter

__all__ = ["flavour_reading"]


def flavour_reading(
    target, drafter, boundaries: Sequence[int], prompts_ids, k: int, max_new_tokens: int, eos
) -> dict:
    """``{"flavour", "swapped": None | {"flavour", "boundaries", "tau", "cycles",
    "per_position_acceptance"}}``: the drafter's flavour (:func:`eagle3nb.drafter.model.flavour_of`)
    and, when it has another, tau of its weights read as that one at ``boundaries`` over the same
    prompts (:func:`eagle3nb.audit.measure.measure_candidates`)."""
    out = {"flavour": flavour_of(drafter.config), "swapped": None}
    other = swapped_drafter(drafter)
    if other is not None:
        row = measure_candidates(
            target, other.eval(), [list(boundaries)], prompts_ids, k, max_new_tokens, eos
        )[0]
        keep = ("boundaries", "tau", "cycles", "per_position_acceptance")
        out["swapped"] = {"flavour": flavour_of(other.config), **{x: row[x] for x in keep}}
    return out
