"""eagle3nb.boundaries.alignment: captured slots are measured at their boundaries against the HF reference;
noise beyond the dtype's tolerance is no match."""

import torch

from eagle3nb.viz.plots import alignment_figure
from eagle3nb.boundaries.alignment import alignment_matrix, alignment_verdict
from eagle3nb.target.capture import reference_states
from eagle3nb.target.capture import HFCaptureEngine


def test_sglang_ids_measured_at_their_boundaries(target):
    model, tok, _ = target
    ids = tok("Once upon a time, there was a little dog named Max.").input_ids
    ref = reference_states(model, ids)
    cap = HFCaptureEngine(model, "sglang").capture([ids], [0, 1, 3])[0].aux
    err, bnds = alignment_matrix(cap, ref, 3)
    assert bnds == [0, 1, 2, 3, 4, 5]
    assert err[0, 1] == 0 and err[1, 2] == 0 and err[2, 4] == 0  # exact in float32
    v = alignment_verdict(err, bnds, [1, 2, 4], "float32")
    assert v["ok"] and v["measured"] == [1, 2, 4]
    # the same capture declared with vLLM's reading of ids [0, 1, 3] is off by +1
    v2 = alignment_verdict(err, bnds, [0, 1, 3], "float32")
    assert not v2["ok"] and [s["verdict"] for s in v2["slots"]] == [
        "off by +1",
        "off by +1",
        "off by +1",
    ]
    assert alignment_figure(err, bnds, [1, 2, 4], "hf-transformers").data[0].z is not None


def test_noise_beyond_tolerance_is_no_match_and_bf16_within(target):
    model, tok, _ = target
    ids = tok("Tom and Sam went to the park.").input_ids
    ref = reference_states(model, ids)
    exact = torch.cat([ref[1], ref[2]], -1)
    bf16 = exact.to(torch.bfloat16).float()
    err, bnds = alignment_matrix(bf16, ref, 2)
    assert alignment_verdict(err, bnds, [1, 2], "bfloat16")["ok"]
    assert not alignment_verdict(err, bnds, [1, 2], "float32")[
        "ok"
    ]  # bf16 rounding is not float32-exact
    noisy = exact + 0.5 * exact.std() * torch.randn_like(exact)
    err, bnds = alignment_matrix(noisy, ref, 2)
    assert [s["verdict"] for s in alignment_verdict(err, bnds, [1, 2], "bfloat16")["slots"]] == [
        "no match",
        "no match",
    ]


def test_half_precision_drift_names_the_nearest_boundary_only_when_far_nearer():
    """Above the tolerance, bf16 still names a boundary 3x nearer than any other (deep targets
    drift with depth); a slot halfway between two boundaries, or any float32 slot, does not."""
    bnds = [0, 1, 2, 3]
    err = torch.tensor(
        [
            [0.9, 0.01, 0.4, 0.6],  # within tolerance
            [0.7, 0.5, 0.07, 0.22],  # drift: 0.07 > 0.05, next 0.22 >= 3 * 0.07
            [0.8, 0.6, 0.09, 0.12],  # not separated: 0.12 < 3 * 0.09
        ],
        dtype=torch.float64,
    )
    v = alignment_verdict(err, bnds, [1, 2, 2], "bfloat16")
    assert [s["measured"] for s in v["slots"]] == [1, 2, None]
    assert [s["verdict"] for s in v["slots"]] == ["matches", "matches (drift)", "no match"]
    assert [s["drift"] for s in v["slots"]] == [False, True, False]
    assert v["slots"][1]["next_error"] == 0.22 and not v["ok"]
    assert alignment_verdict(err[:2], bnds, [1, 2], "bfloat16")["ok"]
    # drift off by one is still off by one, and float32 has no drift allowance
    assert alignment_verdict(err[1:2], bnds, [3], "bfloat16")["slots"][0]["verdict"] == (
        "off by -1 (drift)"
    )
    assert alignment_verdict(err[1:2], bnds, [2], "float32")["measured"] == [None]
    too_far = torch.tensor([[0.9, 0.9, 0.3, 0.95]], dtype=torch.float64)  # above DRIFT_MAX
    assert alignment_verdict(too_far, bnds, [2], "bfloat16")["measured"] == [None]
