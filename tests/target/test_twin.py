"""eagle3nb.target.twin: a tiny twin built from a full-size config of every accepted class (the
transformers defaults of each config class are the real models' sizes: DeepSeek-V3 671B, gpt-oss,
GLM-4.5-Air, Llama-4 Scout, Gemma-3, MiniMax-M2; YaRN rope set by hand) keeps the class, rope, MLA
ranks, router fields and per-layer pattern, shrinks layers/heads/experts, loads in HF, and its HF
capture equals HF's own hidden_states at every boundary b < N."""

import json

import pytest
import torch
from safetensors import safe_open

from eagle3nb.target.capture import capture_boundaries
from eagle3nb.target.twin import build_twin, twin_config

from tiny_archs import TINY

YARN = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "rope_theta": 10000.0,
}


def _full(arch: str) -> dict:
    from transformers import AutoConfig

    model_type, kw = TINY[arch]
    sub = {k: {"model_type": v["model_type"]} for k, v in kw.items() if k == "text_config"}
    if arch == "Kimi_K25ForConditionalGeneration":
        sub["text_config"] = {"model_type": "deepseek_v3"}
    cfg = AutoConfig.for_model(model_type, architectures=[arch], **sub).to_dict()
    text = cfg.get("text_config") or cfg
    if text.get("model_type") == "deepseek_v3":
        text["rope_parameters"] = dict(YARN)  # as DeepSeek-V3 / Kimi ship it
        text["quantization_config"] = {"quant_method": "fp8"}
    return cfg


@pytest.mark.parametrize("arch", sorted(TINY))
def test_twin_of_full_size_config(arch):
    from transformers import AutoConfig
    import transformers

    full = _full(arch)
    twin = twin_config(full, vocab_size=512)
    assert full == _full(arch)  # input unchanged
    ft, tt = full.get("text_config") or full, twin.get("text_config") or twin
    assert tt["num_hidden_layers"] == 6 and tt["num_attention_heads"] == 4
    for k in (
        "rope_parameters",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "head_dim",
        "sliding_window",
        "attention_chunk_size",
        "norm_topk_prob",
        "scoring_func",
        "topk_method",
    ):
        assert tt.get(k) == ft.get(k), k
    for k in ("layer_types", "no_rope_layers"):
        assert tt.get(k) == (ft[k][:6] if k in ft else None), k
    assert "quantization_config" not in tt and "auto_map" not in twin
    for k in ("n_routed_experts", "num_experts", "num_local_experts"):
        if k in ft and ft[k]:
            assert tt[k] == min(ft[k], 4)
    kw = {k: v for k, v in twin.items() if k != "model_type"}
    cfg = AutoConfig.for_model(twin["model_type"], **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, arch)(cfg).float().eval()
    assert sum(p.numel() for p in model.parameters()) < 80e6  # wrappers: a 1-layer vision tower
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids, output_hidden_states=True).hidden_states
    got = capture_boundaries(model, ids, range(7))
    for b in range(6):
        torch.testing.assert_close(got[b], ref[b], rtol=0, atol=1e-5)


def test_twin_refuses_too_few_layers():
    with pytest.raises(ValueError, match=r"n_layers=2: a twin needs >= 4 decoder layers"):
        twin_config({"hidden_size": 64, "num_attention_heads": 4}, n_layers=2)


@pytest.mark.parametrize("declared", [None, "bfloat16"])
def test_twin_declares_the_targets_dtype(declared, tmp_path):
    """The twin's config.json declares what the target's declares (released gpt-oss: bfloat16),
    or nothing, not the float32 of its weights: SGLang builds gpt-oss's router and attention in
    ``config.dtype`` (gpt_oss.py:253, 556 in 0.5.17), and a twin declaring float32 failed every
    bf16 probe on the H100 with a dtype mismatch. What an engine reads is what transformers'
    config gives (``config.dtype``: None, or the declared dtype)."""
    from transformers import AutoConfig

    cfg = _full("GptOssForCausalLM")
    cfg["num_hidden_layers"] = 4
    if declared:
        cfg["torch_dtype"] = declared
    src = tmp_path / "full"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    out = build_twin(src, tmp_path / "twin", 4, 0, "GptOssForCausalLM")
    saved = json.loads((out / "config.json").read_text())
    assert {k: saved[k] for k in ("dtype", "torch_dtype") if k in saved} == (
        {"torch_dtype": declared} if declared else {}
    )
    got = AutoConfig.from_pretrained(out).dtype
    assert got == (getattr(torch, declared) if declared else None)
    with safe_open(str(out / "model.safetensors"), "pt") as f:  # weights stay float32
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
