"""Which flex function a TTT attention call runs, before and after a compile in the same process.

The bug this guards against: a module-level compiled flex handle, filled lazily while
``torch.compile`` traced a decoder layer, kept the plain (unfused, scores-in-memory) function, so
every later uncompiled CUDA call ran the reference path. Now the choice is made per call
(``pick_flex``) and each attention module owns its compiled handle, made outside any compile.
"""

import pytest
import torch

from eagle3nb.drafter.flex_attention import flex_attention, pick_flex
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.training.objective import ttt_loss


def _drafter(seed=0):
    c = DrafterConfig(
        hidden_size=64,
        target_hidden_size=64,
        intermediate_size=96,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=100,
        draft_vocab_size=100,
    )
    torch.manual_seed(seed)
    return Eagle3Drafter(c).set_attention("flex")


def _is_compiled_flex(fn) -> bool:
    """A torch.compile wrapper around flex_attention (not flex_attention itself)."""
    return fn is not flex_attention and getattr(fn, "_torchdynamo_orig_callable", None) is (
        flex_attention
    )


def test_compile_then_uncompiled_cuda_call_gets_the_compiled_handle():
    d = _drafter()
    attn = d.midlayer.self_attn
    chosen = []

    @torch.compile(backend="eager")  # traces like the layer compile (no C++ toolchain needed)
    def traced(x):
        chosen.append(attn.flex_fn(True))  # a CUDA call inside a compiled region
        return x + 1

    traced(torch.ones(3))
    assert chosen == [flex_attention]  # traced into the enclosing graph, nothing stored
    assert attn._flex == []
    after = attn.flex_fn(True)  # the same module, uncompiled CUDA call, same process
    assert _is_compiled_flex(after)
    assert attn.flex_fn(True) is after  # one handle per module, reused
    other = _drafter(1).midlayer.self_attn.flex_fn(True)  # another drafter: its own handle
    assert _is_compiled_flex(other) and other is not after
    assert attn.flex_fn(False) is flex_attention  # CPU: the plain function
    assert pick_flex(True, None) is flex_attention and pick_flex(True, after) is after


def test_compiled_layer_then_uncompiled_same_loss_on_cpu():
    """A compiled decoder layer (eager backend) inside ttt_loss, then the plain layer in the same
    process: the same losses (flex forward on CPU, no gradients: as evaluation runs)."""
    d = _drafter()
    g = torch.Generator().manual_seed(3)
    B, T, H = 2, 16, 64
    ids = torch.randint(0, 100, (B, T), generator=g)
    aux = torch.randn(B, T, 3 * H, generator=g)
    final = torch.randn(B, T, H, generator=g)
    ones = torch.ones(B, T, dtype=torch.long)
    norm = torch.nn.Identity()
    head = torch.nn.Linear(H, 100, bias=False)
    layer = torch.compile(d.midlayer, backend="eager", dynamic=False)
    with torch.no_grad():
        r_c = ttt_loss(d, ids, aux, final, ones, ones, norm, head, 3, layer=layer)
        r_p = ttt_loss(d, ids, aux, final, ones, ones, norm, head, 3)
        d.set_attention("eager")
        r_e = ttt_loss(d, ids, aux, final, ones, ones, norm, head, 3)
    assert d.midlayer.self_attn._flex == []  # CPU never makes a compiled handle
    assert r_c.step_loss == r_p.step_loss
    for a, b in zip(r_p.step_loss, r_e.step_loss):  # flex == eager (the reference)
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (compiled flex kernels)")
def test_cuda_compiled_layer_then_uncompiled_call_runs_the_compiled_handle():
    """On CUDA: train one step through a compiled layer (inductor), then one uncompiled step in
    the same process; the uncompiled step calls this module's compiled flex handle (counted by a
    spy around it) and gives the same loss."""
    d = _drafter().cuda()
    attn = d.midlayer.self_attn
    g = torch.Generator(device="cuda").manual_seed(3)
    B, T, H = 2, 256, 64
    ids = torch.randint(0, 100, (B, T), generator=g, device="cuda")
    aux = torch.randn(B, T, 3 * H, generator=g, device="cuda")
    final = torch.randn(B, T, H, generator=g, device="cuda")
    ones = torch.ones(B, T, dtype=torch.long, device="cuda")
    norm, head = torch.nn.Identity(), torch.nn.Linear(H, 100, bias=False).cuda()
    layer = torch.compile(d.midlayer, dynamic=False)
    r_c = ttt_loss(d, ids, aux, final, ones, ones, norm, head, 1, layer=layer)
    r_c.loss.backward()
    handle = attn.flex_fn(True)
    assert _is_compiled_flex(handle)
    calls = []

    def spy(*a, **kw):
        calls.append(1)
        return handle(*a, **kw)

    attn._flex[0] = spy
    r_p = ttt_loss(d, ids, aux, final, ones, ones, norm, head, 1)
    r_p.loss.backward()
    assert calls == [1]
    assert abs(r_p.step_loss[0] - r_c.step_loss[0]) <= 1e-4 * abs(r_c.step_loss[0])


def test_a_compiled_handle_may_hold_a_graph_per_step_and_length():
    """Past torch.compile's default of 8 graphs per function dynamo would silently run flex
    attention uncompiled (the unfused reference): 7 TTT steps at two lengths already are 14."""
    cfg = torch._dynamo.config
    old = cfg.recompile_limit, cfg.accumulated_recompile_limit
    try:
        cfg.recompile_limit, cfg.accumulated_recompile_limit = 8, 256
        _drafter().midlayer.self_attn.flex_fn(True)  # makes the module's handle
        assert cfg.recompile_limit >= 7 * 64 and cfg.accumulated_recompile_limit >= 4 * 7 * 64
    finally:
        cfg.recompile_limit, cfg.accumulated_recompile_limit = old
