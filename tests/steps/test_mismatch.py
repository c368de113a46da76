"""params/mismatch.yaml: old-speculators data served with the engines' default ids.

03 must refuse before training; forced, the exported ids must make SGLang and vLLM capture the
default boundaries (read back as each engine reads its config), and 04 must evaluate the drafter
both at its trained boundaries and as served, with a per-position drop.
"""

import json

import pytest
from testkit import requires_engine

from eagle3nb.steps.evaluate.step import eval_step
from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.steps.train.step import train_step
from eagle3nb.boundaries.engine_read import read_as_engine
from eagle3nb.rundir import RunDir
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.params import load_params

# 02b extracts through SGLang, 04 serves through vLLM
pytestmark = [requires_engine("vllm"), requires_engine("sglang")]

# the real params file, shrunk so the test takes about a minute (same convention, ids and export)
SMALL = {
    "max_train_prompts": 96,
    "max_new_tokens": 48,
    "max_steps": 250,
    "warmup_steps": 20,
    "batch_size": 16,
    "max_eval_prompts": 16,
    "eval_max_new_tokens": 48,
    "interactive": False,
    "eval_engines": ["simulator", "vllm"],  # SGLang's serving: test_pipeline, test_sglang_serve
}


@pytest.fixture(scope="module")
def data_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mismatch")
    p = load_params(
        REPO_ROOT / "params" / "mismatch.yaml",
        outputs_dir=str(out),
        allow_manifest_mismatch=False,
        **SMALL,
    )
    generate_step(p, progress=False)
    extract_sglang_step(p, progress=False)
    return p


def test_refused_before_training(data_run):
    rd = RunDir(data_run)
    assert json.loads((rd.dataset / "manifest.json").read_text())["aux_boundaries"] == [2, 3, 5]
    with pytest.raises(
        ValueError,
        match=r"export_layer_ids='engine_default'.*boundaries \[1, 2, 4\].*\[2, 3, 5\].*allow_manifest_mismatch",
    ):
        train_step(data_run, progress=False)
    assert not rd.drafter.exists() and not any(rd.train.glob("*")) if rd.train.exists() else True


def test_forced_run_shows_the_drop(data_run):
    p = data_run.model_copy(update={"allow_manifest_mismatch": True})
    train_step(p, progress=False)
    rd = RunDir(p)
    cfg = json.loads((rd.drafter / "config.json").read_text())
    # the ids users copy: SGLang nested [0, 1, 3], vLLM top level [1, 2, 4] -- the same numbers the
    # old speculators convention used for boundaries [2, 3, 5]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    assert cfg["eagle3nb"]["aux_boundaries"] == [2, 3, 5]
    for e in ("sglang", "vllm"):
        assert read_as_engine(cfg, e, 5)["boundaries"] == [1, 2, 4]
    m = json.loads(rd.metrics.read_text())
    assert m["export"]["serve_mismatch"] is True and not m["export"]["engines"]["vllm"]["ok"]
    out = eval_step(p, progress=False)
    served = "trained, as served (ids -> [1, 2, 4])"
    a_match = out["stats"]["per_position_acceptance"]["trained"]
    a_served = out["stats"]["per_position_acceptance"][served]
    assert out["stats"]["served_boundaries"] == {"sglang": [1, 2, 4], "vllm": [1, 2, 4]}
    # matched beats mismatched at every draft position and in tau (measured: see the closing note)
    assert all(x > y for x, y in zip(a_match, a_served)), (a_match, a_served)
    assert out["stats"]["tau"]["trained"] > out["stats"]["tau"][served] + 0.15
