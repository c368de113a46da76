"""Drift across engines and dtypes (02b): the same tokens' states at the same boundaries from
several engines and dtypes, compared with HF float32 (layer offsets are excluded by construction;
those are the alignment check's job)."""

from __future__ import annotations

import torch

from eagle3nb.dataset.read import AuxDataset
from eagle3nb.manifest import read_json
from eagle3nb.rundir import RunDir

DRIFT_REFERENCE = "hf-transformers float32 (reference)"  # the label drift is measured against


def hf_states(model, samples, bnds) -> dict[int, torch.Tensor]:
    """``{b: [sum T, H] float32}`` of an HF model at ``bnds`` over ``samples`` (one at a time)."""
    from eagle3nb.target.capture import capture_boundaries

    dev = next(model.parameters()).device
    st = [capture_boundaries(model, torch.tensor([list(x)], device=dev), bnds) for x in samples]
    return {b: torch.cat([s_[b][0].float().cpu() for s_ in st]) for b in bnds}


def split_aux(aux_rows: list[torch.Tensor], bnds: list[int]) -> dict[int, torch.Tensor]:
    """``{b: [sum T, H] float32}`` from per-sample ``[T, n_aux*H]`` aux rows (slots in ``bnds``
    order)."""
    a = torch.cat([x.float() for x in aux_rows])
    H = a.shape[1] // len(bnds)
    return {b: a[:, i * H : (i + 1) * H] for i, b in enumerate(bnds)}


def other_engine_datasets(
    rd: RunDir, engine_name: str, sample_ids: list[int]
) -> dict[str, dict[int, torch.Tensor]]:
    """Aux states of the same samples from other engines' datasets in this run folder (e.g. vLLM's
    from 02a), keyed ``"<engine> <dtype> (<folder>)"``, ``{boundary: [n, H]}``."""
    from eagle3nb.dataset.read import DATASET_KIND

    out = {}
    for mf in sorted(rd.root.glob("*/manifest.json")):
        try:
            man = read_json(mf)
            other = man.get("engine", {}).get("name") != engine_name
            if man.get("kind") != DATASET_KIND or not man.get("complete") or not other:
                continue
            ds = AuxDataset(mf.parent)
        except (OSError, ValueError):
            continue
        by_id = {it["sample_id"]: it for it in ds}
        if not all(i in by_id for i in sample_ids):
            continue
        label = f"{man['engine']['name']} {man.get('dtype')} ({mf.parent.name})"
        aux = [by_id[i]["aux"] for i in sample_ids]
        out[label] = split_aux(aux, list(man["aux_boundaries"]))
    return out


def drift_summary(drift: dict, bnds: list[int]) -> dict:
    """``{label: {str(b): median over tokens of |x - ref| / |ref|}}`` against the HF float32
    reference ({} without drift)."""
    if not drift:
        return {}
    ref = drift[DRIFT_REFERENCE]

    def median_rel(x: torch.Tensor, r: torch.Tensor) -> float:
        return round(float(((x - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-12)).median()), 6)

    return {
        lab: {str(b): median_rel(st[b], ref[b]) for b in bnds if b in st}
        for lab, st in drift.items()
        if lab != DRIFT_REFERENCE
    }
