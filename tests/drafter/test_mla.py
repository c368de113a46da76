"""The MLA drafter head (eagle3nb/drafter/mla.py): its attention against a second implementation
written plainly here (latent absorbed into q and o, one query and one key at a time, RoPE as
complex rotation), DeepSeek YaRN's frequencies and softmax scale by hand, the step of the whole
drafter after export and load, the refusals, and a tiny training on the DeepSeek-V3 twin that
lowers the loss."""

from __future__ import annotations

import json
import math
import types

import pytest
import torch

from eagle3nb.drafter.export import export_drafter, load_drafter
from eagle3nb.drafter.mla import (
    MLA_ARCH,
    MLAAttention,
    MLAConfig,
    MLADrafter,
    make_drafter,
    mla_rope,
    rope_inv_freq,
)
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.drafter.vocab import build_draft_vocab

YARN = {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip


def _cfg(**kw) -> MLAConfig:
    base = dict(hidden_size=16, target_hidden_size=16, intermediate_size=24, num_attention_heads=2,
                num_key_value_heads=2, head_dim=4, vocab_size=40, draft_vocab_size=40,
                rms_norm_eps=1e-6, q_lora_rank=8, kv_lora_rank=12, qk_nope_head_dim=4,
                qk_rope_head_dim=4, v_head_dim=6)  # fmt: skip
    return MLAConfig(**{**base, **kw})


def _randomize(m: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():  # norm weights too, so a wrong norm placement shows
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))


def _rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rot(x, p, inv, mul):
    """RoPE on one vector as complex numbers: pair (x[2i], x[2i+1]) times mul * e^{i p inv[i]}."""
    z = torch.complex(x[0::2].double(), x[1::2].double()) * torch.polar(
        torch.full_like(inv, mul).double(), (p * inv).double()
    )
    return torch.stack([z.real, z.imag], -1).flatten()


def _hand_attention(a: MLAAttention, xs: list[torch.Tensor], poss: list[torch.Tensor]):
    """Attention of the last step of a TTT chain, one query at a time, with kv_b_proj absorbed:
    score(t, u) = q_nope . W_UK c_kv(u) + q_pe . k_pe(u); output o_proj(sum p W_UV c_kv). xs[s]
    [T, 2H] is step s's input (batch 1), poss[s] [T] its positions; step 0 causal, later steps
    the same position only."""
    c = a.c
    nh, nope, rope, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
    inv, mul, smul = rope_inv_freq(c)
    wkv = a.kv_b_proj.weight.double().view(nh, nope + dv, c.kv_lora_rank)
    w_uk, w_uv = wkv[:, :nope], wkv[:, nope:]  # [nh, nope, r], [nh, dv, r]
    eps = c.rms_norm_eps

    def keys(x, pos):  # per position: latent [r] and roped shared k_pe [rope]
        kv_a = x.double() @ a.kv_a_proj_with_mqa.weight.double().T
        lat = _rms(kv_a[:, : c.kv_lora_rank], a.kv_a_layernorm.weight.double(), eps)
        return [(lat[u], _rot(kv_a[u, c.kv_lora_rank :], pos[u], inv, mul)) for u in range(len(x))]

    ks = [keys(x, p) for x, p in zip(xs, poss)]
    x, pos = xs[-1].double(), poss[-1]
    cq = _rms(x @ a.q_a_proj.weight.double().T, a.q_a_layernorm.weight.double(), eps)
    q = (cq @ a.q_b_proj.weight.double().T).view(len(x), nh, nope + rope)
    out = torch.zeros(len(x), nh * dv, dtype=torch.float64)
    scale = (nope + rope) ** -0.5 * smul
    for t in range(len(x)):
        for h in range(nh):
            q_lat = q[t, h, :nope] @ w_uk[h]  # [r]: q_nope absorbed into the latent space
            q_pe = _rot(q[t, h, nope:], pos[t], inv, mul)
            seen = [ks[0][u] for u in range(t + 1)] + [k[t] for k in ks[1:]]
            s = torch.stack([(q_lat @ lat + q_pe @ kpe) * scale for lat, kpe in seen])
            p = torch.softmax(s, 0)
            o_lat = sum(pi * lat for pi, (lat, _) in zip(p, seen))  # [r]
            out[t, h * dv : (h + 1) * dv] = w_uv[h] @ o_lat
    return out @ a.o_proj.weight.double().T  # [T, H]


@pytest.mark.parametrize("rope_scaling", [None, YARN])
def test_mla_attention_equals_the_absorbed_hand_computation(rope_scaling):
    c = _cfg(rope_scaling=rope_scaling)
    a = MLAAttention(c).eval()
    _randomize(a)
    T = 5
    g = torch.Generator().manual_seed(1)
    x0, x1, x2 = (torch.randn(1, T, 32, generator=g) for _ in range(3))
    pos0 = torch.arange(T)[None] + 3  # not starting at 0, so a dropped position offset shows
    qi = torch.arange(T)
    with torch.no_grad():
        _, kv0 = a(x0, pos0, [], qi, None)
        _, kv1 = a(x1, pos0 + 1, [kv0], qi, None)
        got, _ = a(x2, pos0 + 2, [kv0, kv1], qi, None)
    want = _hand_attention(a, [x0[0], x1[0], x2[0]], [pos0[0], pos0[0] + 1, pos0[0] + 2])
    assert torch.allclose(got[0].double(), want, rtol=1e-4, atol=1e-5), (got[0] - want).abs().max()


def test_rope_is_the_interleaved_deepseek_layout():
    d, inv = 8, 1.0 / 10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    x = torch.randn(1, 1, 3, d)
    pos = torch.tensor([[0, 5, 17]])
    got = mla_rope(x, pos, inv, 1.0)
    for t in range(3):
        assert torch.allclose(
            got[0, 0, t].double(), _rot(x[0, 0, t], pos[0, t], inv, 1.0), atol=1e-5
        )
    # not the rotate-half (NeoX) layout the Llama head uses
    half = torch.cat([x[..., :4], x[..., 4:]], -1)
    ang = pos[0, 2] * inv
    neox = (
        half[0, 0, 2] * torch.cat([ang, ang]).cos()
        + torch.cat([-half[0, 0, 2, 4:], half[0, 0, 2, :4]]) * torch.cat([ang, ang]).sin()
    )
    assert not torch.allclose(got[0, 0, 2], neox, atol=1e-3)


def test_yarn_frequencies_and_scale_by_hand():
    c = _cfg(qk_rope_head_dim=64, rope_scaling=YARN)
    inv, mul, smul = rope_inv_freq(c)
    plain = 1.0 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    # correction range: dims where 32 and 1 rotations fit in 4096 positions, floor / ceil
    lo = math.floor(64 * math.log(4096 / (32 * 2 * math.pi)) / (2 * math.log(10000)))
    hi = math.ceil(64 * math.log(4096 / (1 * 2 * math.pi)) / (2 * math.log(10000)))
    assert (lo, hi) == (10, 23)
    assert torch.allclose(inv[:lo].double(), plain[:lo], rtol=1e-6)  # extrapolated: unchanged
    assert torch.allclose(inv[hi:].double(), plain[hi:] / 40, rtol=1e-6)  # interpolated
    r = (16 - lo) / (hi - lo)  # inside the ramp: a blend
    assert inv[16].item() == pytest.approx(plain[16].item() * (r / 40 + (1 - r)), rel=1e-6)
    assert mul == 1.0 and smul == pytest.approx((0.1 * math.log(40) + 1) ** 2)


def _vocab(d, n_draft):
    counts = torch.arange(d.config.vocab_size, 0, -1)  # every id seen, low ids most
    d.set_vocab(*build_draft_vocab(counts, n_draft))


def test_export_names_both_engines_mla_class_and_loads_back_the_same_function(tmp_path):
    c = _cfg(draft_vocab_size=24, rope_scaling=YARN, fc_norm=True, norm_output=True)
    d = MLADrafter(c, torch.randn(40, 16)).eval()
    _randomize(d)
    _vocab(d, 24)
    man = {"target": {"architecture": "DeepseekV3ForCausalLM"}}
    out = export_drafter(d, tmp_path / "x", [2, 6, 9], 12, man)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [MLA_ARCH] and cfg["model_type"] == "deepseek_v2"
    assert (cfg["kv_lora_rank"], cfg["q_lora_rank"], cfg["v_head_dim"]) == (12, 8, 6)
    assert cfg["rope_interleave"] is True and cfg["rope_scaling"]["factor"] == 40
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True
    assert "speculators_model_type" not in cfg  # vLLM would build a Llama layer from it
    back, _ = load_drafter(out, d.embed_tokens.weight.detach())
    assert type(back) is MLADrafter and back.config == d.config
    B, T = 2, 6
    tok = torch.randint(0, 40, (B, T))
    aux = torch.randn(B, T, 48)
    pos, qi = torch.arange(T)[None].expand(B, T), torch.arange(T)
    with torch.no_grad():
        h, la, kv = d.step(tok, aux, pos, [], qi)
        hb, lb, kvb = back.step(tok, aux, pos, [], qi)
        _, la2, _ = d.step(tok, h, pos + 1, [kv], qi)
        _, lb2, _ = back.step(tok, hb, pos + 1, [kvb], qi)
    assert torch.equal(la, lb) and torch.equal(la2, lb2)


def test_flex_attention_equals_eager_for_mla():
    d = MLADrafter(_cfg(rope_scaling=YARN)).eval()
    _randomize(d)
    B, T = 2, 6
    tok, aux = torch.randint(0, 40, (B, T)), torch.randn(B, T, 48)
    pos, qi = torch.arange(T)[None].expand(B, T), torch.arange(T)
    km = torch.ones(B, T, dtype=torch.bool)
    km[1, 4:] = False
    with torch.no_grad():
        h, _, kv = d.step(tok, aux, pos, [], qi, km)
        _, eager, _ = d.step(tok, h, pos + 1, [kv], qi, km)
        d.set_attention("flex")
        _, flex, _ = d.step(tok, h, pos + 1, [kv], qi, km)
    assert torch.allclose(eager[0], flex[0], atol=1e-5)
    assert torch.allclose(eager[1, :4], flex[1, :4], atol=1e-5)


def test_refusals_name_the_reason():
    llama = types.SimpleNamespace(architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(ValueError, match="drafter_head='mla' needs an MLA target"):
        MLAConfig.for_target(llama, 16)
    v2lite = types.SimpleNamespace(architectures=["DeepseekV2ForCausalLM"], kv_lora_rank=512,
                                   q_lora_rank=None)  # fmt: skip
    with pytest.raises(ValueError, match="Eagle3 MLA layer requires q_lora_rank"):
        MLAConfig.for_target(v2lite, 16)
    with pytest.raises(ValueError, match="norm_before_fc=True with drafter_head='mla'"):
        MLADrafter(_cfg(norm_before_fc=True))
    with pytest.raises(ValueError, match="rope_scaling="):
        MLAAttention(_cfg(rope_scaling={"rope_type": "linear", "factor": 2.0}))
    # the Llama config still builds the Llama head
    plain = DrafterConfig(**{k: v for k, v in _cfg().to_dict().items() if k in DrafterConfig.__dataclass_fields__})  # fmt: skip
    assert type(make_drafter(plain)) is Eagle3Drafter


def test_load_refuses_a_halves_rope_layout(tmp_path):
    d = MLADrafter(_cfg()).eval()
    _vocab(d, 40)
    out = export_drafter(d, tmp_path / "x", [2, 6, 9], 12, {"target": {}})
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "rope_interleave": False}))
    with pytest.raises(ValueError, match="rope_interleave=false"):
        load_drafter(out)


def test_no_flavour_swap_for_the_mla_head():
    """An MLA head with fc_norm has no norm_before_fc reading (neither engine's MLA class reads
    it), so 04's flavour-swapped baseline is skipped rather than built (swap_norm_flavour None)."""
    from eagle3nb.drafter.model import swap_norm_flavour, swapped_drafter

    d = MLADrafter(_cfg(fc_norm=True, norm_output=True))
    assert swap_norm_flavour(d.state_dict(), d.config) is None and swapped_drafter(d) is None


def test_load_reads_sglang_layers_0_names(tmp_path):
    """A checkpoint whose layer is named layers.0.* (what SGLang's kimi_k25_eagle3 loader maps to
    its midlayer) loads as the same drafter."""
    from safetensors.torch import load_file, save_file

    d = MLADrafter(_cfg()).eval()
    _randomize(d)
    _vocab(d, 40)
    out = export_drafter(d, tmp_path / "x", [2, 6, 9], 12, {"target": {}})
    sd = load_file(str(out / "model.safetensors"))
    renamed = {k.replace("midlayer.", "layers.0.", 1): v for k, v in sd.items()}
    assert any(k.startswith("layers.0.self_attn.kv_b_proj") for k in renamed)
    save_file(renamed, str(out / "model.safetensors"))
    back, _ = load_drafter(out, d.embed_tokens.weight.detach())
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in d.state_dict().items())
