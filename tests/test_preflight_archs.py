"""Preflight on every accepted target class (config.json of a tiny model, no weights): the run's
checks pass and read the layer count and vocab from the text model (wrappers keep them under
``text_config``); refused classes are named with the reason and the fix; a Kimi-K2 folder
(``model_type: kimi_k2``, which transformers does not register) loads as DeepSeek-V3 and captures
the same boundaries as the DeepSeek-V3 model it was saved from."""

import json
import shutil
import sys
from pathlib import Path

from dataclasses import replace

import pytest
import torch

from eagle3nb.params import RunParams
from eagle3nb.preflight import check_against_model
from eagle3nb.target import models
from eagle3nb.target.capture import capture_boundaries

sys.path.insert(0, str(Path(__file__).parent / "target"))
from tiny_archs import N, TINY, V, tiny_config, tiny_model  # noqa: E402

HF_ONLY = dict(
    extract_engine="hf",
    generate_engine="hf",
    eval_engines=["simulator"],
    vllm_extract=False,
    draft_vocab_size=64,
)


def _folder(tmp_path, cfg: dict, name: str) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer.json").write_text("{}")  # only its presence is checked
    return str(d)


@pytest.mark.parametrize("arch", sorted(TINY))
def test_preflight_accepts_every_class(tmp_path, arch):
    m = _folder(tmp_path, tiny_config(arch).to_dict(), arch)
    info = check_against_model(
        RunParams(model=m, convention="vllm", layer_ids=[0, 2, 3], **HF_ONLY)
    )
    assert (info["n_layers"], info["vocab_size"]) == (N, V)
    assert info["boundaries"] == [0, 2, 3]


def test_wrapper_layer_count_comes_from_text_config(tmp_path):
    cfg = tiny_config("Gemma3ForConditionalGeneration").to_dict()
    cfg["text_config"]["num_hidden_layers"] = 7
    m = _folder(tmp_path, cfg, "gemma3-7")
    assert check_against_model(RunParams(model=m, **HF_ONLY))["boundaries"] == [2, 3, 4]


def test_refused_class_names_the_reason(tmp_path):
    cfg = tiny_config("Llama4ForCausalLM").to_dict()
    cfg["architectures"] = ["Llama4ForConditionalGeneration"]
    m = _folder(tmp_path, cfg, "llama4-mm")
    with pytest.raises(
        ValueError,
        match=r"Llama4ForConditionalGeneration is refused: .*"
        r"modeling_llama4\.py:1318.*save its text model as Llama4ForCausalLM",
    ):
        check_against_model(RunParams(model=m, **HF_ONLY))


def test_class_missing_from_installed_transformers(tmp_path, monkeypatch):
    m = _folder(tmp_path, tiny_config("MiniMaxM2ForCausalLM").to_dict(), "m2")
    monkeypatch.setattr(models, "_transformers_has", lambda module: module != "minimax_m2")
    with pytest.raises(
        ValueError,
        match=r"installed transformers .* has no "
        r"transformers\.models\.minimax_m2; install a transformers release",
    ):
        check_against_model(RunParams(model=m, **HF_ONLY))


def test_kimi_k2_folder_loads_as_deepseek_v3(tmp_path):
    src = tiny_model("DeepseekV3ForCausalLM")
    d = tmp_path / "kimi-k2"
    src.save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "kimi_k2"  # as Kimi-K2's own config.json says
    (d / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(models.resolve_model("stories260K-hd32") / f, d / f)
    model, _tok, _path = models.load_target(str(d))
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    got, want = model.state_dict(), src.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    ids = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(3))
    a, b = capture_boundaries(model, ids, range(N + 1)), capture_boundaries(src, ids, range(N + 1))
    for k in range(N + 1):  # same weights; the loaded ones may sit in other strides, so another
        # matmul blocking may round the last float32 bits differently (4e-9 seen); wrong weights: ~1e-1
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


# --- each engine's rule for the target's class (eagle3nb.boundaries.rules), before any notebook


def _cfg(arch: str, **over) -> dict:
    cfg = tiny_config(arch).to_dict()
    text = cfg.get("text_config") or cfg  # wrappers: the text model's fields
    text.update(hidden_size=128, head_dim=32, **over)  # what vLLM's CPU attention accepts
    return cfg


def _params(m, **kw) -> RunParams:
    base = dict(HF_ONLY)
    base.update(kw)
    return RunParams(model=m, **base)


@pytest.mark.parametrize(
    "arch,kw,msg",
    [
        (
            "Gemma3ForCausalLM",
            dict(extract_engine="sglang", layer_ids=[1, 2]),
            r"extract_engine='sglang' on model=.*\(Gemma3ForCausalLM, 3 layers.*sglang 0\.5\.23 on "
            r"Gemma3ForCausalLM is refused: it captures each layer's MLP-branch output without the "
            r"residual.*or set extract_engine: hf",
        ),
        (
            "Glm4MoeForCausalLM",
            dict(eval_engines=["simulator", "vllm"]),
            r"eval_engines=\['simulator', 'vllm'\] on model=.*vllm 0\.32\.0 on Glm4MoeForCausalLM is "
            r"refused: .*SupportsEagle3.*or leave vllm out of eval_engines",
        ),
        (
            "Gemma3ForConditionalGeneration",
            dict(vllm_extract=True, eval_engines=["vllm"]),
            r"vllm_extract=True and eval_engines=\['vllm'\] .*refused.*set vllm_extract: false "
            r"and leave vllm out of eval_engines",
        ),
        (
            "DeepseekV3ForCausalLM",
            dict(vllm_extract=True, layer_ids=[0, 1, 2]),
            r"vllm 0\.32\.0 on DeepseekV3ForCausalLM captures boundaries 1\.\.3.*not \[0\].*TypeError",
        ),
        (  # ids [0, 1] (boundary - 1): SGLang's DeepSeek rule reads a first id other than 1 as is
            "DeepseekV3ForCausalLM",
            dict(extract_engine="sglang", layer_ids=[1, 2]),
            r"gives sglang the ids \[0, 1\].*maps to boundaries \[0, 1\] for this class \(rule "
            r"'first_id_1', sglang/srt/models/deepseek_v2\.py:3458-3473\)",
        ),
        (
            "Kimi_K25ForConditionalGeneration",
            dict(extract_engine="sglang", layer_ids=[1, 2]),
            r"maps to boundaries \[0, 1\].*kimi_k25\.py:928-941",
        ),
    ],
)
def test_engine_rule_refusals(tmp_path, arch, kw, msg):
    m = _folder(tmp_path, _cfg(arch), arch)
    kw = {"convention": "vllm", "layer_ids": [1, 2, 3], **kw}
    with pytest.raises(ValueError, match=msg):
        check_against_model(_params(m, **kw))


def test_engine_rules_accept_and_return_each_engines_ids(tmp_path):
    # DeepSeek, 7 layers: default boundaries [2, 3, 4]; SGLang ids [1, 2, 3] (first id 1: +1)
    m = _folder(tmp_path, _cfg("DeepseekV3ForCausalLM", num_hidden_layers=7), "ds7")
    # device cuda: SGLang's and vLLM's CPU paths do not run DeepSeek (next test); the rule does
    info = check_against_model(
        _params(m, extract_engine="sglang", eval_engines=["vllm"], device="cuda")
    )
    assert info["boundaries"] == [2, 3, 4]
    assert info["engines"]["sglang"]["ids"] == [1, 2, 3]
    assert info["engines"]["vllm"]["ids"] == [2, 3, 4]
    assert (info["engines"]["sglang"]["version"], info["engines"]["vllm"]["version"]) == (
        "0.5.23",
        "0.32.0",
    )
    m = _folder(tmp_path, _cfg("Qwen3MoeForCausalLM"), "moe")
    info = check_against_model(_params(m, convention="vllm", layer_ids=[1, 3], vllm_extract=True))
    assert info["engines"]["vllm"]["ids"] == [1, 3] and info["engines"]["vllm"]["rule"] == "same"


def test_unknown_engine_version_is_refused_with_how_to_measure(tmp_path, monkeypatch):
    """With twin_check off nothing measures it: refused, saying how; otherwise preflight measures
    it on the installed engine (here a fake measurement standing in for
    eagle3nb.engines.twin_measure.measure_in_preflight, which starts the engine: real ones in
    tests/steps/test_measured_run.py), and uses it."""
    import eagle3nb.engines.twin_measure as twin_measure
    import eagle3nb.engines.versions as versions
    from eagle3nb.boundaries.rules import RULES

    monkeypatch.setattr(versions, "installed_engine_version", lambda engine, python: "0.5.99")
    monkeypatch.setenv("EAGLE3NB_MEASURED_RULES", str(tmp_path / "kept"))
    m = _folder(tmp_path, _cfg("LlamaForCausalLM"), "llama")
    kw = dict(extract_engine="sglang", convention="vllm", layer_ids=[1, 2])
    with pytest.raises(ValueError, match=r"sglang 0\.5\.99 is not in the table.*measure it"):
        check_against_model(_params(m, twin_check="off", **kw))
    calls = []

    def fake_measurement(engine, python, path, ids, dtype, device, work, seed, options=None):
        calls.append((engine, ids, options))
        row = RULES[("sglang", "0.5.23", "LlamaForCausalLM")]
        rule = replace(row, version="0.5.99", source="measured (fake)", measured={"fake": True})
        return {"rule": rule, "known_by": rule.known_by, "measured_now": True}

    monkeypatch.setattr(twin_measure, "measure_in_preflight", fake_measurement)
    info = check_against_model(_params(m, **kw))
    assert calls == [("sglang", [0, 1], {})]  # the run's sglang_options (their capture_route)
    assert info["engines"]["sglang"]["known_by"] == "measured"


@pytest.mark.parametrize(
    "arch,kw,msg",
    [
        (
            "DeepseekV3ForCausalLM",
            dict(extract_engine="sglang", layer_ids=[2, 3]),
            r"sglang 0\.5\.23 cannot capture DeepseekV3ForCausalLM on CPU: its CPU MLA path runs "
            r"silently wrong.*set extract_engine: hf, or run on a GPU",
        ),
        (
            "Llama4ForCausalLM",
            dict(extract_engine="sglang", layer_ids=[1, 2]),
            r"sglang 0\.5\.23 cannot capture Llama4ForCausalLM on CPU: float32 fails at o_proj",
        ),
        (
            "DeepseekV3ForCausalLM",
            dict(eval_engines=["vllm"], layer_ids=[1, 2]),
            r"vllm 0\.32\.0 cannot serve DeepseekV3ForCausalLM on CPU: .*No common block size",
        ),
        (
            "MiniMaxM2ForCausalLM",
            dict(vllm_extract=True, layer_ids=[1, 2]),
            r"vllm 0\.32\.0 cannot capture MiniMaxM2ForCausalLM on CPU: .*softmax",
        ),
    ],
)
def test_classes_an_engine_does_not_run_on_cpu_are_refused_there(tmp_path, arch, kw, msg):
    m = _folder(tmp_path, _cfg(arch, num_hidden_layers=7), arch)
    with pytest.raises(ValueError, match=msg):
        check_against_model(_params(m, convention="vllm", device="cpu", **kw))
    if arch == "DeepseekV3ForCausalLM" and "extract_engine" in kw:  # the rule alone is fine
        from eagle3nb.boundaries.rules import engine_rule

        assert engine_rule("sglang", "0.5.23", arch).boundaries_to_ids([2, 3], 7) == [2, 3]
