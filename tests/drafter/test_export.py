"""eagle3nb.drafter.export: export and load compute the same function, each engine's ids in its own key,
boundaries an engine cannot capture refused, broken or contradictory folders refused."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.drafter.export import REQUIRED_TENSORS, export_drafter, load_drafter
from eagle3nb.drafter.vocab import build_draft_vocab
from eagle3nb.boundaries.refusal import REFUSED_MARK


def make_drafter(model, dv=256):
    torch.manual_seed(1)
    d = Eagle3Drafter(
        DrafterConfig.for_target(model.config, dv), model.get_input_embeddings().weight.detach()
    )
    counts = torch.arange(512).flip(0)
    d.set_vocab(*build_draft_vocab(counts, dv))
    for p in d.parameters():
        if p.requires_grad:
            p.data.normal_(0, 0.1)
    return d


def test_round_trip_same_function(target, tmp_path):
    model, _, _ = target
    d = make_drafter(model)
    out = export_drafter(d, tmp_path / "drafter", [1, 2, 4], 5, {"kind": "test"}, 1, 2)
    d2, cfg = load_drafter(out, model.get_input_embeddings().weight.detach())
    ids = torch.randint(0, 512, (2, 9))
    aux = torch.randn(2, 9, 192)
    idx = torch.arange(9)
    a = d.step(ids, aux, idx[None].expand(2, 9), [], idx)[1]
    b = d2.step(ids, aux, idx[None].expand(2, 9), [], idx)[1]
    assert torch.equal(a, b) and torch.equal(d.d2t, d2.d2t) and torch.equal(d.t2d, d2.t2d)


def test_config_carries_each_engines_ids(target, tmp_path):
    model, _, _ = target
    out = export_drafter(make_drafter(model), tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    # SGLang: nested key, id = boundary - 1; vLLM: top-level key, id = boundary
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    assert cfg["draft_vocab_size"] == 256 and cfg["vocab_size"] == 512
    assert cfg["target_hidden_size"] == 64 and cfg["tie_word_embeddings"] is False
    sd = load_file(str(out / "model.safetensors"))
    assert set(REQUIRED_TENSORS) <= set(sd) and not any(k.startswith("embed_tokens") for k in sd)
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool


def test_boundary_sglang_cannot_capture_refuses_sglang_alone(target, tmp_path):
    """No class in the manifest: the generic conventions (SGLang 1..N-1, vLLM 0..N). Boundary N
    refuses the SGLang side by name; the vLLM side is exported (tests/drafter/test_variants.py
    has the per-class rules)."""
    model, _, _ = target
    out = export_drafter(make_drafter(model), tmp_path / "d", [1, 2, 5], 5, {}, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    why = cfg["eagle3nb"]["refused_engines"]["sglang"]
    assert "cannot be captured by 'sglang'" in why
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 5]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, f"{REFUSED_MARK}: {why}"]
    assert "sglang" not in cfg["eagle3nb"].get("retrain", {})  # no class: no rule to pick by


@pytest.mark.parametrize("drop", ["lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight"])
def test_loader_refuses_missing_tensor(target, tmp_path, drop):
    model, _, _ = target
    out = export_drafter(make_drafter(model), tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)
    sd = load_file(str(out / "model.safetensors"))
    del sd[drop]
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=drop.replace(".", r"\.")):
        load_drafter(out)


def test_loader_refuses_contradictions(target, tmp_path):
    model, _, _ = target
    out = export_drafter(make_drafter(model), tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    cfg["target_hidden_size"] = 32  # fc width would be 3 x 32, file has 3 x 64
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="fc.weight"):
        load_drafter(out)
    cfg["target_hidden_size"] = 64
    (out / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(out / "model.safetensors"))
    sd["d2t"] = torch.arange(256) + sd["d2t"]  # absolute ids instead of offsets
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match="offsets"):
        load_drafter(out)


def test_artefacts_readable_by_other_users(target, tmp_path):
    """Temp-then-rename writes keep the umask's permissions (tempfile alone makes 0600/0700)."""
    import os
    import stat

    from eagle3nb.manifest import atomic_write_json

    model, _, _ = target
    old = os.umask(0o022)
    try:
        out = export_drafter(make_drafter(model), tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)
        atomic_write_json(tmp_path / "m.json", {})
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    for f in [*out.iterdir(), tmp_path / "m.json"]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


def test_full_vocab_is_written_without_d2t_t2d(target, tmp_path):
    """draft_vocab_size == vocab_size: vLLM 0.32 has no draft_id_to_target_id at that size
    (llama_eagle3.py:338-344), so the export leaves d2t/t2d out; load_drafter reads the identity."""
    model, _, _ = target
    d = make_drafter(model, dv=512)
    assert not d.d2t.any() and bool(d.t2d.all())
    out = export_drafter(d, tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)
    sd = load_file(str(out / "model.safetensors"))
    assert "d2t" not in sd and "t2d" not in sd and sd["lm_head.weight"].shape[0] == 512
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == cfg["vocab_size"] == 512
    d2, _ = load_drafter(out, model.get_input_embeddings().weight.detach())
    assert torch.equal(d2.d2t, torch.zeros(512, dtype=torch.long)) and bool(d2.t2d.all())
    ids, aux, idx = torch.randint(0, 512, (1, 7)), torch.randn(1, 7, 192), torch.arange(7)
    a = d.step(ids, aux, idx[None], [], idx)[1]
    assert torch.equal(a, d2.step(ids, aux, idx[None], [], idx)[1])
    d.d2t[3] = 1  # a permutation at full size: no engine loads it
    with pytest.raises(ValueError, match="full vocab but d2t is not all zeros"):
        export_drafter(d, tmp_path / "e", [1, 2, 4], 5, {}, 1, 2)


@pytest.mark.parametrize(
    "arch,bnds,sglang_ids,vllm_ids,kinds",
    [
        ("LlamaForCausalLM", [1, 2, 4], [0, 1, 3], [1, 2, 4], ("plus1", "same")),
        ("GptOssForCausalLM", [1, 3, 6], [0, 2, 5], [1, 3, 6], ("unless_n", "same")),
        ("GptOssForCausalLM", [0, 3, 6], [0, 3, 6], [0, 3, 6], ("unless_n", "same")),
        ("GptOssForCausalLM", [1, 3, 5], [0, 2, 4], [1, 3, 5], ("unless_n", "same")),
        ("DeepseekV3ForCausalLM", [2, 3, 5], [2, 3, 5], [2, 3, 5], ("first_id_1", "same")),
        ("Qwen3MoeForCausalLM", [1, 3, 5], [0, 2, 4], [1, 3, 5], ("plus1", "same")),
        ("Llama4ForCausalLM", [0, 3, 5], None, [0, 3, 5], (None, "same")),
    ],
)
def test_ids_follow_each_engines_rule_for_the_target_class(
    target, tmp_path, arch, bnds, sglang_ids, vllm_ids, kinds
):
    """Ids in config.json are what engine_rules says each engine reads as the trained boundaries
    (a 6-layer target), and the engine readers read them back as those boundaries."""
    from eagle3nb.boundaries.engine_read import engine_report

    model, _, _ = target
    man = {"target": {"path": "/t", "architecture": arch}}
    out = export_drafter(make_drafter(model), tmp_path / "d", bnds, 6, man, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    if sglang_ids is None:  # SGLang cannot capture boundary 0 of a plus1 class: refused by name
        why = cfg["eagle3nb"]["refused_engines"]["sglang"]
        assert why.startswith("sglang 0.5.23 refused:") and "Llama4ForCausalLM captures" in why
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
            1,
            f"{REFUSED_MARK}: {why}",
        ]
        assert cfg["eagle_aux_hidden_state_layer_ids"] == vllm_ids
        return
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == sglang_ids
    assert cfg["eagle_aux_hidden_state_layer_ids"] == vllm_ids
    rec = cfg["eagle3nb"]["engine_ids"]
    assert (rec["sglang"]["rule"], rec["vllm"]["rule"]) == kinds
    assert (rec["sglang"]["version"], rec["vllm"]["version"]) == ("0.5.23", "0.32.0")
    rep = engine_report(cfg, bnds, 6, {})
    assert rep["sglang"]["boundaries"] == rep["vllm"]["boundaries"] == bnds


def test_refused_class_gets_the_convention_and_the_reason(target, tmp_path):
    model, _, _ = target
    man = {"target": {"path": "/t", "architecture": "MixtralForCausalLM"}}
    out = export_drafter(make_drafter(model), tmp_path / "d", [1, 2, 4], 5, man, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    rec = cfg["eagle3nb"]["engine_ids"]
    assert "set_eagle3_layers_to_capture" in rec["sglang"]["refused"]
    assert "SupportsEagle3" in rec["vllm"]["refused"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
