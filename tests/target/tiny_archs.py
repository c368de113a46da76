"""Tiny random-weight HF models of every target class eagle3nb accepts, built from configs at test
time (no download): 3 decoder layers, hidden 64, head_dim 16, 4 experts / top-2 where MoE, vocab
128. Used by tests/target/test_archs.py and tests/test_preflight_archs.py."""

from __future__ import annotations

import torch

V, H, N = 128, 64, 3
_ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
_BASE = dict(vocab_size=V, hidden_size=H, intermediate_size=96, num_hidden_layers=N, **_ATTN)
_DS = dict(  # DeepSeek-V3 MLA + MoE (also Kimi-K2's text model)
    _BASE,
    num_key_value_heads=4,
    head_dim=8,
    moe_intermediate_size=32,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
)
_GLM = dict(
    _BASE,
    moe_intermediate_size=32,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
)
_MOE = dict(_BASE, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
_LOCAL = dict(_BASE, num_local_experts=4, num_experts_per_tok=2, bos_token_id=1, eos_token_id=2)

# architecture -> (model_type, config kwargs); wrappers carry their text model under text_config
TINY = {
    "LlamaForCausalLM": ("llama", _BASE),
    "MistralForCausalLM": ("mistral", _BASE),
    "Qwen2ForCausalLM": ("qwen2", _BASE),
    "Qwen3ForCausalLM": ("qwen3", _BASE),
    "Qwen3MoeForCausalLM": ("qwen3_moe", _MOE),
    "DeepseekV3ForCausalLM": ("deepseek_v3", _DS),
    "GptOssForCausalLM": ("gpt_oss", dict(_LOCAL, sliding_window=8)),
    "Glm4MoeForCausalLM": ("glm4_moe", _GLM),
    "Llama4ForCausalLM": ("llama4_text", dict(_LOCAL, intermediate_size_mlp=96)),
    "Gemma3ForCausalLM": ("gemma3_text", dict(_BASE, sliding_window=8)),
    "MiniMaxM2ForCausalLM": ("minimax_m2", _LOCAL),
    "MixtralForCausalLM": ("mixtral", _LOCAL),
    "Gemma3ForConditionalGeneration": (
        "gemma3",
        dict(
            text_config=dict(_BASE, model_type="gemma3_text", sliding_window=8),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,
            ),
            mm_tokens_per_image=4,
        ),
    ),
    "Kimi_K25ForConditionalGeneration": (
        "kimi_k25",
        dict(
            text_config=dict(_DS, model_type="kimi_k2"),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                pos_emb_height=4,
                pos_emb_width=4,
            ),
            projection_hidden_size=32,
        ),
    ),
}


def tiny_config(arch: str):
    """The HF config object of a tiny ``arch`` model (``architectures`` set)."""
    from transformers import AutoConfig

    model_type, kw = TINY[arch]
    return AutoConfig.for_model(model_type, architectures=[arch], **kw)


def tiny_model(arch: str, seed: int = 0):
    """A tiny random-weight ``arch`` model in float32, eval mode, eager attention."""
    import transformers

    torch.manual_seed(seed)
    cfg = tiny_config(arch)
    cfg._attn_implementation = "eager"
    model = getattr(transformers, arch)(cfg).float().eval()
    with torch.no_grad():  # router weights std 1: top-k choices are not near-ties
        for name, p in model.named_parameters():
            if name.endswith(("gate.weight", "router.weight")) and p.dim() == 2:
                p.normal_(0.0, 1.0)
    return model
