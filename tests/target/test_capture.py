"""eagle3nb.target.capture: hooks return HF's hidden_states[b], cloned, equal padded and one by one, at
the boundaries each convention's ids name."""

import threading

import pytest
import torch

from eagle3nb.target.capture import HFCaptureEngine, capture_boundaries


def test_boundaries_equal_hf_hidden_states(target):
    model, tok, _ = target
    ids = tok(
        ["Once upon a time, there was a little dog named Max."], return_tensors="pt"
    ).input_ids
    n = model.config.num_hidden_layers
    st = capture_boundaries(model, ids, range(n + 1))
    hs = model(ids, output_hidden_states=True).hidden_states  # hs[N] is after the final norm
    for b in range(n):
        assert torch.equal(st[b], hs[b]), b
    # boundary N is the pre-norm state: the final norm of it gives HF's last hidden_states
    assert not torch.allclose(st[n], hs[n])
    assert torch.allclose(model.model.norm(st[n]), hs[n], atol=1e-6)


def test_capture_is_cloned_not_aliased(target):
    model, tok, _ = target
    ids = tok(["One day, Tom went to the park."], return_tensors="pt").input_ids
    a = capture_boundaries(model, ids, [1, 2])
    b = capture_boundaries(model, ids, [1, 2])
    assert a[1].data_ptr() != b[1].data_ptr() and torch.equal(a[1], b[1])


def test_hooks_ignore_other_threads(target):
    """Online training calls the target's final norm on the main thread (the TTT objective's
    labels) while a capture thread runs the target: a call from another thread inside the
    capture's window (here: right after the capture's own norm call, the last moment before its
    hooks are removed) must not change what the capture recorded. The old hooks recorded it: the
    capture's boundary N was then the other thread's tensor."""
    model, tok, _ = target
    ids = tok(["One day, Tom went to the park."], return_tensors="pt").input_ids
    n = model.config.num_hidden_layers
    norm = model.model.norm
    want = capture_boundaries(model, ids, [1, n])  # undisturbed
    other = torch.full((1, 3, want[n].shape[-1]), 7.0)  # a training batch's state
    done = []

    def trainer_call(_mod, _args, _out):  # after the capture's own norm call, inside its window
        if not done:
            done.append(1)
            th = threading.Thread(target=lambda: norm(other))
            th.start()
            th.join()

    h = norm.register_forward_hook(trainer_call)
    try:
        got = capture_boundaries(model, ids, [1, n])
    finally:
        h.remove()
    assert done == [1]
    assert torch.equal(got[n], want[n]) and torch.equal(got[1], want[1])


def test_padded_batch_equals_one_by_one(target):
    model, tok, _ = target
    texts = [
        "Lily had a red ball.",
        "Once upon a time, there was a big tree in the middle of a field and a bird",
        "Tom ran.",
    ]
    samples = [tok(t).input_ids for t in texts]
    batched = HFCaptureEngine(model, "sglang", batch_size=3).capture(samples, [0, 1, 3])
    single = HFCaptureEngine(model, "sglang", batch_size=1).capture(samples, [0, 1, 3])
    for a, b, s in zip(batched, single, samples):
        assert a.aux.shape == (len(s), 3 * 64) and a.final.shape == (len(s), 64)
        torch.testing.assert_close(a.aux, b.aux, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.final, b.final, atol=1e-5, rtol=1e-5)


def test_engine_ids_follow_convention(target):
    model, tok, _ = target
    ids = tok(["Sue saw a cat."], return_tensors="pt").input_ids
    hs = model(ids, output_hidden_states=True).hidden_states
    expect = torch.cat([hs[1][0], hs[2][0], hs[4][0]], dim=-1)
    sg = HFCaptureEngine(model, "sglang").capture([ids[0].tolist()], [0, 1, 3])[0]
    vl = HFCaptureEngine(model, "vllm").capture([ids[0].tolist()], [1, 2, 4])[0]
    assert torch.equal(sg.aux, expect) and torch.equal(vl.aux, expect)
    assert HFCaptureEngine(model, "sglang").engine_name == "hf-transformers"
    with pytest.raises(ValueError, match="captures only boundaries"):
        HFCaptureEngine(model, "sglang").capture([ids[0].tolist()], [0, 1, 4])
