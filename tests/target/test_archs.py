"""HF capture for every accepted target class (dense, MoE, MLA, multimodal wrappers), on tiny
random-weight models built from configs at test time: each captured boundary b < N equals HF's own
``output_hidden_states`` ``hidden_states[b]`` of the model's full forward; boundary N equals the last
decoder layer's output (a forward hook) and, through the final norm, HF's post-norm
``hidden_states[N]``; a right-padded batch equals one-by-one capture; the layer count, widths and
vocab of wrappers are the text model's (config dict and the manifest's target block)."""

import pytest
import torch

from eagle3nb.target.capture import HFCaptureEngine, capture_boundaries, decoder_of, n_layers_of
from eagle3nb.target.models import SUPPORTED_ARCHS

from tiny_archs import N, TINY, tiny_model

ARCHS = sorted(TINY)


def test_every_supported_class_has_a_tiny_model():
    assert set(TINY) == SUPPORTED_ARCHS


@pytest.mark.parametrize("arch", ARCHS)
def test_boundaries_equal_hf_hidden_states(arch):
    model = tiny_model(arch)
    assert n_layers_of(model) == N
    ids = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    last = {}
    dec = decoder_of(model)
    h = dec.layers[N - 1].register_forward_hook(
        lambda _m, _a, out: last.setdefault(
            "x", (out[0] if isinstance(out, tuple) else out).clone()
        )
    )
    with torch.no_grad():
        ref = model(input_ids=ids, output_hidden_states=True).hidden_states  # full model forward
    h.remove()
    assert len(ref) == N + 1
    got = capture_boundaries(model, ids, range(N + 1))
    for b in range(N):
        torch.testing.assert_close(got[b], ref[b], rtol=0, atol=1e-6, msg=f"{arch} boundary {b}")
    torch.testing.assert_close(got[N], last["x"], rtol=0, atol=1e-6)  # last layer's output
    with torch.no_grad():
        torch.testing.assert_close(dec.norm(got[N]), ref[N], rtol=0, atol=1e-5)  # HF's is post-norm
    assert (got[N] - ref[N]).abs().max() > 1e-2  # so boundary N is not HF's hidden_states[N]
    # adjacent boundaries differ: a one-layer shift cannot pass the checks above
    for b in range(N):
        assert (got[b + 1] - got[b]).abs().max() > 1e-2 * got[b].abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_capture_equals_one_by_one(arch):
    eng = HFCaptureEngine(tiny_model(arch), convention="vllm", batch_size=3)
    g = torch.Generator().manual_seed(2)
    samples = [torch.randint(0, 128, (t,), generator=g).tolist() for t in (5, 9, 3)]
    batched = eng.capture(samples, [0, 2, N])
    single = [eng.capture([s], [0, 2, N])[0] for s in samples]
    for b, s, x in zip(batched, single, samples):
        assert b.aux.shape == (len(x), 3 * 64) and b.final.shape == (len(x), 64)
        torch.testing.assert_close(b.aux, s.aux, rtol=0, atol=1e-5)
        torch.testing.assert_close(b.final, s.final, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "arch", ["Gemma3ForConditionalGeneration", "Kimi_K25ForConditionalGeneration"]
)
def test_wrappers_report_their_text_models_widths(arch, monkeypatch, tmp_path):
    from eagle3nb.steps.shared import checks as common
    from eagle3nb.target import models

    model = tiny_model(arch)
    cfg = models.text_config(model.config.to_dict())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (N, 64, 128)
    assert cfg["architectures"] == [arch]
    monkeypatch.setattr(common.models, "model_hash", lambda *a, **k: "h")
    info = common.target_info(tmp_path, model)
    assert (info["architecture"], info["n_layers"], info["hidden_size"], info["vocab_size"]) == (
        arch,
        N,
        64,
        128,
    )
