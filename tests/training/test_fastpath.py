"""eagle3nb.training.fastpath: what precision, compile and optimizer each device gets (CPU keeps
float32, eager, the default AdamW), padding for compiled shapes leaves the loss unchanged, and the
settings are validated with messages naming the fix."""

import pytest
import torch

from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.training.fastpath import pad_batch, resolve
from eagle3nb.training.loop import TrainConfig
from eagle3nb.training.objective import ttt_loss

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_is_float32_eager_on_cpu_and_the_gpu_path_on_cuda():
    f = resolve("auto", "auto", CPU)
    assert (f.precision, f.compile, f.fused_adamw) == ("float32", False, False)
    g = resolve("auto", "auto", CUDA)  # resolving touches no device
    assert (g.precision, g.compile, g.fused_adamw) == ("bf16-mixed", True, True)
    h = resolve("float32", "off", CUDA)
    assert (h.precision, h.compile, h.fused_adamw) == ("float32", False, True)
    p = torch.nn.Parameter(torch.ones(3))
    opt = f.optimizer([p], 1e-3, 0.0)
    assert isinstance(opt, torch.optim.AdamW) and not opt.defaults.get("fused")
    assert opt.defaults["betas"] == (0.9, 0.95)
    with f.autocast(CPU):  # float32: no autocast
        assert not torch.is_autocast_enabled("cpu")
    assert f.prepare({"x": 1}) == {"x": 1}  # no padding without compile


def test_gpu_only_settings_are_refused_on_cpu_naming_the_fix():
    with pytest.raises(ValueError, match="need a CUDA device"):
        resolve("bf16-mixed", "auto", CPU)
    with pytest.raises(ValueError, match="need a CUDA device"):
        resolve("auto", "on", CPU)
    with pytest.raises(ValueError, match="precision='bf16'"):
        TrainConfig(precision="bf16")
    with pytest.raises(ValueError, match="torch_compile='yes'"):
        TrainConfig(torch_compile="yes")
    c = TrainConfig(precision="float32", torch_compile="off")
    assert "precision" not in c.identity() and "torch_compile" not in c.identity()


def test_padding_to_a_multiple_keeps_the_loss():
    c = DrafterConfig(
        hidden_size=32,
        target_hidden_size=32,
        intermediate_size=48,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=50,
        draft_vocab_size=50,
    )
    torch.manual_seed(0)
    d = Eagle3Drafter(c)
    g = torch.Generator().manual_seed(1)
    B, T = 2, 13
    b = {
        "input_ids": torch.randint(0, 50, (B, T), generator=g),
        "aux": torch.randn(B, T, 96, generator=g),
        "final": torch.randn(B, T, 32, generator=g),
        "loss_mask": torch.ones(B, T, dtype=torch.long),
        "attn_mask": torch.tensor([[1] * T, [1] * 9 + [0] * 4]),
        "sample_index": torch.tensor([4, 7]),
    }
    p = pad_batch(b, 8)
    assert p["input_ids"].shape == (B, 16) and p["aux"].shape == (B, 16, 96)
    assert torch.equal(p["sample_index"], b["sample_index"])
    assert p["attn_mask"][:, T:].sum() == 0 and p["loss_mask"][:, T:].sum() == 0
    assert pad_batch(p, 8) is p  # already a multiple
    norm, head = torch.nn.Identity(), torch.nn.Linear(32, 50, bias=False)

    def loss(x):
        args = (x["input_ids"], x["aux"], x["final"], x["loss_mask"], x["attn_mask"])
        return ttt_loss(d, *args, norm, head, 3)

    r0, r1 = loss(b), loss(p)
    assert r0.step_count == r1.step_count
    torch.testing.assert_close(r1.loss, r0.loss, rtol=1e-6, atol=0)
