"""eagle3nb.target.moe_copy: the embedded Llama target re-expressed as a Mixtral MoE computes the same
function. Checked against the dense model's own logits over real prompts: bitwise equal in float64
(eager experts), and in float32 within 1e-5 of the logits' scale (measured 1.05e-5 absolute on
logits up to 20.5, i.e. 5e-7 relative: the MoE path's fused gate/up GEMM rounds differently; float64
shows it is rounding, not another function); the router picks different experts for different
tokens (so the equality is not one expert standing in for the MLP)."""

import json

import pytest
import torch

from eagle3nb.target import models
from eagle3nb.target.moe_copy import DERIVED, moe_copy_config, write_moe_copy

PROMPTS = ["Once upon a time, there was a little girl named Lily.", "Tom and Sam went to the park"]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    src = models.resolve_model("stories260K-hd32")
    dst = write_moe_copy(src, tmp_path_factory.mktemp("moe") / "m", num_experts=4, top_k=2)
    return src, dst


def test_moe_copy_logits_equal_dense(moe):
    from transformers import AutoModelForCausalLM, MixtralForCausalLM

    src, dst = moe
    dense = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    sparse = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    assert isinstance(sparse, MixtralForCausalLM)
    assert sparse.config.num_local_experts == 4 and sparse.config.num_experts_per_tok == 2
    tok = models.load_tokenizer(src)
    picks = [set() for _ in range(sparse.config.num_hidden_layers)]
    for text in PROMPTS:
        ids = torch.tensor([tok(text).input_ids])
        with torch.no_grad():
            a = dense(ids, output_hidden_states=True)
            b = sparse(ids, output_hidden_states=True, output_router_logits=True)
        err = float((a.logits - b.logits).abs().max())
        scale = float(a.logits.abs().max())
        assert err <= 1e-5 * scale, f"MoE copy logits differ by {err:.2e} (scale {scale:.1f})"
        assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1))
        for hd, hs in zip(a.hidden_states, b.hidden_states):
            assert float((hd - hs).abs().max()) <= 1e-5 * float(hd.abs().max())
        for layer, logits in zip(picks, b.router_logits):
            layer.update(tuple(sorted(r)) for r in logits.topk(2, dim=-1).indices.tolist())
    # the router really routes: in every layer some tokens go to experts 0-1, others to 2-3
    assert all(p == {(0, 1), (2, 3)} for p in picks), picks


def test_moe_copy_is_the_same_function_in_float64(moe):
    from transformers import AutoModelForCausalLM

    src, dst = moe
    dense = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float64).eval()
    sparse = AutoModelForCausalLM.from_pretrained(
        dst, dtype=torch.float64, experts_implementation="eager"
    ).eval()
    tok = models.load_tokenizer(src)
    for text in PROMPTS:
        ids = torch.tensor([tok(text).input_ids])
        with torch.no_grad():
            assert torch.equal(dense(ids).logits, sparse(ids).logits)


def test_moe_copy_weights_are_expert_copies(moe):
    from safetensors.torch import load_file

    src, dst = moe
    d, s = load_file(str(src / "model.safetensors")), load_file(str(dst / "model.safetensors"))
    for e in range(4):
        w = s[f"model.layers.3.block_sparse_moe.experts.{e}.w2.weight"]
        assert torch.equal(w, d["model.layers.3.mlp.down_proj.weight"])
    assert s["model.layers.0.block_sparse_moe.gate.weight"].shape == (4, 64)
    assert not any(".mlp." in k for k in s)
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["head_dim"] == 32
    assert (dst / "tokenizer.json").is_file()


def test_derived_name_is_built_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3NB_CACHE", str(tmp_path))
    name = "stories260K-hd32-mixtral"
    assert DERIVED[name][0] == "stories260K-hd32"
    p = models.resolve_model(name)
    assert p == (tmp_path / "models" / name).resolve()
    assert models.target_arch(models.read_model_config(p)) == "MixtralForCausalLM"
    h = models.model_hash(p)
    assert models.resolve_model(name) == p and models.model_hash(p) == h  # built once, kept


def test_refuses_what_has_no_exact_copy():
    with pytest.raises(ValueError, match=r"attention_bias=True.*no exact Mixtral copy"):
        moe_copy_config({"architectures": ["LlamaForCausalLM"], "attention_bias": True}, 4, 2)
    with pytest.raises(ValueError, match="made from a LlamaForCausalLM"):
        moe_copy_config({"architectures": ["Qwen3ForCausalLM"]}, 4, 2)
    with pytest.raises(ValueError, match="top_k <= num_experts"):
        moe_copy_config({"architectures": ["LlamaForCausalLM"]}, 2, 3)
