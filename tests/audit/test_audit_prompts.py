"""The audit on a benchmark set as well as held-out prompts (06's ``eval_dataset``): the prompts are
04's (every turn of every record, later turns holding the target's greedy answers), and the audit
over both sets reports tau per set equal to auditing each set alone."""

from __future__ import annotations

import json

import pytest

from eagle3nb.audit.core import heldout_prompt_ids, run_audit
from eagle3nb.drafter.acceptance import greedy_generate
from eagle3nb.params import RunParams
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.steps.audit.prompts import audit_prompts
from eagle3nb.target import models

BENCH = "builtin:tinystories_mtbench"
VERSIONS = {"sglang": "0.5.23", "vllm": "0.32.0"}
K, NEW = 4, 16


def test_audit_prompts_are_heldout_and_every_benchmark_turn(target):
    model, tok, _ = target
    p = RunParams(
        eval_dataset=BENCH, eval_max_records=3, max_eval_prompts=4, eval_max_new_tokens=NEW,
        interactive=False,
    )  # fmt: skip
    got = audit_prompts(p, target)
    assert list(got) == ["heldout", BENCH]
    assert got["heldout"] == heldout_prompt_ids(tok, n=4)
    rows = [json.loads(x) for x in (REPO_ROOT / "eagle3nb/data/bench_tinystories_mtbench.jsonl")
            .read_text().splitlines() if x.strip()]  # fmt: skip
    bench = got[BENCH]
    # 3 records, stratified by category; turn 0 of each, then their later turns
    firsts = {tuple(tok(r["turns"][0]).input_ids): r for r in rows}
    chosen = [firsts[tuple(q)] for q in bench[:3]]
    assert len(bench) == sum(len(r["turns"]) for r in chosen)
    eos = models.stop_token_ids(model, tok)
    for q, r in zip(bench[3:], [r for r in chosen if len(r["turns"]) > 1]):
        first = tok(r["turns"][0]).input_ids  # completion mode: the answer, then "\n" + turn 2
        ans = greedy_generate(model, first, NEW, eos)
        assert q == first + ans + tok("\n" + r["turns"][1], add_special_tokens=False).input_ids


def test_tau_per_set_equals_each_set_audited_alone(trained_export, target):
    model, tok, path = target
    p = RunParams(eval_dataset=BENCH, eval_max_records=4, max_eval_prompts=4,
                  eval_max_new_tokens=NEW, interactive=False)  # fmt: skip
    sets = audit_prompts(p, target)
    both = run_audit(trained_export, path, None, None, sets, K, NEW, versions=VERSIONS,
                     target=target)  # fmt: skip
    assert both["prompt_sets"] == {name: len(qs) for name, qs in sets.items()}
    alone = {
        name: {
            tuple(r["boundaries"]): r
            for r in run_audit(
                trained_export, path, None, None, qs, K, NEW, versions=VERSIONS, target=target
            )["candidates"]  # fmt: skip
        }
        for name, qs in sets.items()
    }
    for row in both["candidates"]:
        for name, x in row["by_set"].items():
            one = alone[name][tuple(row["boundaries"])]
            assert (x["cycles"], x["accepted_per_pos"]) == (one["cycles"], one["accepted_per_pos"])
            assert x["tau"] == pytest.approx(one["tau"], rel=1e-12)
        assert row["cycles"] == sum(x["cycles"] for x in row["by_set"].values())
