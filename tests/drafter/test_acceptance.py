"""eagle3nb.drafter.acceptance (the speculative-decoding simulator): tau and a_i by hand, output equal to plain
greedy, the serve-time draft chain equal to the TTT forward, and the verifier's bookkeeping."""

import torch

from eagle3nb.drafter.acceptance import (
    AcceptanceStats,
    draft_chain,
    evaluate_acceptance,
    greedy_generate,
    speculative_generate,
)
from eagle3nb.target.capture import capture_boundaries
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.training.objective import shift_left


def drafter_for(model, seed=0, dv=512):
    torch.manual_seed(seed)
    c = DrafterConfig.for_target(model.config, dv)
    return Eagle3Drafter(c, model.get_input_embeddings().weight.detach()).eval()


def test_stats_hand_example():
    s = AcceptanceStats(k=5)
    for m in [0, 2, 5, 1]:
        s.add(m)
    r = s.summary()
    assert r["per_position_acceptance"] == [3 / 4, 2 / 4, 1 / 4, 1 / 4, 1 / 4]
    assert r["tau"] == 1 + 8 / 4
    assert r["draft_acceptance_rate"] == 8 / 20


def test_output_equals_plain_greedy_untrained_drafter(target):
    model, tok, _ = target
    d = drafter_for(model)
    for text in ["Once upon a time, there was a", "Tom and Sam went to the"]:
        p = tok(text).input_ids
        new, st = speculative_generate(
            model, d, p, [1, 2, 4], k=4, max_new_tokens=40, eos_token_id=tok.eos_token_id
        )
        assert new == greedy_generate(model, p, 40, tok.eos_token_id)
        assert st.cycles > 0 and st.emitted_tokens == len(new)


def test_draft_chain_equals_ttt_forward(target):
    """Serve-time drafting (draft_chain) and the training forward give the same drafts when the
    training forward is teacher-forced with those drafts (a second method for the same function)."""
    model, tok, _ = target
    d = drafter_for(model, seed=3)
    ids = torch.tensor(tok("Lily and Ben found a little cat in the").input_ids)
    n = ids.numel() - 1
    st = capture_boundaries(model, ids[None], [1, 2, 4])
    aux = torch.cat([st[b][0, :n] for b in (1, 2, 4)], -1)  # positions 0..n-1
    k = 4
    drafts = draft_chain(d, ids, aux, k)
    seq = torch.cat([ids, torch.tensor(drafts)])[None]  # x_0..x_n, d_1..d_k
    T = n
    idx = torch.arange(T)
    hidden, cache = aux[None], []
    for j in range(k):
        o, lg, kv = d.step(shift_left(seq, 1 + j)[:, :T], hidden, (idx + j)[None], cache, idx)
        cache.append(kv)
        hidden = o
        assert int(d.draft_to_target(lg[0, T - 1].argmax())) == drafts[j]


def test_evaluate_reports_consistent_numbers(target):
    model, tok, _ = target
    d = drafter_for(model)
    prompts = [tok("One day, a big dog").input_ids]
    r = evaluate_acceptance(
        model, d, prompts, [1, 2, 4], k=3, max_new_tokens=12, eos_token_id=tok.eos_token_id
    )
    a = r["per_position_acceptance"]
    assert r["greedy_mismatches"] == []
    assert abs(r["tau"] - (1 + sum(a))) < 1e-12
    assert all(x >= y for x, y in zip(a, a[1:]))


def test_verifier_bookkeeping_with_fake_oracle_drafts(target, monkeypatch):
    """A fake draft chain (tests only) that proposes the target's true greedy tokens for the first
    ``right`` positions and a wrong token after: every full cycle must accept exactly ``right``."""
    import eagle3nb.drafter.acceptance as acc

    model, tok, _ = target
    p = tok("Once upon a time, there was a little girl named Lily.").input_ids
    truth = greedy_generate(model, p, 60, None)
    k, right = 4, 2

    def fake_oracle_draft_chain(drafter, tokens, aux, k_):
        done = tokens.numel() - len(p)  # generated tokens so far (the newest is the last bonus)
        nxt = truth[done : done + k_]
        return [t if i < right else (t + 1) % 512 for i, t in enumerate(nxt)]

    monkeypatch.setattr(acc, "draft_chain", fake_oracle_draft_chain)
    new, st = acc.speculative_generate(
        model, None, p, [1, 2, 4], k=k, max_new_tokens=60, eos_token_id=None
    )
    assert new == truth
    # each cycle emits right + 1 tokens; the last cycle may be cut by max_new_tokens
    assert st.accepted_per_pos == [st.cycles, st.cycles, 0, 0]
    assert st.cycles == -(-(60 - 1) // (right + 1))
