"""``python -m eagle3nb.run``: ``--set key=value`` (issue 32 item 9) read as 03's entry point reads
it and validated by the same schema with the same messages, before any notebook runs."""

import subprocess
import sys

import pytest

from eagle3nb.rundir import REPO_ROOT

pytest.importorskip("papermill")


def _cli(module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", module, "params/smoke.yaml", *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "sets, message",
    [
        (
            ["--set", "max_stepz=3"],
            "invalid parameters in params/smoke.yaml:\n  max_stepz=3: unknown key; did you mean "
            "'max_steps'? (all keys with their help: the parameters cells of notebooks/*.ipynb, or "
            "eagle3nb/params/schema.py RunParams)",
        ),
        (
            ["--set", "max_steps=-1"],
            "invalid parameters in params/smoke.yaml:\n  max_steps=-1: Input should be greater "
            "than or equal to 1; e.g. max_steps: 100 (the default)",
        ),
        (["--set", "max_steps"], "--set 'max_steps': write key=value, e.g. --set max_steps=200"),
    ],
    ids=["unknown_key", "out_of_range", "no_equals"],
)
def test_set_refused_with_the_train_entry_points_message(tmp_path, sets, message):
    out = ["--set", f"outputs_dir={tmp_path}", "--set", "run_name=cli-set"]
    run = _cli("eagle3nb.run", *out, *sets)
    train = _cli("eagle3nb.steps.train", *out, *sets)
    assert (run.returncode, train.returncode) == (2, 2), (run.stderr, train.stderr)
    assert run.stderr == f"eagle3nb: {message}\n"
    assert train.stderr == f"eagle3nb.steps.train: {message}\n"  # one parser, one schema
    assert not any(tmp_path.iterdir())


def test_set_values_reach_the_preflight(tmp_path):
    # YAML values: a list and a path, each refused by the preflight naming the value given
    r = _cli("eagle3nb.run", "--set", f"outputs_dir={tmp_path}", "--set", "layer_ids=[0,1,4]")
    assert r.returncode == 2 and "layer_ids=[0, 1, 4] (convention 'sglang') do not fit" in r.stderr
    three = "tests/bad_inputs/prompts/three.txt"
    r = _cli("eagle3nb.run", "--set", f"prompts_file={three}", "--set", "heldout_fraction=0.1")
    assert r.returncode == 2
    assert r.stderr.startswith(
        f"eagle3nb: heldout_fraction=0.1 holds out 0 of the 3 prompts of prompts_file='{three}'"
    )
    assert not any(tmp_path.iterdir())
