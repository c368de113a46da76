"""A run on an engine version outside the table completes: vLLM 0.32.0's version file hidden
(``$EAGLE3NB_HIDE_RULES=vllm 0.32.0``, as if a release no file holds were installed), the smoke
parameters with vLLM capturing (02a), training on vLLM's dataset (03) and vLLM serving (04):
preflight measures the rule on the installed engine, 02a's twin gate reads it back (same torch
and model file), the dataset manifest, the drafter's config and 04's check line name it as
measured, and it equals the hidden row (vllm/model_executor/models/llama.py:427-441: same, 0..N).
The steps run in this process (no papermill); short: 24 prompts, 30 optimizer steps. Per class
the twins build, on both CI engines (02 measuring, 03, the engine serving the export):
tests/engines/test_measured_run_classes.py."""

from __future__ import annotations

import json

import pytest

from testkit import requires_engine
from eagle3nb.boundaries.rules import RULES, _MEASURED
from eagle3nb.params import RunParams

pytestmark = [requires_engine("vllm")]


@pytest.fixture()
def hidden(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3NB_HIDE_RULES", "vllm 0.32.0")
    monkeypatch.setenv("EAGLE3NB_MEASURED_RULES", str(tmp_path / "kept"))
    monkeypatch.setenv("EAGLE3NB_TWIN_PROOFS", "off")
    _MEASURED.clear()
    yield tmp_path / "kept"
    _MEASURED.clear()


def test_a_run_on_a_version_outside_the_table_completes(hidden, tmp_path, capsys):
    from eagle3nb.preflight import check_against_model
    from eagle3nb.steps.evaluate.step import eval_step
    from eagle3nb.steps.extract.from_vllm import extract_vllm_step
    from eagle3nb.steps.generate.step import generate_step
    from eagle3nb.steps.train.step import train_step

    p = RunParams(
        run_name="measured",
        outputs_dir=str(tmp_path),
        model="stories260K-hd32",
        max_train_prompts=24,
        max_new_tokens=32,
        batch_size=8,
        max_steps=30,
        warmup_steps=5,
        k=3,
        eval_max_new_tokens=16,
        max_eval_prompts=4,
        vllm_extract=True,
        train_on="vllm",
        eval_engines=["vllm"],
    )
    pre = check_against_model(p)
    assert "rule measured" in capsys.readouterr().out
    kept = json.loads(next(hidden.glob("vllm-0.32.0-LlamaForCausalLM.json")).read_text())
    row = RULES[("vllm", "0.32.0", "LlamaForCausalLM")]
    assert (kept["kind"], kept["lo"], kept["hi_below_n"]) == (row.kind, row.lo, row.hi_below_n)
    assert kept["measured"]["model_file"] == "vllm/model_executor/models/llama.py"
    assert pre is not None
    generate_step(p, progress=False)
    extract_vllm_step(p, progress=False)
    root = tmp_path / "measured"
    man = json.loads((root / "dataset_vllm" / "manifest.json").read_text())
    rule = man["twin_check"]["engine_rule"]
    assert rule["known_by"] == "measured" and rule["source"].startswith("measured on a")
    assert man["twin_check"]["rule_measured_now"] is False  # preflight's measurement, read back
    assert man["twin_check"]["agrees"]
    train_step(p, progress=False)
    cfg = json.loads((root / "drafter" / "config.json").read_text())
    rec = cfg["eagle3nb"]["engine_ids"]["vllm"]
    assert rec["known_by"] == "measured" and rec["rule_record"]["measured"]["torch"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == cfg["eagle3nb"]["aux_boundaries"]
    eval_step(p, progress=False)
    m = json.loads((root / "metrics.json").read_text())
    lines = m["checks"]["04_eval_acceptance"]
    assert any("served the exported drafter" in s and "measured rule" in s for s in lines), lines
