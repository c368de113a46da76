"""Measured layer-id rules on real SGLang 0.5.23 (its venv): its version-file row is hidden
(``$EAGLE3NB_HIDE_RULES``), the rule is measured on the running engine over the twin of every class
the twins build (tests/engines/test_twin_engines.py's list), and must equal the hidden row read from
source (kind, lowest boundary, distance of the highest from N). SGLang's refusals of id sets (ids
>= N) are part of what is measured. One engine worker, reused across the classes.

vLLM 0.32.0's classes are measured with the row hidden inside a whole run per class
(tests/engines/test_measured_run_classes.py: 02a's twin gate measures on the running worker, and
the same assertions as here are made on the dataset manifest's record), so they are not measured
a second time here; this module keeps what only it shows for SGLang:

- measured through its in-process ModelRunner (``capture_route: runner``,
  :data:`eagle3nb.engines.twin_measure.RUNNER_TWIN_OPTIONS`): one model load per class, each probe
  set applied by the model's own ``set_eagle3_layers_to_capture`` between forwards
  (:mod:`eagle3nb.engines.sglang_capture_ids`); a set SGLang refuses comes back refused with
  SGLang's own message, raised in the worker (the worker answers the next set), checked on the
  probe sets [0, 3, 6] and [5, 6] of run ids [0, 3, 4].
- Once, on Qwen3-MoE (whose setter leaves earlier sets' layers flagged,
  ``qwen2_moe.py:1153-1156``): a set captured after re-sets equals, bit for bit (float32, CPU), the
  same set captured after the refused sets and on a fresh load of the twin.

Seconds per class are printed (``-s``). Measured 2026-12-06 on the 2-core box under the heavy lock
(``pytest -s --durations=0 tests/engines/test_measured_rules.py``): SGLang 55 s wall for its 6
classes (1.6-3 s each, Glm4-MoE 15 s, Llama 26 s with the worker's start); vLLM's 7 classes took
166 s here before they moved into the runs (18-24 s each, Llama 48 s with the worker's start)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from testkit import requires_engine
from eagle3nb.boundaries.measured_store import MEASURED
from eagle3nb.boundaries.rules import RULES, engine_rule
from eagle3nb.engines.twin_measure import measure_capture, measure_facts, measure_rule

sys.path.insert(0, str(Path(__file__).parent))
from test_twin_engines import CLASSES, VERSION, _full_folder, _OneEngine  # noqa: E402

RUN_IDS = [0, 3, 4]  # one of probe_plan(6)'s sets: no fifth build
ROUTE = {"vllm": "engine", "sglang": "runner"}
PROOF = ("sglang", "Qwen3MoeForCausalLM")  # the class whose setter is not a fresh load

# SGLang only: vLLM's classes are measured in tests/engines/test_measured_run_classes.py's runs
CASES = [
    pytest.param(e, a, marks=requires_engine(e), id=f"{e}-{a}")
    for e in ["sglang"]
    for a in CLASSES[e]
]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    e = _OneEngine(tmp_path_factory.mktemp("engines"))
    yield e
    e.close()


@pytest.mark.parametrize("engine,arch", CASES)
def test_measured_rule_equals_the_hidden_row(engines, engine, arch, tmp_path, monkeypatch):
    version, route = VERSION[engine], ROUTE[engine]
    row = RULES[(engine, version, arch)]
    monkeypatch.setenv("EAGLE3NB_HIDE_RULES", f"{engine} {version}")
    monkeypatch.setenv("EAGLE3NB_MEASURED_RULES", str(tmp_path / "kept"))
    with pytest.raises(ValueError, match="not measured here"):
        engine_rule(engine, version, arch)  # hidden: the lookup has nothing
    client = engines.get(engine)
    seen = []  # (ids, samples, capture) of every set the engine captured
    base = measure_capture(client, engine, route)

    def capture(path, samples, ids):
        got = base(path, samples, ids)
        seen.append((list(ids), samples, got))
        return got

    full = _full_folder(tmp_path, arch)
    facts = measure_facts(client.info(), client.python, arch, route)
    t0 = time.perf_counter()
    rule = measure_rule(
        capture, engine, version, full, RUN_IDS, "float32", tmp_path / "twin", facts=facts
    )
    secs = time.perf_counter() - t0
    print(
        f"\n{engine} {arch} ({route}): measured {rule.summary()} in {secs:.0f} s\n"
        f"{rule.measured['matrix']}"
    )
    assert len(rule.measured["probes"]) == 4
    assert rule.source.startswith(MEASURED) and rule.known_by == MEASURED
    assert (rule.kind, rule.lo, rule.hi_below_n) == (row.kind, row.lo, row.hi_below_n), (
        rule.measured["matrix"]
    )
    rec = rule.measured
    assert (rec["engine"], rec["version"], rec["arch"]) == (engine, version, arch)
    assert rec["capture_route"] == route
    assert rec["model_file_sha256"] and len(rec["model_file_sha256"]) == 64
    assert rec["model_file"].startswith(engine)  # vllm/... or sglang/srt/models/...
    # the lookup now falls back to the kept measurement (the row still hidden)
    again = engine_rule(engine, version, arch)
    assert again.known_by == MEASURED and again.same_rule(row)
    if engine == "sglang":  # ids >= N: SGLang's own refusal, raised in the worker, which answers
        refused = [p for p in rec["probes"] if p.get("error")]
        assert [p["ids"] for p in refused] == [[0, 3, 6], [5, 6]]
        for p in refused:
            assert "out of range for a target with 6 layers" in p["error"], p["error"]
        assert client.info(live=True)["engine_version"] == version
    if (engine, arch) == PROOF:
        _resets_equal_a_fresh_load(capture, tmp_path, seen)


def _resets_equal_a_fresh_load(capture, tmp_path, seen):
    """On one load the sets ran [0,3,4] -> [1,3,4] -> refused -> refused; [1,3,4] (after a re-set)
    and [0,3,4] again (after two refused sets) must equal the same sets on a fresh load of the
    twin (a copy of its folder: another model path, so the worker loads it anew)."""
    twin = tmp_path / "twin"
    got = {tuple(ids): (s, out) for ids, s, out in seen}
    samples, after_reset = got[(1, 3, 4)]
    again = capture(str(twin), samples, [0, 3, 4])  # same load, after the refusals
    fresh_dir = tmp_path / "fresh-twin"
    shutil.copytree(twin, fresh_dir)
    fresh_b = capture(str(fresh_dir), samples, [1, 3, 4])
    fresh_a = capture(str(fresh_dir), samples, [0, 3, 4])
    for x, y in zip(after_reset, fresh_b):
        assert x["aux"].dtype == torch.float32 and torch.equal(x["aux"], y["aux"])
    for x, y, z in zip(got[(0, 3, 4)][1], again, fresh_a):
        assert torch.equal(x["aux"], y["aux"]) and torch.equal(x["aux"], z["aux"])
