"""eagle3nb.boundaries.engine_read: an export read back as SGLang and vLLM read it gives the trained
boundaries; engine-default ids and flags an engine ignores are reported."""

import pytest
import json


from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.boundaries.engine_read import engine_report, read_as_engine
from eagle3nb.drafter.export import export_drafter


def exported_config(tmp_path, model, norm_before_residual=False):
    c = DrafterConfig.for_target(model.config, 512, num_attention_heads=2, num_key_value_heads=2)
    c.norm_before_residual = norm_before_residual
    out = export_drafter(
        Eagle3Drafter(c, model.get_input_embeddings().weight.detach()),
        tmp_path / "d",
        [1, 2, 4],
        5,
        {},
        1,
        2,
    )
    return json.loads((out / "config.json").read_text())


def test_both_engines_read_back_the_trained_boundaries(target, tmp_path):
    model, _, _ = target
    cfg = exported_config(tmp_path, model)
    assert read_as_engine(cfg, "sglang", 5)["boundaries"] == [1, 2, 4]
    assert read_as_engine(cfg, "vllm", 5)["boundaries"] == [1, 2, 4]
    rep = engine_report(cfg, [1, 2, 4], 5, {"norm_before_residual": False})
    assert all(r["ok"] for r in rep.values())
    # every shape flag survives export as the engines read it
    f = read_as_engine(cfg, "vllm", 5)["flags"]
    assert (
        f["num_attention_heads"] == 2
        and f["draft_vocab_size"] == 512
        and f["target_hidden_size"] == 64
    )


def test_engine_default_ids_when_key_missing_are_reported(target, tmp_path):
    model, _, _ = target
    cfg = exported_config(tmp_path, model)
    del cfg["eagle_config"]  # SGLang falls back to its default [2, N//2, N-3] = [2, 2, 2] at N=5
    rep = engine_report(cfg, [1, 2, 4], 5, {})
    assert rep["sglang"]["ids_source"] == "engine default" and not rep["sglang"]["matches_training"]
    assert rep["vllm"]["ok"]


def test_flag_sglang_ignores_is_reported(target, tmp_path):
    model, _, _ = target
    cfg = exported_config(tmp_path, model, norm_before_residual=True)
    rep = engine_report(cfg, [1, 2, 4], 5, {"norm_before_residual": True})
    assert rep["sglang"]["ignored_flags"] == ["norm_before_residual"] and not rep["sglang"]["ok"]
    assert rep["vllm"]["ignored_flags"] == [] and rep["vllm"]["ok"]


def test_target_named_for_vllm_serve_drafter_and_ids_unchanged(target, tmp_path):
    """The speculators keys name the target (what vLLM serves for `vllm serve DRAFTER`) and change
    neither engine's boundaries; without a target in the manifest no such keys are written."""
    from eagle3nb.boundaries.engine_read import vllm_serve_drafter

    model, _, path = target
    c = DrafterConfig.for_target(model.config, 512, num_attention_heads=2, num_key_value_heads=2)
    d = Eagle3Drafter(c, model.get_input_embeddings().weight.detach())
    man = {"target": {"path": str(path), "architecture": "LlamaForCausalLM"}}
    out = export_drafter(d, tmp_path / "d", [1, 2, 4], 5, man, 1, 2, num_speculative_tokens=3)
    cfg = json.loads((out / "config.json").read_text())
    plain = exported_config(tmp_path / "plain", model)
    assert "speculators_config" not in plain
    for engine in ("sglang", "vllm"):
        assert read_as_engine(cfg, engine, 5) == read_as_engine(plain, engine, 5)
    got = vllm_serve_drafter(cfg, str(out), {"num_speculative_tokens": 5})
    assert got["model"] == str(path) and cfg["model_type"] == "llama"
    assert got["speculative_config"] == {
        "method": "eagle3",
        "num_speculative_tokens": 5,
        "model": str(out),
    }
    assert vllm_serve_drafter(cfg, str(out))["speculative_config"]["num_speculative_tokens"] == 3
    assert vllm_serve_drafter(plain, str(out)) is None


def test_vllm_reads_the_nested_ids_when_the_top_level_key_is_absent(target, tmp_path):
    # vLLM 0.32.0 gpu_model_runner.py:5251-5285: SGLang's nested ids [0, 1, 3] are read as vLLM ids
    model, _, _ = target
    cfg = exported_config(tmp_path, model)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]
    del cfg["eagle_aux_hidden_state_layer_ids"]
    r = read_as_engine(cfg, "vllm", 5)
    assert r["boundaries"] == [0, 1, 3] and r["ids_source"].startswith("config (nested")
    rep = engine_report(cfg, [1, 2, 4], 5, {})
    assert not rep["vllm"]["matches_training"] and rep["sglang"]["ok"]
    cfg["eagle_aux_hidden_state_layer_ids"] = []  # empty counts as absent there too
    assert read_as_engine(cfg, "vllm", 5)["boundaries"] == [0, 1, 3]
    del cfg["eagle_config"]
    assert read_as_engine(cfg, "vllm", 5)["ids_source"] == "engine default"
    cfg["dflash_config"] = {"target_layer_ids": [0, 2]}  # DFlash ids are shifted by +1
    assert read_as_engine(cfg, "vllm", 5)["boundaries"] == [1, 3]


def test_sglang_served_id_minus_one_reads_boundary_zero():
    """SGLang 0.5.23 serves id -1 as boundary 0 on +1-rule classes (llama.py:929-941 adds 1, layer
    index 0 captures the embeddings; test_sglang_serve serves such an offset copy), so reading a
    served config must not refuse it; a class whose shift depends on the ids (DeepSeek) still does."""
    from eagle3nb.boundaries.engine_read import read_as_engine
    from eagle3nb.boundaries.rules import engine_rule

    cfg = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 0, 2]}}
    # by hand: each id + 1 -> [0, 1, 3]
    assert read_as_engine(cfg, "sglang", 5)["boundaries"] == [0, 1, 3]
    llama = engine_rule("sglang", "0.5.23", "LlamaForCausalLM")
    assert read_as_engine(cfg, "sglang", 5, llama)["boundaries"] == [0, 1, 3]
    with pytest.raises(ValueError, match="non-negative layer ids"):
        read_as_engine(cfg, "sglang", 5, engine_rule("sglang", "0.5.23", "DeepseekV3ForCausalLM"))
    with pytest.raises(ValueError, match="means boundary -1"):
        read_as_engine({"eagle_aux_hidden_state_layer_ids": [-1, 0, 2]}, "vllm", 5)
