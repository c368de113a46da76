"""The flex-attention TTT path computes the same function as the eager (reference) path.

Second method = the eager path, which tests/training/test_objective.py checks against per-position draft
chains. On CPU in float32: outputs at real positions and the TTT loss (PyTorch has no flex backward
on CPU). On CUDA in float32 (run on the H200 with bench/mfu.py's checks): also every gradient.
"""

import pytest
import torch

from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.training.objective import ttt_loss

pytest.importorskip("torch.nn.attention.flex_attention")


def make(nh=4, nkv=2, seed=0):
    torch.manual_seed(seed)
    c = DrafterConfig(
        hidden_size=16,
        target_hidden_size=12,
        intermediate_size=24,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        head_dim=16,  # flex's GPU kernel needs head_dim >= 16
        vocab_size=23,
        draft_vocab_size=17,
        n_aux=3,
    )
    d = Eagle3Drafter(c, torch.randn(23, 16))
    d.set_vocab(
        torch.tensor([0] * 10 + [6] * 7), torch.tensor([True] * 10 + [False] * 6 + [True] * 7)
    )
    return d


def batch(B, T, lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 23, (B, T), generator=g)
    attn = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()  # right padding
    loss = attn.clone()
    loss[:, :2] = 0
    aux, final = torch.randn(B, T, 36, generator=g), torch.randn(B, T, 12, generator=g)
    return ids, aux, final, loss, attn


def compare(nh, nkv, lengths, dev, grads):
    T, k = 37, 4  # T not a multiple of the 128-token block
    ids, aux, final, loss, attn = (x.to(dev) for x in batch(len(lengths), T, lengths))
    norm, head = torch.nn.Identity(), torch.nn.Linear(12, 23, bias=False)
    torch.manual_seed(5)
    head.weight.data.normal_()
    head.to(dev)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls on both paths
    res = {}
    for impl in ("eager", "flex"):
        d = make(nh, nkv).set_attention(impl).to(dev)
        with torch.set_grad_enabled(grads):
            r = ttt_loss(d, ids, aux, final, loss, attn, norm, head, k=k)
        if grads:
            r.loss.backward()
        # the per-step outputs at real positions, run again step by step
        idx = torch.arange(T)
        hidden, cache, outs = aux, [], []
        with torch.no_grad():
            for j in range(k):
                o, lg, kv = d.step(
                    ids,
                    hidden,
                    (idx + j)[None].expand(len(lengths), T).to(dev),
                    cache,
                    idx.to(dev),
                    attn.bool(),
                )
                cache.append(kv)
                hidden = o
                outs.append(lg[attn.bool()])
        res[impl] = (
            r,
            {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None},
            outs,
        )
    (re, ge, oe), (rf, gf, of) = res["eager"], res["flex"]
    torch.testing.assert_close(rf.loss, re.loss, rtol=1e-5, atol=1e-6)
    assert rf.step_count == re.step_count and rf.step_acc == pytest.approx(re.step_acc, abs=1e-6)
    for a, b in zip(of, oe):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert set(gf) == set(ge) and (len(ge) > 0) == grads
    for n in ge:  # relative error of each gradient as a whole (float32 sums in another order)
        err = ((gf[n] - ge[n]).norm() / ge[n].norm().clamp_min(1e-30)).item()
        assert err < 1e-5, f"grad of {n}: relative error {err:.2e}"


CASES = [(4, 2, [37, 37]), (4, 4, [37, 20]), (4, 1, [37, 5, 30])]


@pytest.mark.parametrize("nh,nkv,lengths", CASES)
def test_flex_equals_eager_steps_and_loss_cpu(nh, nkv, lengths):
    compare(nh, nkv, lengths, "cpu", grads=False)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="flex backward needs CUDA; run on the GPU box"
)
@pytest.mark.parametrize("nh,nkv,lengths", CASES)
def test_flex_equals_eager_with_grads_cuda(nh, nkv, lengths):
    compare(nh, nkv, lengths, "cuda", grads=True)


def test_flex_falls_back_to_eager_for_serve_time_chains():
    """A one-query chain step (Tq != T0) takes the eager path and gives the eager answer."""
    d = make()
    ids, aux, _, _, _ = batch(1, 9, [9])
    idx = torch.arange(9)
    outs = {}
    for impl in ("eager", "flex"):
        d.set_attention(impl)
        o, lg, kv = d.step(ids, aux, idx[None], [], idx)
        o2, lg2, _ = d.step(ids[:, -1:], o[:, -1:], torch.tensor([[9]]), [kv], idx[-1:])
        outs[impl] = (lg, lg2)
    torch.testing.assert_close(outs["flex"][0], outs["eager"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["flex"][1], outs["eager"][1], rtol=1e-5, atol=1e-5)


def test_unknown_attention_impl_is_named():
    with pytest.raises(ValueError, match="'sdpa'.*eager"):
        make().set_attention("sdpa")
