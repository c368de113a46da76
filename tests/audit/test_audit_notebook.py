"""06_audit run headless by eagle3nb.run on a drafter published with wrong ids: the notebook's own
checks pass on held-out prompts and eval_dataset's turns, its corrected copy and figure are
written; without audit_drafter the run skips it."""

from __future__ import annotations

import json

from conftest import TRAINED, write_format

from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.run import run_notebooks


def test_06_audits_a_drafter_with_wrong_ids(trained_export, tmp_path):
    wrong = write_format(trained_export, tmp_path / "peer", "vllm", [0, 1, 3])
    over = {
        "outputs_dir": str(tmp_path / "outputs"),
        "run_name": "audit",
        "audit_drafter": str(wrong),
        "max_eval_prompts": 10,
        "eval_max_new_tokens": 48,
        "k": 4,
        "eval_dataset": "builtin:tinystories_mtbench",  # measured beside the held-out prompts
        "eval_max_records": 2,
        "vllm_extract": False,  # preflight then needs no engine venv (06 starts no engine)
        "extract_engine": "hf",
        "eval_engines": ["simulator"],
    }
    root = run_notebooks(REPO_ROOT / "params" / "smoke.yaml", only=["06_audit"], overrides=over)
    audit = json.loads((root / "audit" / "audit.json").read_text())
    assert audit["verdict"]["recommended"] == TRAINED and audit["declared"] == [0, 1, 3]
    assert list(audit["prompt_sets"]) == ["heldout", "builtin:tinystories_mtbench"]
    assert audit["prompt_sets"]["heldout"] == 10 and audit["prompt_sets"][over["eval_dataset"]] >= 2
    assert (root / "figures" / "audit.html").is_file()
    cfg = json.loads((root / "audit" / "drafter" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == TRAINED  # vLLM ids = boundaries
    assert (root / "notebooks" / "06_audit.ipynb").is_file()
