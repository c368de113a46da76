"""The EAGLE-3 drafter with multi-head latent attention (MLA), for DeepSeek-V3 / Kimi-K2 targets.

The same drafter as :mod:`eagle3nb.drafter.model` (``fc``, one ``midlayer`` fed
concat(input_layernorm(embed), hidden_norm(hidden)), dense SwiGLU MLP, ``norm``, ``lm_head`` over
the draft vocab, the same TTT cache and masks, the same :meth:`Eagle3Drafter.step`), with the
attention of a DeepSeek-V2/V3 layer in place of the Llama one. Mirrors vLLM 0.32.0
``model_executor/models/deepseek_eagle3.py`` (``Eagle3DeepseekV2ForCausalLM``, reusing
``deepseek_v2.py:1000-1246`` ``DeepseekV2MLAAttention`` with ``input_size = 2H``, and
``layers/mla.py`` ``MultiHeadLatentAttentionWrapper.forward``) and SGLang 0.5.23
``srt/models/kimi_k25_eagle3.py`` (``Eagle3DeepseekV2ForCausalLM``, reusing
``deepseek_v2.py:2010`` ``DeepseekV2AttentionMLA`` with its fused a-projection widened to 2H).

Attention of one step, x = the midlayer's attention input [B, T, 2H] (nh heads):

    c_q    = q_a_layernorm(q_a_proj(x))                           [B, T, q_lora_rank]
    q      = q_b_proj(c_q) -> (q_nope, q_pe)                      [B, nh, T, nope], [B, nh, T, rope]
    kv_a   = kv_a_proj_with_mqa(x) -> (c_kv, k_pe)                [B, T, kv_lora_rank], [B, T, rope]
    c_kv   = kv_a_layernorm(c_kv)                                 the latent both engines cache
    k_nope, v = kv_b_proj(c_kv) split per head                    [B, nh, T, nope], [B, nh, T, v_dim]
    q_pe, k_pe = RoPE(q_pe), RoPE(k_pe)   interleaved pairs (2i, 2i+1); k_pe shared by all heads
    k      = concat(k_nope, k_pe), q = concat(q_nope, q_pe)       [B, nh, T, nope + rope]
    o      = softmax(q k^T * scale) v  over the TTT mask          [B, nh, T, v_dim]
    out    = o_proj(o)                                            [B, T, H]

scale = (nope + rope)^-0.5, times mscale^2 with YaRN (vLLM ``deepseek_v2.py:1130-1136``, SGLang
``configs/model_config.py:2623`` ``compute_mla_mscale_scaling``). RoPE is the GPT-J (interleaved)
layout: vLLM always (``is_neox_style=False``, ``deepseek_v2.py:1122-1127``), SGLang while
``rope_interleave`` is true (its default, ``deepseek_v2.py:2166``), so exports write it true. With
YaRN (``rope_type: yarn``) the frequencies are DeepSeek's YaRN blend (vLLM
``layers/rotary_embedding/deepseek_scaling_rope.py`` ``_compute_inv_freq``, correction range over
``original_max_position_embeddings``). Training materializes k and v per head (the cache holds
them, [B, nh, T, nope + rope] and [B, nh, T, v_dim]); engines cache the latent and absorb
``kv_b_proj`` into q and o, the same function (tests/drafter/test_mla.py checks one against the
other).

What the engines' MLA drafter classes read (so what this drafter refuses otherwise,
:func:`check_mla_flags`): ``fc_norm`` and ``norm_output`` (both engines); ``norm_before_fc`` is read
by neither (vLLM ``deepseek_eagle3.py`` and SGLang ``kimi_k25_eagle3.py`` build no ``input_norm``);
``norm_before_residual`` only by vLLM (SGLang's residual is always the un-normed hidden). SGLang
needs ``q_lora_rank`` (``kimi_k25_eagle3.py:118-121``: "Eagle3 MLA layer requires q_lora_rank").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from eagle3nb.drafter.flex_attention import ttt_flex_attention
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter, KV, RMSNorm

__all__ = [
    "MLA_ARCH",
    "MLA_READ",
    "MLA_REQUIRED_TENSORS",
    "MLAConfig",
    "MLAAttention",
    "MLADrafter",
    "make_drafter",
    "mla_rope",
    "rope_inv_freq",
    "check_mla_flags",
    "mla_config_json",
    "mla_config_from_json",
    "our_names",
]

# both engines' class name for it (vLLM registry.py:672, SGLang kimi_k25_eagle3.py EntryClass)
MLA_ARCH = "Eagle3DeepseekV2ForCausalLM"
# what config.json says for the MLA keys; model_type deepseek_v2, not deepseek_v3: vLLM rewrites a
# deepseek_v3 draft config into its MTP drafter ('Eagle3DeepSeekMTPModel ... not supported',
# config/speculative.py:679-693)
MLA_MODEL_TYPE = "deepseek_v2"
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# config.json keys this head reads itself (load_drafter leaves them out of the Llama head's checks)
MLA_READ = MLA_KEYS + (
    "rope_scaling",
    "rope_parameters",
    "rope_interleave",
    "first_k_dense_replace",
)
_ATTN = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm")
MLA_REQUIRED_TENSORS = ["fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"] + [
    f"midlayer.{n}.weight"
    for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")
    + tuple(f"self_attn.{a}" for a in _ATTN + ("kv_b_proj", "o_proj"))
    + ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
]


@dataclass
class MLAConfig(DrafterConfig):
    """:class:`DrafterConfig` plus the MLA widths (DeepSeek-V3: 1536, 512, 128, 64, 128) and the
    target's rope scaling (``None`` or DeepSeek YaRN: ``rope_type``/``type`` ``yarn``, ``factor``,
    ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``, ``mscale``,
    ``mscale_all_dim``). ``num_key_value_heads`` equals ``num_attention_heads`` (each head has its
    own k and v, all from one latent)."""

    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_scaling: Optional[dict] = field(default=None)
    reads_norm_before_fc = False  # not a field: no engine's MLA class reads it (no flavour swap)

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, n_aux: int = 3, **kw) -> "MLAConfig":
        """The MLA drafter shaped like one layer of an MLA target: hidden, MLP width and heads as
        :meth:`DrafterConfig.for_target` (``num_attention_heads``, ``intermediate_size`` may be
        given; kv heads follow the heads), ranks and rope from the target's config.

        Raises:
            ValueError: a target without MLA (no ``kv_lora_rank``: not DeepSeek-V2/V3/Kimi-class)
                or without ``q_lora_rank`` (SGLang refuses it), or a rope scaling other than YaRN.
        """
        c = target_config
        arch = (getattr(c, "architectures", None) or ["?"])[0]
        if not getattr(c, "kv_lora_rank", None):
            raise ValueError(
                f"drafter_head='mla' needs an MLA target (kv_lora_rank in its config: DeepSeek-V2/"
                f"V3, Kimi-K2); this target ({arch}, model_type {getattr(c, 'model_type', '?')}) "
                "has none, and no engine here serves an MLA drafter beside a non-MLA target: use "
                "drafter_head='llama'"
            )
        if not getattr(c, "q_lora_rank", None):
            raise ValueError(
                f"drafter_head='mla': the target ({arch}) has q_lora_rank={c.q_lora_rank!r}; SGLang "
                "0.5.23 refuses such a drafter ('Eagle3 MLA layer requires q_lora_rank in the draft "
                "config', kimi_k25_eagle3.py:118-121): use drafter_head='llama'"
            )
        kw.pop("num_key_value_heads", None)
        base = DrafterConfig.for_target(c, draft_vocab_size, n_aux, **kw)
        nh = base.num_attention_heads
        rs = _scaling(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None))
        out = cls(
            **{**base.to_dict(), "num_key_value_heads": nh, "head_dim": c.qk_rope_head_dim},
            **{k: int(getattr(c, k)) for k in MLA_KEYS},
            rope_scaling=rs,
        )
        rope_inv_freq(out)  # refuses an unknown rope type now, not at the first step
        return out


def _rope_type(rs: dict) -> str:
    return rs.get("rope_type") or rs.get("type") or "default"


def _scaling(rs: Optional[dict]) -> Optional[dict]:
    """The rope scaling a config names: None for none or default, else the dict without
    ``rope_theta`` (transformers v5 copies it in; the drafter keeps it in ``rope_theta``)."""
    if not rs or _rope_type(rs) == "default":
        return None
    return {k: v for k, v in rs.items() if k != "rope_theta"}


def _yarn_mscale(scale: float, mscale: float) -> float:
    """vLLM ``deepseek_scaling_rope.py`` / SGLang ``yarn_get_mscale``."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(c: MLAConfig) -> tuple[torch.Tensor, float, float]:
    """``(inv_freq [rope/2] float32, cos/sin multiplier, softmax-scale multiplier)`` of the RoPE
    part: plain ``theta^(-2i/d)``, or DeepSeek YaRN (vLLM ``deepseek_scaling_rope.py``
    ``_compute_inv_freq`` and ``__init__``; ``layers/rotary_embedding/common.py``
    ``yarn_find_correction_range``, ``yarn_linear_ramp_mask``).

    Raises:
        ValueError: a rope type other than default or yarn, or YaRN without ``factor``.
    """
    d, base = c.qk_rope_head_dim, c.rope_theta
    pos_freqs = base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)  # [d/2]
    rs = c.rope_scaling
    if not rs or _rope_type(rs) == "default":
        return 1.0 / pos_freqs, 1.0, 1.0
    if _rope_type(rs) != "yarn" or "factor" not in rs or rs.get("attention_factor") is not None:
        raise ValueError(
            f"rope_scaling={rs!r}: the MLA drafter implements default rope and DeepSeek YaRN (with "
            "'factor', no 'attention_factor'); use a target with one of those"
        )
    f, omax = float(rs["factor"]), int(rs["original_max_position_embeddings"])
    fast, slow = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

    def corr(rot):  # dimension index where `rot` rotations fit in omax positions
        return (d * math.log(omax / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(corr(fast)), 0), min(math.ceil(corr(slow)), d - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate by the factor
    inv = (1.0 / (f * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep  # [d/2]
    m_all = _yarn_mscale(f, float(rs.get("mscale_all_dim", 0) or 0))
    cos_mul = _yarn_mscale(f, float(rs.get("mscale", 1))) / m_all
    return inv, cos_mul, m_all * m_all


def mla_rope(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor, mul: float) -> torch.Tensor:
    """Interleaved (GPT-J) rotary embedding, as vLLM's ``rotate_gptj``: pair (2i, 2i+1) of x is
    rotated by pos * inv[i] (cos and sin scaled by ``mul``). x: [B, h, T, d]; pos: [B, T] int64;
    inv: [d/2] float32. Returns x's shape and dtype (angles in float32)."""
    ang = pos.to(torch.float32)[:, None, :, None] * inv.to(x.device)  # [B, 1, T, d/2]
    cos, sin = (ang.cos() * mul).to(x.dtype), (ang.sin() * mul).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # [B, h, T, d/2] each
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


class MLAAttention(nn.Module):
    """MLA self-attention over the TTT cache (module docstring); weights named as both engines'
    checkpoints name them (``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``, ``kv_a_proj_with_mqa``,
    ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``)."""

    def __init__(self, c: MLAConfig):
        super().__init__()
        self.c = c
        nh, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
        self.q_a_proj = nn.Linear(2 * c.hidden_size, c.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = nn.Linear(c.q_lora_rank, nh * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(
            2 * c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim, bias=False
        )
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = nn.Linear(
            c.kv_lora_rank, nh * (c.qk_nope_head_dim + c.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(nh * c.v_head_dim, c.hidden_size, bias=False)
        inv, self.rope_mul, smul = rope_inv_freq(c)
        self.register_buffer("inv_freq", inv, persistent=False)  # [rope/2], not exported
        self.scale = qk**-0.5 * smul
        self.attn_impl = "eager"  # set through Eagle3Drafter.set_attention, as the GQA head

    def forward(self, x, pos, cache: list[KV], q_index, key_mask: Optional[torch.Tensor]):
        """Same contract as :meth:`eagle3nb.drafter.model.Eagle3Attention.forward`: x [B, Tq, 2H],
        pos [B, Tq], cache of earlier steps' (k [B, nh, T_s, nope+rope], v [B, nh, T_s, v_dim]),
        q_index [Tq] or [B, Tq], key_mask [B, T0]. Returns ([B, Tq, H], this step's (k, v))."""
        c = self.c
        B, Tq, _ = x.shape
        nh, nope, rope = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # [B, Tq, nh*(nope+rope)]
        q = q.view(B, Tq, nh, nope + rope).transpose(1, 2)  # [B, nh, Tq, nope+rope]
        kv_a = self.kv_a_proj_with_mqa(x)  # [B, Tq, kv_lora + rope]
        c_kv = self.kv_a_layernorm(kv_a[..., : c.kv_lora_rank])  # [B, Tq, kv_lora] the latent
        k_pe = kv_a[..., c.kv_lora_rank :][:, None]  # [B, 1, Tq, rope] one for all heads
        kv = self.kv_b_proj(c_kv).view(B, Tq, nh, nope + c.v_head_dim).transpose(1, 2)
        k_nope, v = kv[..., :nope], kv[..., nope:]  # [B, nh, Tq, nope], [B, nh, Tq, v_dim]
        q_pe = mla_rope(q[..., nope:], pos, self.inv_freq, self.rope_mul)  # [B, nh, Tq, rope]
        k_pe = mla_rope(k_pe, pos, self.inv_freq, self.rope_mul).expand(B, nh, Tq, rope)
        q = torch.cat([q[..., :nope], q_pe], dim=-1)  # [B, nh, Tq, nope+rope]
        k = torch.cat([k_nope, k_pe], dim=-1)  # [B, nh, Tq, nope+rope]
        steps = cache + [(k, v)]
        T0 = steps[0][0].shape[2]
        no_grad = not (torch.is_grad_enabled() and q.requires_grad)  # no flex backward on CPU
        if self.attn_impl == "flex" and Tq == T0 and (q.is_cuda or no_grad):
            ks, vs = [s[0] for s in steps], [s[1] for s in steps]
            o = ttt_flex_attention(q, ks, vs, key_mask, self.scale)  # [B, nh, Tq, v_dim]
        else:
            o = _ttt_eager(q, steps, q_index, key_mask, self.scale)  # [B, nh, Tq, v_dim]
        o = o.transpose(1, 2).reshape(B, Tq, nh * c.v_head_dim)  # [B, Tq, nh*v_dim]
        return self.o_proj(o), (k, v)


def _ttt_eager(q, steps: list[KV], q_index, key_mask, scale):
    """The TTT mask with the scores written out (the same mask as the GQA head's eager path):
    causal over step 0, the same position only in steps 1..j. q [B, nh, Tq, dk] -> [B, nh, Tq, dv]."""
    k0, v0 = steps[0]  # [B, nh, T0, dk], [B, nh, T0, dv]
    T0 = k0.shape[2]
    s0 = (q @ k0.transpose(-1, -2)) * scale  # [B, nh, Tq, T0]
    allowed = torch.arange(T0, device=q.device) <= q_index[..., None]  # [Tq, T0] or [B, Tq, T0]
    allowed = allowed[None, None] if q_index.dim() == 1 else allowed[:, None]
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    s0 = s0.masked_fill(~allowed, torch.finfo(s0.dtype).min)
    sd = [(q * k).sum(-1, keepdim=True) * scale for k, _ in steps[1:]]  # each [B, nh, Tq, 1]
    p = torch.softmax(torch.cat([s0, *sd], dim=-1), dim=-1)  # [B, nh, Tq, T0 + j]
    o = p[..., :T0] @ v0  # [B, nh, Tq, dv]
    for i, (_, v) in enumerate(steps[1:]):
        o = o + p[..., T0 + i : T0 + i + 1] * v
    return o


def check_mla_flags(c: DrafterConfig) -> None:
    """Refuse the variant flags the engines' MLA drafter classes do not read (module docstring).

    Raises:
        ValueError: ``norm_before_fc`` or ``norm_before_residual`` set, naming the engine file.
    """
    if c.norm_before_fc:
        raise ValueError(
            "norm_before_fc=True with drafter_head='mla': neither engine's MLA drafter reads it "
            "(vLLM 0.32 deepseek_eagle3.py, SGLang 0.5.23 kimi_k25_eagle3.py build no input_norm), "
            "so they would serve another function; use fc_norm (EAGLE-3.1 as SGLang means it)"
        )
    if c.norm_before_residual:
        raise ValueError(
            "norm_before_residual=True with drafter_head='mla': SGLang 0.5.23 kimi_k25_eagle3.py "
            "always adds the un-normed hidden (only vLLM reads the flag); leave it False"
        )


class MLADrafter(Eagle3Drafter):
    """:class:`Eagle3Drafter` whose ``midlayer.self_attn`` is :class:`MLAAttention`; everything
    else (``fc``, ``fc_norm``, norms, MLP, ``lm_head``, ``d2t``/``t2d``, :meth:`step`,
    :meth:`set_attention`) is inherited, so training, the simulator and export use it unchanged.

    Raises:
        ValueError: flags the engines' MLA classes do not read (:func:`check_mla_flags`).
    """

    def __init__(self, c: MLAConfig, target_embed: Optional[torch.Tensor] = None):
        check_mla_flags(c)
        super().__init__(c, target_embed)
        self.midlayer.self_attn = MLAAttention(c)  # replaces the GQA attention built above


def make_drafter(c: DrafterConfig, target_embed: Optional[torch.Tensor] = None) -> Eagle3Drafter:
    """The drafter class for a config: :class:`MLADrafter` for an :class:`MLAConfig`, else
    :class:`Eagle3Drafter` (what code that rebuilds a drafter from ``drafter.config`` calls)."""
    return (MLADrafter if isinstance(c, MLAConfig) else Eagle3Drafter)(c, target_embed)


def mla_config_json(c: MLAConfig) -> dict:
    """The config.json keys that make both engines build their MLA drafter class from an export
    (merged over the Llama head's keys by :func:`eagle3nb.drafter.export.drafter_config_json`)."""
    rs = dict(c.rope_scaling) if c.rope_scaling else None
    if rs is not None:
        rs.setdefault("rope_type", _rope_type(rs))
        rs.setdefault("rope_theta", c.rope_theta)
    return {
        "architectures": [MLA_ARCH],
        "model_type": MLA_MODEL_TYPE,
        **{k: getattr(c, k) for k in MLA_KEYS},
        "num_key_value_heads": c.num_attention_heads,
        "head_dim": c.qk_rope_head_dim,  # what transformers' DeepseekV2Config sets
        "rope_scaling": rs,  # both engines read rope_parameters (transformers fills it from this)
        "rope_interleave": True,  # SGLang's switch (deepseek_v2.py:2166); vLLM always interleaves
        "fc_norm": c.fc_norm,
        "first_k_dense_replace": 1,  # the layer is dense in both engines anyway
    }


def our_names(sd: dict) -> dict:
    """An MLA checkpoint's tensors under this drafter's names: ``layers.0.*`` (the name
    SGLang's ``kimi_k25_eagle3.py`` ``load_weights`` maps to its ``midlayer``, as vLLM maps
    ``midlayer.`` to ``layers.0.``) read as ``midlayer.*``; other names unchanged."""
    return {("midlayer." + k[9:] if k.startswith("layers.0.") else k): v for k, v in sd.items()}


def mla_config_from_json(cfg: dict, base: DrafterConfig) -> MLAConfig:
    """The :class:`MLAConfig` of an export's config.json, over the Llama fields already read.

    Raises:
        ValueError: an MLA key missing, ``rope_interleave`` false (vLLM would still interleave).
    """
    missing = [k for k in MLA_KEYS if not cfg.get(k)]
    if missing:
        raise ValueError(f"MLA drafter config.json lacks {missing}; re-export it")
    if cfg.get("rope_interleave", True) is not True:
        raise ValueError(
            "rope_interleave=false: SGLang would rotate halves, vLLM 0.32 still interleaved pairs "
            "(deepseek_v2.py:1126); the engines disagree, so no drafter is loaded; set it true"
        )
    rs = _scaling(cfg.get("rope_parameters") or cfg.get("rope_scaling"))
    d = {**base.to_dict(), "num_key_value_heads": cfg["num_attention_heads"]}
    return MLAConfig(**d, **{k: int(cfg[k]) for k in MLA_KEYS}, rope_scaling=rs)
