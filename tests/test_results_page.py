"""eagle3nb.results_page: a run's numbers taken into the reference, rendered, and the CLI's check."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from eagle3nb import results_page
from eagle3nb.repo_paths import REPO_ROOT


def _fake_run(tmp_path):
    """A run folder shaped like the main job's (numbers made up here, written by hand)."""
    run = tmp_path / "myrun"
    (run / "drafter").mkdir(parents=True)
    tau = {"trained": 3.25, "untrained": 1.01, "trained, layer offset": 2.5}
    metrics = {
        "timing": {"notebook_seconds": {"01_generate": 10.0}, "total_seconds": 10.0},
        "threads": {"available": 2, "budget": 2},
        "generate": {
            "engine": "hf-transformers",
            "engine_version": "5.25.0",
            "n_train_prompts": 3,
            "n_heldout_prompts": 2,
            "generated_tokens": 30,
            "tokens_per_s": 12.5,
        },
        "train": {
            "steps": 7,
            "seconds": 1.5,
            "loss_token_steps_per_s": 100.0,
            "n_train_samples": 3,
            "global_batch": 2,
        },
        "eval": {
            "k": 2,
            "n_prompts": 2,
            "max_new_tokens": 8,
            "tau": tau,
            "per_position_acceptance": {k: [0.5, 0.25] for k in tau},
            "draft_acceptance_rate": {k: 0.375 for k in tau},
            "cycles": {k: 4 for k in tau},
            "greedy_mismatches": 0,
            "k_sweep": {"k": [1, 2], "tau": [1.5, 3.25], "draft_acceptance_rate": [0.5, 0.375]},
            "served": {"table": "| category | x |\n|---|---|\n| heldout | 3.25 |"},
        },
        "extract": {"not": "kept"},
    }
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "params.yaml").write_text(yaml.safe_dump({"batch_size": 2, "run_name": "myrun"}))
    (run / "drafter" / "manifest.json").write_text(json.dumps({"git_commit": "abc123"}))
    return run


def test_reference_keeps_what_the_page_shows(tmp_path):
    ref = results_page.reference_from_run(_fake_run(tmp_path))
    assert ref["run"] == "myrun" and ref["git_commit"] == "abc123"
    assert ref["params"] == {"batch_size": 2}  # run_name is not a recipe key
    assert ref["eval"]["tau"]["trained"] == 3.25 and "extract" not in ref
    page = results_page.render(ref, {})
    assert "| `trained` | 3.25 | 0.5 0.25 | 0.375 | 4 |" in page
    assert "| heldout | 3.25 |" in page
    assert ref["measured"] in page


def test_reference_refuses_a_folder_without_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m eagle3nb.run"):
        results_page.reference_from_run(tmp_path)


def test_an_unknown_bench_file_is_listed_not_dropped(tmp_path):
    ref = results_page.reference_from_run(_fake_run(tmp_path))
    page = results_page.render(ref, {"reference_new_thing.json": {"what": "a new bench"}})
    assert "### `bench/reference_new_thing.json` (undated)" in page and "a new bench" in page


def test_cli_check_fails_on_a_stale_page(tmp_path):
    stale = tmp_path / "results.md"
    stale.write_text("# Results\n\nold numbers\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    cmd = [sys.executable, "-m", "eagle3nb.report", "results", "--check", "--out", str(stale)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "differs" in proc.stderr
    cmd = [sys.executable, "-m", "eagle3nb.report", "results", "--check"]
    assert subprocess.run(cmd, cwd=REPO_ROOT, env=env).returncode == 0
