"""Preflight on every accepted target class (config.json of a tiny model, no weights): the run's
checks pass and read the layer count and vocab from the text model (wrappers keep them under
``text_config``); refused classes are named with the reason and the fix; a Kimi-K2 folder
(``model_type: kimi_k2``, which transformers does not register) loads as DeepSeek-V3 and captures
the same boundaries as the DeepSeek-V3 model it was saved from."""

import json
import shutil
import sys
from pathlib import Path

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
    vllm_eval=False,
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
    ids = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(3))
    a, b = capture_boundaries(model, ids, range(N + 1)), capture_boundaries(src, ids, range(N + 1))
    for k in range(N + 1):
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
