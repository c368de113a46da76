"""Every class x engine combination that does not capture on this CPU is refused by preflight
before any notebook, with a message naming the class, the engine and its installed version, why,
and what to do (eagle3nb.boundaries.rules CPU_LIMITS and CPU_CONFIG_LIMITS); the configs the
engine does run pass (vLLM DeepSeek with a 576-wide MLA latent head and YaRN)."""

import json
import sys
from pathlib import Path

import pytest

from eagle3nb.params import RunParams
from testkit import requires_engine
from eagle3nb.preflight import check_against_model
from eagle3nb.boundaries.rules import CPU_CONFIG_LIMITS, CPU_LIMITS, RULES

sys.path.insert(0, str(Path(__file__).parent / "target"))
from tiny_archs import tiny_config  # noqa: E402

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
YARN.update(beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, rope_theta=10000.0)
PARAM = {"sglang": dict(extract_engine="sglang"), "vllm": dict(vllm_extract=True)}
FIX = {"sglang": "set extract_engine: hf", "vllm": "set vllm_extract: false"}


def _folder(tmp_path, arch: str, **over) -> str:
    cfg = tiny_config(arch).to_dict()
    text = cfg.get("text_config") or cfg
    text.update(hidden_size=128, head_dim=32, num_hidden_layers=7, **over)
    d = tmp_path / arch
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer.json").write_text("{}")
    return str(d)


def _run(m, engine, **kw):
    base = dict(
        generate_engine="hf", eval_engines=["simulator"], vllm_extract=False, extract_engine="hf"
    )
    base.update(draft_vocab_size=64, convention="vllm", layer_ids=[2, 3], device="cpu")
    base.update(PARAM[engine], **kw)
    return check_against_model(RunParams(model=m, **base))


# class-wide (CPU_LIMITS), and Kimi-K2.5 on vLLM, refused whatever its config (not run here)
REFUSED = sorted({(e, a) for (e, v, a), uses in CPU_LIMITS.items() if "capture" in uses})
REFUSED.append(("vllm", "Kimi_K25ForConditionalGeneration"))
assert ("vllm", "0.32.0", "Kimi_K25ForConditionalGeneration") in CPU_CONFIG_LIMITS


@pytest.mark.parametrize("engine,arch", REFUSED)
def test_capture_refused_on_cpu_names_class_engine_version_and_fix(tmp_path, engine, arch):
    assert RULES[(engine, {"sglang": "0.5.23", "vllm": "0.32.0"}[engine], arch)].refused is None
    with pytest.raises(ValueError) as e:
        _run(_folder(tmp_path, arch), engine)
    msg = str(e.value)
    version = {"sglang": r"0\.5\.23", "vllm": r"0\.32\.0"}[engine]
    assert f"({arch}, 7 layers" in msg
    assert pytest.importorskip("re").search(
        rf"{engine} {version} cannot capture {arch} on CPU: .+; {FIX[engine]}, or run on a GPU "
        r"\(device: cuda\)",
        msg,
    ), msg


@pytest.mark.parametrize(
    "over,why",
    [
        (dict(kv_lora_rank=32, qk_rope_head_dim=16), r"576 \(this config: 48"),
        (dict(kv_lora_rank=512, qk_rope_head_dim=64), r"without YaRN rope"),
    ],
)
def test_vllm_deepseek_mla_config_limits(tmp_path, over, why):
    m = _folder(tmp_path, "DeepseekV3ForCausalLM", **over)
    with pytest.raises(ValueError, match=why):
        _run(m, "vllm")


def test_vllm_deepseek_with_576_latent_and_yarn_captures_on_cpu_mla_but_cannot_serve(tmp_path):
    """Capture passes (eagle3nb's vLLM backend asks for CPU_MLA; measured against HF in
    tests/engines/test_vllm_cpu_mla.py); serving is refused with what was measured and the fix."""
    over = dict(kv_lora_rank=512, qk_rope_head_dim=64, rope_parameters=YARN, rope_scaling=YARN)
    m = _folder(tmp_path, "DeepseekV3ForCausalLM", **over)
    assert _run(m, "vllm")["engines"]["vllm"]["version"] == "0.32.0"
    with pytest.raises(ValueError) as e:
        _run(m, "vllm", vllm_extract=False, eval_engines=["vllm"])
    assert str(e.value).endswith(
        "vllm 0.32.0 cannot serve DeepseekV3ForCausalLM on CPU: with attention_backend CPU_MLA "
        "(which eagle3nb sets on CPU for MLA targets) plain generation and capture match HF, but "
        "serving a drafter fails at engine build with 'No common block size for 128 (CPU_MLA: "
        "[16]; CPU_ATTN: [MultipleOf(32)])' (v1/worker/utils.py:555): the target's CPU_MLA takes "
        "KV blocks of exactly 16 (v1/attention/backends/mla/cpu_mla.py:67-72), the drafter's "
        "CPU_ATTN only multiples of 32 (v1/attention/backends/cpu_attn.py:65-66), and no option "
        "changes either (block_size 32: 'No common block size for 16'); AMX_MLA, vLLM's own pick "
        "on this CPU, takes no float32 weights (v1/attention/backends/mla/amx_mla.py:303); leave "
        "vllm out of eval_engines, or run on a GPU (device: cuda)"
    ), str(e.value)


@requires_engine("vllm")
@requires_engine("sglang")
def test_the_mla_head_is_served_by_vllm_refused_by_sglang_and_only_for_mla_targets(tmp_path):
    """drafter_head mla: vLLM 0.32 serves it beside a DeepSeek target on CPU (measured in
    tests/engines/test_vllm_mla.py), SGLang 0.5.23 is refused with its measured error, a target
    without MLA is refused whichever engine serves."""
    over = dict(kv_lora_rank=512, qk_rope_head_dim=64, rope_parameters=YARN, rope_scaling=YARN)
    m = _folder(tmp_path, "DeepseekV3ForCausalLM", **over)
    (tmp_path / "x").mkdir()
    serve = dict(vllm_extract=False, eval_engines=["vllm"], drafter_head="mla")
    assert _run(m, "vllm", **serve)["engines"]["vllm"]["version"] == "0.32.0"
    with pytest.raises(ValueError, match="without YaRN rope"):  # the target's own CPU_MLA limit
        _run(
            _folder(
                tmp_path / "x",
                "DeepseekV3ForCausalLM",
                **over | {"rope_parameters": None, "rope_scaling": None},
            ),
            "vllm",
            **serve,
        )
    with pytest.raises(ValueError) as e:
        _run(m, "sglang", extract_engine="hf", eval_engines=["sglang"], drafter_head="mla")
    assert (
        "sglang 0.5.23 cannot serve_mla DeepseekV3ForCausalLM on CPU: its MLA drafter class calls "
        "torch.cuda.synchronize() unconditionally when it takes the target's embedding "
        "(srt/models/kimi_k25_eagle3.py:415, set_embed)"
    ) in str(e.value)
    with pytest.raises(ValueError, match="drafter_head='mla' on model=.+LlamaForCausalLM.+set "):
        _run(_folder(tmp_path, "LlamaForCausalLM"), "vllm", drafter_head="mla")


def test_vllm_gpt_oss_and_llama4_config_limits(tmp_path):
    with pytest.raises(ValueError, match=r"rope_parameters\['factor'\]"):
        _run(
            _folder(tmp_path, "GptOssForCausalLM", rope_parameters={"rope_type": "default"}), "vllm"
        )
    m = _folder(tmp_path, "Llama4ForCausalLM", attention_chunk_size=64)
    with pytest.raises(ValueError, match=r"attention_chunk_size 64 is not divisible"):
        _run(m, "vllm")
