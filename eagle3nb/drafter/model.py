"""The EAGLE-3 draft model (drafter), in one readable file.

Mirrors SGLang ``srt/models/llama_eagle3.py`` (``LlamaForCausalLMEagle3``) and vLLM
``model_executor/models/llama_eagle3.py`` so that an exported drafter computes the same function in
both engines; the EAGLE-3 paper (Li et al., 2025) and SafeAILab/EAGLE ``cnets.py`` for training.

Data flow for one draft step at sequence position t (H = drafter hidden, Ht = target hidden):

    step 0:  a      = concat(aux states at the low/mid/high boundaries)        [B, T, n_aux*Ht]
             a      = input_norm(a)            (only with norm_before_fc)      [B, T, n_aux*Ht]
             a      = concat(fc_norm[i](a_i))  (only with fc_norm, per aux)    [B, T, n_aux*Ht]
             hidden = fc(a)                                                    [B, T, H]
    step j:  hidden = what step j-1 fed forward (below)                        [B, T, H]
    x      = concat(input_layernorm(embed(token)), hidden_norm(hidden))        [B, T, 2H]
    h      = hidden + o_proj(attention(x))          (residual = the un-normed hidden)
    out    = h + mlp(post_attention_layernorm(h))   pre-norm output            [B, T, H]
    logits = lm_head(norm(out))                     [B, T, draft_vocab]; target id = d + d2t[d]
    fed to step j+1: out (EAGLE-3), or norm(out) with norm_output (EAGLE-3.1)  [B, T, H]

Variants (config.json flags, read the same way by both installed engines):
- ``norm_before_fc``: one RMSNorm (weight ``input_norm.weight`` [n_aux*Ht], eps ``rms_norm_eps``)
  over the concatenated aux states before ``fc``. vLLM 0.32.0 ``llama_eagle3.py:184-188`` (flag:
  ``eagle_config.norm_before_fc``, else top-level), ``223-229`` (the norm), ``405-407`` (applied in
  ``combine_hidden_states``, the target's states only), ``464-465`` (weight loaded only when set);
  SGLang 0.5.23 ``llama_eagle3.py:173-182`` (same flag lookup and norm), ``238-247`` (applied when
  the hidden is n_aux*Ht wide: the target's states only), weight ``input_norm.weight`` -> its
  ``model.input_norm.weight`` (``371-378``).
- ``fc_norm``: one RMSNorm per aux state (weights ``fc_norm.{i}.weight`` [Ht], eps
  ``rms_norm_eps``) on its own chunk of the concatenation before ``fc``, after ``input_norm`` when
  both are set (the engines' order). vLLM 0.32.0 ``llama_eagle3.py:231-240`` (flag: top-level
  ``fc_norm`` only; speculators reader ``speculators/algos.py:37``), ``409-416`` (applied in
  ``combine_hidden_states``), weights -> ``model.fc_norm.{i}.weight`` (``load_weights`` prefixes
  ``model.``); SGLang 0.5.23 ``llama_eagle3.py:184-196`` (flag: top-level ``fc_norm``, or its
  legacy ``use_aux_norm``; legacy weight names ``aux_norm_low/mid/high`` -> ``fc_norm.0/1/2``,
  ``337-343``), ``241-246`` (applied). vLLM 0.26.0 reads it the same way (``197-206``, ``372-376``).
- ``norm_output``: the state fed to the next draft step is the final norm's output (the same tensor
  ``lm_head`` reads) instead of the pre-norm one. vLLM ``llama_eagle3.py:252, 283-288`` (second
  return value, used as the next step's hidden by ``v1/spec_decode/llm_base_proposer.py:605, 759``);
  SGLang ``llama_eagle3.py:207, 263-269``. No extra weight.

EAGLE-3.1 names two flavours (:data:`FLAVOURS`): ``fc_norm`` + ``norm_output`` (the EAGLE authors,
SGLang, SpecForge, TRT-LLM, NeMo) and ``norm_before_fc`` + ``norm_output`` (speculators' default
"3.1"); :func:`flavour_of` names a config's, :func:`swap_norm_flavour` reads one as the other.

Attention in training-time test (TTT): the query of step j at position t sees the step-0 keys of
positions 0..t (causal) and the keys of steps 1..j at position t only (the draft chain so far). Its
RoPE position is t + j, the position that token occupies when served.

Two implementations of that attention compute the same function (tests/drafter/test_drafter_attention.py):
``"eager"`` writes the scores out ([B, nh, Tq, T0] per step: simple, any layout, the reference) and
``"flex"`` (PyTorch flex attention with a block mask over the concatenated keys of all steps: no
score matrix in memory, masked blocks skipped; compiled on CUDA) for the training layout, where the
queries are the step-0 positions themselves. Pick with :meth:`Eagle3Drafter.set_attention`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from eagle3nb.drafter.flex_attention import (
    compiled_flex,
    flex_attention,
    pick_flex,
    ttt_flex_attention,
)

__all__ = [
    "DrafterConfig",
    "Eagle3Drafter",
    "RMSNorm",
    "KV",
    "FLAVOURS",
    "flavour_of",
    "swap_norm_flavour",
    "swapped_drafter",
]

# flavour name -> the flags that make it (every other variant flag off)
FLAVOURS = {
    "eagle3": {},
    "eagle3.1-fc_norm": {"fc_norm": True, "norm_output": True},
    "eagle3.1-norm_before_fc": {"norm_before_fc": True, "norm_output": True},
}
FLAVOUR_FLAGS = ("fc_norm", "norm_before_fc", "norm_output")


@dataclass
class DrafterConfig:
    """Shapes of the drafter. Defaults of a drafter for a target come from :meth:`for_target`."""

    hidden_size: int
    target_hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # target vocab (embeddings, t2d)
    draft_vocab_size: int
    n_aux: int = 3
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    norm_before_residual: bool = False
    norm_before_fc: bool = False  # RMSNorm ``input_norm`` over the concatenated aux states
    norm_output: bool = False  # feed norm(out), not out, to the next draft step (EAGLE-3.1)
    fc_norm: bool = False  # one RMSNorm ``fc_norm.{i}`` per aux state before fc (EAGLE-3.1)

    @classmethod
    def for_target(
        cls,
        target_config,
        draft_vocab_size: int,
        n_aux: int = 3,
        num_attention_heads: int | None = None,
        num_key_value_heads: int | None = None,
        intermediate_size: int | None = None,
    ) -> "DrafterConfig":
        """Drafter shaped like one decoder layer of the target (the usual EAGLE-3 choice); heads and
        MLP width may be overridden (head_dim stays the target's: vLLM's CPU backend needs >= 32).

        Raises:
            ValueError: draft vocab outside 1..vocab, or heads not divisible by kv heads.
        """
        c = target_config
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        nh = num_attention_heads or c.num_attention_heads
        nkv = num_key_value_heads or min(nh, c.num_key_value_heads)
        if nh % nkv:
            raise ValueError(
                f"num_attention_heads={nh} is not a multiple of num_key_value_heads={nkv}; pick divisible head counts"
            )
        rope = (getattr(c, "rope_parameters", None) or {}).get(
            "rope_theta", getattr(c, "rope_theta", 10000.0)
        )
        if not 1 <= draft_vocab_size <= c.vocab_size:
            raise ValueError(
                f"draft_vocab_size={draft_vocab_size}: must be in 1..{c.vocab_size} (the target vocab); "
                "lower it or use the full vocab"
            )
        return cls(
            hidden_size=c.hidden_size,
            target_hidden_size=c.hidden_size,
            intermediate_size=intermediate_size or c.intermediate_size,
            num_attention_heads=nh,
            num_key_value_heads=nkv,
            head_dim=hd,
            vocab_size=c.vocab_size,
            draft_vocab_size=int(draft_vocab_size),
            n_aux=n_aux,
            rms_norm_eps=c.rms_norm_eps,
            rope_theta=float(rope),
            max_position_embeddings=c.max_position_embeddings,
        )

    def to_dict(self) -> dict:
        """Plain dict of the fields (for manifests)."""
        return asdict(self)


class RMSNorm(nn.Module):
    """RMSNorm as in Llama: ``x / rms(x) * weight``, computed in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def _rope_tables(
    pos: torch.Tensor, d: int, theta: float, dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles (HF rotate_half layout). pos: [B, T] int64 ->
    ([B, 1, T, d], [B, 1, T, d]), shared by the queries and keys of one step."""
    inv = 1.0 / (
        theta ** (torch.arange(0, d, 2, device=pos.device, dtype=torch.float32) / d)
    )  # [d/2]
    ang = pos.to(torch.float32)[..., None] * inv  # [B, T, d/2]
    emb = torch.cat([ang, ang], dim=-1)[:, None]  # [B, 1, T, d]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding: x [B, h, T, d] with the tables of :func:`_rope_tables`."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# (k, v) of one TTT step, each [B, n_kv_heads, T, d] (after RoPE)
KV = tuple[torch.Tensor, torch.Tensor]

ATTN_IMPLS = ("eager", "flex")


class Eagle3Attention(nn.Module):
    """Self-attention over the TTT cache: causal over step-0 keys, diagonal over later steps."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.c = c
        nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, c.hidden_size, bias=False)
        self.attn_impl = (
            "eager"  # see the module docstring; set through Eagle3Drafter.set_attention
        )
        self._flex = []  # this module's compiled flex handle (made outside any compile; a list
        # so that nn.Module does not register it)

    def flex_fn(self, on_gpu: bool):
        """The flex function this module calls (:func:`eagle3nb.drafter.flex_attention.pick_flex`):
        its own compiled handle on CUDA outside a compiled region, else plain flex_attention."""
        if on_gpu and not torch.compiler.is_compiling() and not self._flex:
            self._flex.append(compiled_flex())
        return pick_flex(on_gpu, self._flex[0] if self._flex else None)

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        cache: list[KV],
        q_index: torch.Tensor,
        key_mask: Optional[torch.Tensor],
    ):
        """x: [B, Tq, 2H]; pos: [B, Tq] RoPE positions; cache: earlier steps' KV (step 0 first);
        q_index: [Tq], or [B, Tq] per row, sequence index of each query (the causal mask over
        step 0; steps after 0 may hold a subset of the positions, the same subset in each);
        key_mask: [B, T0] bool, False on padding keys. Returns ([B, Tq, H], this step's KV).
        With ``attn_impl == "flex"`` and Tq == T0 (the training layout) q_index must be arange(T0)
        and every cached step must hold the same T0 positions, as :func:`eagle3nb.training.objective.ttt_loss`
        passes them; other layouts (serve-time chains) take the eager path."""
        c = self.c
        B, Tq, _ = x.shape
        nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = self.q_proj(x).view(B, Tq, nh, hd).transpose(1, 2)  # [B, nh, Tq, hd]
        k = self.k_proj(x).view(B, Tq, nkv, hd).transpose(1, 2)  # [B, nkv, Tq, hd]
        v = self.v_proj(x).view(B, Tq, nkv, hd).transpose(1, 2)  # [B, nkv, Tq, hd]
        cos, sin = _rope_tables(pos, hd, c.rope_theta, q.dtype)  # each [B, 1, Tq, hd]
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        steps = cache + [(k, v)]  # per step [B, nkv, T_s, hd]
        scale = 1.0 / math.sqrt(hd)
        T0 = steps[0][0].shape[2]
        flex_ok = q.is_cuda or not (
            torch.is_grad_enabled() and q.requires_grad
        )  # no flex backward on CPU
        if (
            self.attn_impl == "flex" and Tq == T0 and flex_ok
        ):  # training layout: queries are the step-0 positions
            fn = self.flex_fn(q.is_cuda)
            ks, vs = [s[0] for s in steps], [s[1] for s in steps]
            o = ttt_flex_attention(q, ks, vs, key_mask, scale, fn)  # [B, nh, Tq, hd]
        else:
            o = self._eager(q, steps, q_index, key_mask, scale)
        o = o.transpose(1, 2).reshape(B, Tq, nh * hd)  # [B, Tq, nh*hd]
        return self.o_proj(o), (k, v)

    def _eager(self, q, steps: list[KV], q_index, key_mask, scale):
        """Reference path with the scores written out. q: [B, nh, Tq, hd] -> [B, nh, Tq, hd]."""
        nh, nkv = self.c.num_attention_heads, self.c.num_key_value_heads
        if nh != nkv:  # GQA: repeat kv heads to the query heads
            steps = [
                (k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1))
                for k, v in steps
            ]  # [B, nh, T_s, hd]
        k0, v0 = steps[0]  # [B, nh, T0, hd]
        s0 = (q @ k0.transpose(-1, -2)) * scale  # [B, nh, Tq, T0]
        T0 = k0.shape[2]
        # causal: [Tq, T0] -> [1, 1, Tq, T0]; per-row q_index [B, Tq] -> [B, 1, Tq, T0]
        allowed = torch.arange(T0, device=q.device) <= q_index[..., None]
        allowed = allowed[None, None] if q_index.dim() == 1 else allowed[:, None]
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, :]
        s0 = s0.masked_fill(~allowed, torch.finfo(s0.dtype).min)
        # later steps: each query sees only the same-position key of steps 1..j
        later = steps[1:]
        sd = [(q * ki).sum(-1, keepdim=True) * scale for ki, _ in later]  # each [B, nh, Tq, 1]
        p = torch.softmax(torch.cat([s0, *sd], dim=-1), dim=-1)  # [B, nh, Tq, T0 + j]
        o = p[..., :T0] @ v0  # [B, nh, Tq, hd]
        for i, (_, vi) in enumerate(later):
            o = o + p[..., T0 + i : T0 + i + 1] * vi
        return o


class Eagle3MLP(nn.Module):
    """SwiGLU MLP as in Llama: ``down(silu(gate(x)) * up(x))``, [B, T, H] -> [B, T, H]."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3DecoderLayer(nn.Module):
    """The single decoder layer (``midlayer``): attention input = concat(normed embeds, normed hidden)."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Eagle3Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = Eagle3MLP(c)

    def forward(self, embeds, hidden, pos, cache, q_index, key_mask):
        normed_h = self.hidden_norm(hidden)  # [B, Tq, H]
        residual = normed_h if self.c.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed_h], dim=-1)  # [B, Tq, 2H]
        a, kv = self.self_attn(x, pos, cache, q_index, key_mask)
        h = residual + a  # [B, Tq, H]
        out = h + self.mlp(self.post_attention_layernorm(h))  # [B, Tq, H] pre-norm output
        return out, kv


class Eagle3Drafter(nn.Module):
    """EAGLE-3 drafter: ``fc``, ``midlayer``, ``norm``, ``lm_head`` over the draft vocab, ``d2t``/``t2d``.

    Buffers:
        d2t: ``[draft_vocab]`` int64 offsets, target id = draft id + d2t[draft id].
        t2d: ``[vocab]`` bool, True for target ids in the draft vocab.
    The embedding is the target's, frozen (engines share it at serve time; exports omit it).
    """

    def __init__(self, c: DrafterConfig, target_embed: Optional[torch.Tensor] = None):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        if target_embed is not None:
            if tuple(target_embed.shape) != (c.vocab_size, c.hidden_size):
                raise ValueError(
                    f"target_embed shape {tuple(target_embed.shape)} != (vocab_size, hidden_size) = "
                    f"({c.vocab_size}, {c.hidden_size}); pass the target's embed_tokens.weight"
                )
            self.embed_tokens.weight.data.copy_(target_embed)
        self.embed_tokens.requires_grad_(False)
        if c.norm_before_fc:  # [n_aux*Ht] weight, named as both engines load it
            self.input_norm = RMSNorm(c.n_aux * c.target_hidden_size, c.rms_norm_eps)
        if c.fc_norm:  # n_aux weights [Ht] each: fc_norm.{i}.weight, as both engines load them
            self.fc_norm = nn.ModuleList(
                RMSNorm(c.target_hidden_size, c.rms_norm_eps) for _ in range(c.n_aux)
            )
        self.fc = nn.Linear(c.n_aux * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer(
            "t2d",
            torch.ones(c.vocab_size, dtype=torch.bool)
            if c.draft_vocab_size == c.vocab_size
            else torch.zeros(c.vocab_size, dtype=torch.bool),
        )

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Install the draft vocabulary mapping (see :mod:`eagle3nb.drafter.vocab`)."""
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def set_attention(self, impl: str) -> "Eagle3Drafter":
        """Choose the TTT attention implementation: ``"eager"`` (default, the reference) or ``"flex"``
        (flex attention, compiled on CUDA; for long sequences on a GPU). Both compute the same
        function; the cache layout is the same, so a drafter can switch at any time. PyTorch has no
        flex backward on CPU, so there a step that needs gradients takes the eager path.

        Raises:
            ValueError: an unknown name, or ``"flex"`` on a torch without flex attention (< 2.5).
        """
        if impl not in ATTN_IMPLS:
            raise ValueError(f"attention impl {impl!r}: use one of {ATTN_IMPLS}")
        if impl == "flex" and flex_attention is None:
            raise ValueError(
                f"attention impl 'flex' needs torch >= 2.5 (flex attention); this is torch {torch.__version__}: use 'eager'"
            )
        self.midlayer.self_attn.attn_impl = impl
        return self

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab ids (any shape, int64) -> target ids."""
        return draft_ids + self.d2t[draft_ids]

    def step(self, token_ids, hidden, pos, cache: list[KV], q_index, key_mask=None, layer=None):
        """One draft step.

        Args:
            token_ids: ``[B, Tq]`` int64 target ids fed at this step.
            hidden: ``[B, Tq, n_aux*Ht]`` aux states (when ``cache`` is empty: step 0, goes through
                ``fc``) or ``[B, Tq, H]`` the previous step's pre-norm output.
            pos: ``[B, Tq]`` int64 RoPE positions.
            cache: KV of earlier steps of this chain, step 0 first.
            q_index: ``[Tq]`` (or ``[B, Tq]``, per row) int64 index of each query among the
                step-0 keys.
            key_mask: ``[B, T0]`` bool, False on padding.
            layer: the callable run as the decoder layer (None: ``midlayer``; training passes a
                compiled wrapper of it, see :mod:`eagle3nb.training.fastpath`).

        Returns:
            ``(fed [B, Tq, H], logits [B, Tq, draft_vocab], kv)``; ``fed`` is the hidden for the
            next step: the pre-norm output, or its final-norm output with ``norm_output``.
        """
        if not cache:
            if self.config.norm_before_fc:
                hidden = self.input_norm(hidden)  # [B, Tq, n_aux*Ht], over the whole concat
            if self.config.fc_norm:  # each aux state normed alone, then concatenated again
                chunks = hidden.chunk(self.config.n_aux, dim=-1)  # n_aux x [B, Tq, Ht]
                hidden = torch.cat(
                    [n(x) for n, x in zip(self.fc_norm, chunks)], -1
                )  # [B,Tq,n_aux*Ht]
            hidden = self.fc(hidden)  # [B, Tq, n_aux*Ht] -> [B, Tq, H]
        embeds = self.embed_tokens(token_ids)  # [B, Tq, H]
        layer = self.midlayer if layer is None else layer
        out, kv = layer(embeds, hidden, pos, cache, q_index, key_mask)  # out: pre-norm [B, Tq, H]
        normed = self.norm(out)  # [B, Tq, H]
        logits = self.lm_head(normed)  # [B, Tq, draft_vocab]
        return (normed if self.config.norm_output else out), logits, kv


def flavour_of(c: DrafterConfig) -> str:
    """The name of the drafter's variant: a key of :data:`FLAVOURS` when its flags are exactly one
    of them, else ``"eagle3+flag+..."`` naming the flags set (e.g. ``"eagle3+norm_before_fc"``)."""
    on = {k: True for k in FLAVOUR_FLAGS if getattr(c, k)}
    for name, flags in FLAVOURS.items():
        if flags == on:
            return name
    return "+".join(["eagle3", *on])


def swap_norm_flavour(sd: dict, c: DrafterConfig) -> tuple[dict, DrafterConfig] | None:
    """The same trained weights read as the other pre-fc norm: ``fc_norm`` <-> ``norm_before_fc``
    (the EAGLE-3.1 flavour mix-up), ``norm_output`` unchanged. The scales carry over: the per-aux
    weights ``fc_norm.{i}.weight`` [Ht] concatenated are ``input_norm.weight`` [n_aux*Ht] and back;
    only the RMS statistics change (per aux state vs over the whole concatenation).

    Args:
        sd: a state dict (or an export's tensors) of a drafter with config ``c``.

    Returns:
        ``(state dict, config)`` of the swapped reading, or None when ``c`` sets neither or both
        of the two norms (no other flavour to read it as).
    """
    if c.fc_norm == c.norm_before_fc or not getattr(c, "reads_norm_before_fc", True):
        return None  # the second case: the MLA head (drafter/mla.py), no engine reads that norm
    out = {k: v for k, v in sd.items() if not k.startswith(("fc_norm.", "input_norm."))}
    if c.fc_norm:
        ws = [sd[f"fc_norm.{i}.weight"] for i in range(c.n_aux)]  # n_aux x [Ht]
        out["input_norm.weight"] = torch.cat(ws)  # [n_aux*Ht]
    else:
        for i, w in enumerate(sd["input_norm.weight"].chunk(c.n_aux)):  # n_aux x [Ht]
            out[f"fc_norm.{i}.weight"] = w.clone()
    return out, replace(c, fc_norm=c.norm_before_fc, norm_before_fc=c.fc_norm)  # same class


def swapped_drafter(d: Eagle3Drafter) -> Eagle3Drafter | None:
    """A copy of ``d`` read as the other EAGLE-3.1 flavour (:func:`swap_norm_flavour`), same
    class, device and mode; None when ``d`` has no other flavour."""
    got = swap_norm_flavour(d.state_dict(), d.config)
    if got is None:
        return None
    sd, c = got
    out = type(d)(c).to(d.embed_tokens.weight.device)
    out.load_state_dict(sd)
    return out.train(d.training)
