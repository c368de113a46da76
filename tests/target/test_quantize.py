"""Quantized variants written by eagle3nb.target.quantize (compressed-tensors): the stored integers
and scales read back by hand (int8 per channel; int4 nibbles unpacked here, offset 8) give the float
weights within half a quantization step, the module plan follows vLLM's CPU kernel rule computed
from the config, HF loads the variant with float weights and its logits differ from float32 by a
measured, bounded amount."""

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle3nb.target import models
from eagle3nb.target.quantize import load_quantized_hf, plan, write_quantized

MODEL = "stories260K-hd32"


@pytest.fixture(scope="module")
def ref():
    model, _, path = models.load_target(MODEL, "float32")
    return model, path


def _linears(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def test_plan_follows_the_vllm_cpu_rule(ref):
    model, _ = ref
    lin = _linears(model)
    w8 = plan(model, "w8a8")
    assert sorted(w8["quantized"]) == sorted(n for n in lin if n != "lm_head")
    w4 = plan(model, "w4a16")
    want = [
        n
        for n, m in lin.items()
        if n != "lm_head" and m.in_features % 32 == 0 and m.out_features % 32 == 0
    ]
    assert sorted(w4["quantized"]) == sorted(want) and want  # attention projections
    assert all("mlp" in n for n in w4["ignored"] if n != "lm_head")  # MLP width 172
    assert "172" in w4["ignored"]["model.layers.0.mlp.down_proj"]
    with pytest.raises(ValueError, match="w3a3"):
        plan(model, "w3a3")


def test_w8a8_int8_per_channel_read_back_by_hand(ref, tmp_path):
    model, path = ref
    rec = write_quantized(path, tmp_path / "w8a8", "w8a8", "sha-x")
    sd = load_file(tmp_path / "w8a8" / "model.safetensors")
    cfg = json.loads((tmp_path / "w8a8" / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == "int-quantized" and cfg["quant_method"] == "compressed-tensors"
    for name, m in _linears(model).items():
        if name == "lm_head":
            continue
        q, s = sd[f"{name}.weight"], sd[f"{name}.weight_scale"]
        w = m.weight.detach()
        assert q.dtype == torch.int8 and s.shape == (w.shape[0], 1)
        amax = w.abs().amax(1, keepdim=True)
        live = amax[:, 0] > 0  # this layout has all-zero rows (heads padded to head_dim 32)
        assert torch.allclose(s[live], amax[live] / 127.5, rtol=1e-6)  # symmetric: range 255 / 2
        assert (q[~live] == 0).all()
        assert ((q.float() * s - w).abs() <= s * 0.501).all(), (
            name
        )  # half a step (float32 rounding)
    assert rec["quantized"] and (tmp_path / "w8a8" / "tokenizer.json").is_file()
    mtime = (tmp_path / "w8a8" / "model.safetensors").stat().st_mtime_ns
    assert write_quantized(path, tmp_path / "w8a8", "w8a8", "sha-x") == rec  # resume: no rewrite
    assert (tmp_path / "w8a8" / "model.safetensors").stat().st_mtime_ns == mtime


def test_w4a16_packed_nibbles_read_back_by_hand(ref, tmp_path):
    model, path = ref
    rec = write_quantized(path, tmp_path / "w4", "w4a16", "sha-x")
    sd = load_file(tmp_path / "w4" / "model.safetensors")
    lin = _linears(model)
    for name in rec["quantized"]:
        w = lin[name].weight.detach()
        n, k = w.shape
        packed, s = sd[f"{name}.weight_packed"], sd[f"{name}.weight_scale"]
        assert (
            packed.dtype == torch.int32 and packed.shape == (n, k // 8) and s.shape == (n, k // 32)
        )
        u = packed.to(torch.int64) & 0xFFFFFFFF
        nib = torch.stack([(u >> (4 * i)) & 0xF for i in range(8)], dim=-1).reshape(n, k) - 8
        assert nib.min() >= -8 and nib.max() <= 7
        scale = s.repeat_interleave(32, dim=1)
        # symmetric int4 range [-8, 7], scale = absmax / 7.5: the clipped +absmax is off by half a step too
        assert ((nib.float() * scale - w).abs() <= scale * 0.501).all(), name
    for name in rec["ignored"]:  # left in float32 under its own name
        if name != "lm_head":
            assert sd[f"{name}.weight"].dtype == torch.float32


def test_hf_loads_the_variants_and_their_logits_drift(ref, tmp_path):
    model, path = ref
    ids = torch.tensor([[1, 403, 260, 280, 17, 412, 271, 261, 300, 33]])
    base = model(ids).logits
    errs = {}
    for fmt in ("w8a8", "w4a16"):
        write_quantized(path, tmp_path / fmt, fmt, "sha-x")
        q, _, _ = load_quantized_hf(tmp_path / fmt)
        assert all(m.weight.dtype == torch.float32 for m in _linears(q).values())
        errs[fmt] = float((q(ids).logits - base).norm() / base.norm())
    assert 1e-4 < errs["w8a8"] < 0.05 and 1e-3 < errs["w4a16"] < 0.2, errs
