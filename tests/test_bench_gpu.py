"""bench/real_shape.py (random-weight targets of a real shape, built from configs) and the parts
of bench/gpu_workbook.py that run without a GPU; the GPU stages themselves run only on the device
host (bash bench/gpu_h200.sh)."""

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import real_shape  # noqa: E402


def _tiny(kind: str) -> dict:
    small = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        max_position_embeddings=256)  # fmt: skip
    if kind == "llama":
        return real_shape.llama31_8b_config(num_hidden_layers=4, intermediate_size=96,
            vocab_size=700, bos_token_id=600, eos_token_id=601, **small)  # fmt: skip
    return real_shape.qwen3_moe_config(4, intermediate_size=96, moe_intermediate_size=32,
        num_experts=4, num_experts_per_tok=2, vocab_size=700, bos_token_id=600,
        eos_token_id=601, **small)  # fmt: skip


def test_real_configs_are_the_published_shapes():
    # the numbers of Llama-3.1-8B's and Qwen3-30B-A3B's config.json, written here by hand
    ll = real_shape.llama31_8b_config()
    assert (ll["hidden_size"], ll["num_hidden_layers"], ll["num_attention_heads"]) == (4096, 32, 32)
    assert (ll["num_key_value_heads"], ll["intermediate_size"], ll["vocab_size"]) == (
        8,
        14336,
        128256,
    )
    assert ll["rope_theta"] == 500000.0 and ll["rope_scaling"]["rope_type"] == "llama3"
    q = real_shape.qwen3_moe_config(10)
    assert (q["hidden_size"], q["num_hidden_layers"], q["num_experts"]) == (2048, 10, 128)
    assert (q["num_experts_per_tok"], q["moe_intermediate_size"], q["vocab_size"]) == (
        8,
        768,
        151936,
    )


def test_tokenizer_covers_the_vocab_and_round_trips_text():
    tok = real_shape.build_tokenizer(700, 600, 601)
    assert len(tok) == 700 and tok.bos_token_id == 600 and tok.eos_token_id == 601
    text = "Once upon a time, a café — ünïcode & 123!"
    ids = tok(text)["input_ids"]
    assert ids[0] == 600 and len(ids) == 1 + len(text.encode())  # BOS, then one id per byte
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert all(tok.decode([i]) for i in range(700))  # every id decodes to some text
    assert tok.convert_ids_to_tokens(650) == "<x650>"
    with pytest.raises(ValueError, match="vocab_size=100"):
        real_shape.build_tokenizer(100, 60, 61)


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_written_target_loads_in_hf_and_eagle3nb(kind, tmp_path):
    from eagle3nb.preflight import check_against_model
    from eagle3nb.params import RunParams
    from eagle3nb.target import models

    cfg = _tiny(kind)
    out = real_shape.write_target(cfg, tmp_path / kind, weights="random", dtype="float32")
    back = json.loads((out / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "num_key_value_heads"):
        assert back[key] == cfg[key]
    assert back["architectures"] == cfg["architectures"]
    model, tok, _ = models.load_target(str(out), "float32", "cpu")
    assert model.config.vocab_size == len(tok) == 700
    assert models.stop_token_ids(model, tok) == [601]
    # the saved weights are the seeded from_config model's, and run
    again = real_shape.hf_from_config(cfg, "cpu", "float32", 0)
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    x = tok("a tale")["input_ids"]
    assert torch.isfinite(model(torch.tensor([x])).logits).all()
    # preflight accepts the folder (HF only: no engine)
    p = RunParams(model=str(out), extract_engine="hf", vllm_extract=False, eval_engines=["simulator"],
        draft_vocab_size=64)  # fmt: skip
    assert check_against_model(p)["n_layers"] == 4
    # a second call with the same config reuses the folder
    stamp = (out / ".complete").stat().st_mtime_ns
    assert real_shape.write_target(cfg, tmp_path / kind, weights="random", dtype="float32") == out
    assert (out / ".complete").stat().st_mtime_ns == stamp


def test_default_checks_against_the_cpu_reference():
    import gpu_workbook as gw

    m = {"eval": {"tau": {"trained": 3.90, "trained, layer offset": 2.9,
        "trained, served by vLLM 0.26.0": 3.91}, "trained_boundaries": [1, 2, 4],
        "greedy_mismatches": 0}}  # fmt: skip
    c = gw.default_checks(m)
    assert c["tau_trained_minus_cpu"] == round(3.90 - 3.9507, 4)
    assert c["tau_within_tolerance"] and c["same_boundaries_as_cpu"]
    assert c["served_vs_simulator_rel"] == round(0.01 / 3.90, 5) and c["served_within_tolerance"]
    m["eval"]["tau"]["trained"] = 3.5
    assert not gw.default_checks(m)["tau_within_tolerance"]
    assert gw.default_checks({})["tau_trained"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_gpu_stages_need_cuda_and_say_so(tmp_path):
    import gpu_workbook as gw

    # without CUDA the script runs its CPU plumbing mode: the env stage reports the CPU
    assert gw.main(["--stages", "env", "--out", str(tmp_path), "--time-budget-s", "60"]) == 0
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["device"]["device"] == "cpu" and env["versions"]["torch"] == torch.__version__
    assert env["disk_write"]["bytes_per_s"] > 0 and "copy_gb_per_s" not in env


def test_code_hash_covers_the_code_and_nothing_else(tmp_path, monkeypatch):
    """The bench JSONs' code_sha256: path + bytes of eagle3nb/**/*.py, bench/*.py|sh, params/*.yaml
    in sorted order (recomputed here by hand on a two-file tree); other files do not count."""
    import hashlib

    import gpu_workbook as gw

    (tmp_path / "eagle3nb" / "x").mkdir(parents=True)
    (tmp_path / "params").mkdir()
    (tmp_path / "eagle3nb" / "x" / "a.py").write_text("A = 1\n")
    (tmp_path / "params" / "p.yaml").write_text("k: 1\n")
    (tmp_path / "README.md").write_text("not code\n")
    monkeypatch.setattr(gw, "ROOT", tmp_path)
    want = hashlib.sha256(b"eagle3nb/x/a.py\0A = 1\n\0params/p.yaml\0k: 1\n\0").hexdigest()
    assert gw.code_sha256() == want
    (tmp_path / "README.md").write_text("changed\n")
    assert gw.code_sha256() == want
    (tmp_path / "params" / "p.yaml").write_text("k: 2\n")
    assert gw.code_sha256() != want


def test_host_profiles_name_where_host_time_goes():
    """bench/gpu_engines.py's host tables (the next GPU run's diagnosis of the MoE capture's host
    time) on CPU: a call that spends its time in one Python function and one torch op must show
    both at the top."""
    import time as _time

    import gpu_engines as ge

    x = torch.randn(512, 512)

    def slow_python_part():
        _time.sleep(0.05)

    def call():
        slow_python_part()
        for _ in range(5):
            x @ x

    py = ge.python_profile(call, rows=5)
    assert "slow_python_part" in py or "sleep" in py
    ops = ge.kernel_table(call, 5, "self_cpu_time_total")
    assert "aten::mm" in ops.split("\n", 4)[3]  # the first row under the header
