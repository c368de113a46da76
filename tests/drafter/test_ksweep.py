"""Conditional acceptance c_i = a_i / a_{i-1} against a hand computation on a fixed cycle list, and
the k sweep (eagle3nb.drafter.ksweep): its tau, a_i and cycle counts at k' equal the simulator run
with k' drafts per cycle (a drafter that is a deterministic function of the verified prefix, with
planted misses, and the real random-init drafter), tau(k=5) included."""

import pytest
import torch

from eagle3nb.drafter import acceptance, ksweep
from eagle3nb.drafter.acceptance import AcceptanceStats, conditional_acceptance, evaluate_acceptance
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from testkit import counts_by_chains, planted_draft_chain

PROMPTS = ["Once upon a time, there was a", "Tom and Sam went to the", "One day, a big dog"]


def test_conditional_acceptance_hand_computation():
    s = AcceptanceStats(k=4)
    for m in [0, 2, 4, 1, 3, 2]:  # accepted drafts per cycle
        s.add(m)
    r = s.summary()
    # position i accepted in cycles with m >= i: 5, 4, 2, 1 of 6
    assert r["per_position_acceptance"] == [5 / 6, 4 / 6, 2 / 6, 1 / 6]
    assert r["conditional_acceptance"] == pytest.approx([5 / 6, 4 / 5, 2 / 4, 1 / 2])
    c = r["conditional_acceptance"]
    assert r["tau"] == pytest.approx(
        1 + c[0] + c[0] * c[1] + c[0] * c[1] * c[2] + c[0] * c[1] * c[2] * c[3]
    )
    assert conditional_acceptance([0.5, 0.0, 0.0]) == [0.5, 0.0, None]


def _planted_drafter(model, prompts, k_max, max_new):
    """A draft_chain stand-in: the target's greedy continuation with a miss planted at a position
    that depends only on how many tokens were emitted (a function of the state, as real drafting)."""
    greedy = {tuple(p): ksweep._greedy_unstopped(model, p, max_new + k_max + 2) for p in prompts}
    return planted_draft_chain(greedy, lambda j, k: (j * 7 + 3) % (k_max + 2))


@pytest.mark.slow  # over 20 s on a 2-core box (2026-12-04)
def test_sweep_equals_separate_simulator_runs_planted(target, monkeypatch):
    model, tok, _ = target
    prompts = [tok(t).input_ids for t in PROMPTS]
    k, max_new, eos = 5, 30, tok.eos_token_id
    fake = _planted_drafter(model, prompts, k, max_new)
    monkeypatch.setattr(acceptance, "draft_chain", fake)
    monkeypatch.setattr(ksweep, "accepted_counts", counts_by_chains(fake))
    torch.manual_seed(0)
    d = Eagle3Drafter(DrafterConfig.for_target(model.config, 512), None).eval()
    sweep = ksweep.k_sweep(model, d, prompts, [1, 2, 4], k, max_new, eos)
    assert sweep[k]["tau"] > 2  # the planted drafter accepts a lot: the walk is exercised
    for kk in (1, 2, 3, k):
        sim = evaluate_acceptance(model, d, prompts, [1, 2, 4], kk, max_new, eos)
        assert sim["greedy_mismatches"] == []
        for key in ("cycles", "tau", "per_position_acceptance", "emitted_tokens"):
            assert sweep[kk][key] == pytest.approx(sim[key]), (kk, key)
    # truncating one set of k-cycles at k' would not give these numbers (see the module docstring)
    assert sweep[1]["cycles"] != sweep[k]["cycles"]


@pytest.mark.slow  # over 20 s on a 2-core box (2026-12-04)
def test_sweep_tau_at_k_equals_simulator_real_drafter(target):
    model, tok, _ = target
    prompts = [tok(t).input_ids for t in PROMPTS]
    torch.manual_seed(0)
    emb = model.get_input_embeddings().weight.detach()
    d = Eagle3Drafter(DrafterConfig.for_target(model.config, 512), emb).eval()
    sweep = ksweep.k_sweep(model, d, prompts, [1, 2, 4], 5, 24, tok.eos_token_id)
    sim = evaluate_acceptance(model, d, prompts, [1, 2, 4], 5, 24, tok.eos_token_id)
    assert sweep[5]["tau"] == sim["tau"] and sweep[5]["cycles"] == sim["cycles"]
    rates = [sweep[kk]["draft_acceptance_rate"] for kk in range(1, 6)]
    assert all(0 <= r <= 1 for r in rates)
