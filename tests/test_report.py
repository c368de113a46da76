"""eagle3nb.report: runs listed with their key metrics, two runs compared."""

import json

import pytest

from eagle3nb.report import compare_runs, list_runs


def write_run(root, name, tau, steps):
    d = root / name
    (d / "figures").mkdir(parents=True)
    (d / "figures" / "acceptance.html").write_text("<html></html>")
    (d / "metrics.json").write_text(
        json.dumps(
            {
                "eval": {
                    "tau": {"trained": tau, "untrained": 1.0, "trained, layer offset": tau - 1},
                    "k": 5,
                    "greedy_mismatches": 0,
                },
                "train": {"steps": steps},
            }
        )
    )


def test_list_and_compare(tmp_path):
    write_run(tmp_path, "a", 3.5, 100)
    write_run(tmp_path, "b", 3.25, 50)
    (tmp_path / "not-a-run").mkdir()
    rows = list_runs(tmp_path)
    assert [r["run"] for r in rows] == ["a", "b"]
    assert (
        rows[0]["tau trained"] == 3.5
        and rows[0]["tau layer offset"] == 2.5
        and rows[0]["figures"][0].endswith("acceptance.html")
    )
    cmp = {r["metric"]: r for r in compare_runs("a", "b", tmp_path)}
    assert (
        cmp["tau trained"]["b - a"] == -0.25
        and cmp["train steps"]["b - a"] == -50
        and cmp["engine"]["b - a"] is None
    )
    with pytest.raises(FileNotFoundError, match="run 'c' has no metrics.json"):
        compare_runs("a", "c", tmp_path)
