"""eagle3nb.training.objective (the TTT loss): step inputs by hand, target probabilities restricted to the
draft vocab, TTT attention equal to per-position chains, an empty mask gives 0 not NaN."""

import math

import torch

from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.training.objective import shift_left, target_probs, ttt_inputs, ttt_loss


def tiny_drafter(seed=0, vocab=11, dv=11):
    torch.manual_seed(seed)
    c = DrafterConfig(
        hidden_size=8,
        target_hidden_size=6,
        intermediate_size=12,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        vocab_size=vocab,
        draft_vocab_size=dv,
        n_aux=3,
    )
    return Eagle3Drafter(c, torch.randn(vocab, 8))


def test_ttt_step_inputs_hand_example():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    loss = torch.tensor([[0, 0, 1, 1, 1, 1]])  # prompt 10, 11; continuation 12..15
    attn = torch.ones_like(ids)
    tok0, m0 = ttt_inputs(ids, loss, attn, 0)
    # step 0 at position t reads x[t+1] and is scored on the prediction of x[t+2]
    assert tok0.tolist() == [[11, 12, 13, 14, 15, 0]]
    assert m0.tolist() == [[True, True, True, True, False, False]]
    tok2, m2 = ttt_inputs(ids, loss, attn, 2)
    assert tok2.tolist() == [[13, 14, 15, 0, 0, 0]]
    assert m2.tolist() == [[True, True, False, False, False, False]]
    # padding never scores
    attn_p = torch.tensor([[1, 1, 1, 1, 0, 0]])
    _, mp = ttt_inputs(ids, loss, attn_p, 0)
    assert mp.tolist() == [[True, True, False, False, False, False]]
    assert shift_left(torch.tensor([[1, 2, 3]]), 1, -1).tolist() == [[2, 3, -1]]


def test_target_probs_restricted_to_draft_vocab():
    norm = torch.nn.Identity()
    head = torch.nn.Linear(2, 4, bias=False)
    head.weight.data = torch.tensor([[1.0, 0], [0, 1], [2, 0], [0, 0]])
    final = torch.tensor([[[1.0, 0.5]]])  # logits [1, .5, 2, 0]
    d2t = torch.tensor([0, 1])  # draft {0 -> 0, 1 -> 2}
    t2d = torch.tensor([True, False, True, False])
    p, inv, amax = target_probs(final, norm, head, t2d, d2t)
    e = torch.tensor([math.exp(1), math.exp(2)])
    torch.testing.assert_close(p[0, 0], e / e.sum())
    assert amax.item() == 2 and inv.item() is True


def naive_ttt_logits(d, ids, aux, k):
    """Second method: run each (t, j) chain separately, attention written out per key."""
    T = ids.shape[1]
    out = torch.zeros(k, T, d.config.draft_vocab_size)
    # full recompute per target position t: step 0 for all s <= t, then chain j at t only
    for t in range(T):
        idx = torch.arange(t + 1)
        tok0 = shift_left(ids, 1)[:, : t + 1]
        o, lg, kv = d.step(tok0, aux[:, : t + 1], idx[None], [], idx)
        out[0, t] = lg[0, t]
        cache, hidden = [kv], o[:, t : t + 1]
        for j in range(1, k):
            tok = shift_left(ids, 1 + j)[:, t : t + 1]
            o, lg, kv = d.step(tok, hidden, torch.tensor([[t + j]]), cache, torch.tensor([t]))
            cache.append(kv)
            out[j, t] = lg[0, 0]
            hidden = o
    return out


def test_ttt_attention_matches_per_position_chains():
    """The batched TTT forward (all positions, diagonal cache) equals running each position's
    draft chain on its own, the way the serving engine does."""
    d = tiny_drafter()
    T, k = 7, 3
    ids = torch.randint(0, 11, (1, T))
    aux = torch.randn(1, T, 18)
    # batched: steps over all positions, keys of later steps at the same position only
    idx = torch.arange(T)
    hidden, cache, batched = aux, [], []
    for j in range(k):
        o, lg, kv = d.step(shift_left(ids, 1 + j), hidden, (idx + j)[None], cache, idx)
        cache.append(kv)
        hidden = o
        batched.append(lg[0])
    naive = naive_ttt_logits(d, ids, aux, k)
    for j in range(k):
        torch.testing.assert_close(batched[j], naive[j], atol=1e-5, rtol=1e-5)


def test_empty_mask_gives_zero_loss_not_nan():
    d = tiny_drafter()
    norm, head = torch.nn.Identity(), torch.nn.Linear(6, 11, bias=False)
    ids = torch.randint(0, 11, (2, 5))
    r = ttt_loss(
        d,
        ids,
        torch.randn(2, 5, 18),
        torch.randn(2, 5, 6),
        torch.zeros(2, 5),
        torch.ones(2, 5),
        norm,
        head,
        k=3,
    )
    assert r.loss.item() == 0.0 and r.step_count == [0, 0, 0]
    r = ttt_loss(
        d,
        ids,
        torch.randn(2, 5, 18),
        torch.randn(2, 5, 6),
        torch.ones(2, 5),
        torch.ones(2, 5),
        norm,
        head,
        k=3,
    )
    assert math.isfinite(r.loss.item()) and r.loss.item() > 0
    r.loss.backward()
    assert d.fc.weight.grad is not None and d.embed_tokens.weight.grad is None  # embeddings frozen


def test_scored_positions_only_gives_the_loss_and_gradients_of_every_position():
    """TTT steps 1..k-1 on the scored positions only (the default on the eager path) against the
    same loss computed on every position: prompts of different lengths, a scored span in the
    middle of a row (a later turn), padding, a draft vocab half the target's, GQA."""
    d = tiny_drafter(seed=3, vocab=11, dv=6)
    d.set_vocab(
        torch.tensor([0, 1, 2, 4, 5, 7]) - torch.arange(6), torch.zeros(11, dtype=torch.bool)
    )
    d.t2d[[0, 1, 3, 5, 6, 8]] = True
    norm, head = torch.nn.Identity(), torch.nn.Linear(6, 11, bias=False)
    B, T, k = 3, 16, 4
    ids = torch.randint(0, 11, (B, T))
    aux, final = torch.randn(B, T, 18), torch.randn(B, T, 6)
    loss_mask, attn = torch.zeros(B, T), torch.ones(B, T)
    loss_mask[0, 3:] = 1  # prompt of 3
    loss_mask[1, 9:12] = 1  # one scored span in the middle (a later turn)
    loss_mask[2, 6:13] = 1
    attn[2, 13:] = 0  # padding
    shapes = []
    step = d.step

    def spy(tokens, *a, **kw):
        shapes.append(tuple(tokens.shape))
        return step(tokens, *a, **kw)

    d.step = spy
    res, grads = {}, {}
    for so in (False, None):
        d.zero_grad()
        r = ttt_loss(d, ids, aux, final, loss_mask, attn, norm, head, k=k, scored_only=so)
        r.loss.backward()
        res[so] = r
        grads[so] = {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}
    assert shapes[:k] == [(B, T)] * k  # every position at every step
    # scored only: step 0 on all; steps >= 1 on the widest row's scored positions, fewer than T
    tq = shapes[k + 1][1]
    assert shapes[k:] == [(B, T)] + [(B, tq)] * (k - 1) and tq < T
    a, b = res[False], res[None]
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.tensor(b.step_loss), torch.tensor(a.step_loss))
    assert b.step_acc == a.step_acc and b.step_count == a.step_count and sum(a.step_count) > 0
    assert grads[False].keys() == grads[None].keys() and len(grads[None]) > 5
    for n, g in grads[False].items():
        torch.testing.assert_close(grads[None][n], g, rtol=1e-5, atol=1e-6, msg=n)


def test_scored_only_refused_where_every_position_is_needed():
    d = tiny_drafter().set_attention("flex")
    norm, head = torch.nn.Identity(), torch.nn.Linear(6, 11, bias=False)
    ids = torch.randint(0, 11, (1, 5))
    args = (d, ids, torch.randn(1, 5, 18), torch.randn(1, 5, 6), torch.ones(1, 5), torch.ones(1, 5))
    try:
        ttt_loss(*args, norm, head, k=2, scored_only=True)
    except ValueError as e:
        assert "scored_only=True" in str(e)
    else:
        raise AssertionError("scored_only=True with flex attention was not refused")
