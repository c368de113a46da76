"""Measured layer-id rules (eagle3nb.boundaries.measured, rules.engine_rule's fallback): derived from
hand-written id -> boundary matrices of 6-layer twins (what the engines' model files do, read in
their sources: sglang/srt/models/llama.py:929-941 adds 1 and refuses ids >= N, deepseek_v2.py
3458-3473 adds 1 only after a first id 1; vLLM interfaces.py:1601-1611 id = boundary); unnameable
slots and rules that are not one offset per id set refused with the matrix; kept per user and read
back; a measured rule that disagrees with a version file's row stops; the export records it. The
real engines' measurements: tests/engines/test_measured_rules.py."""

import json

import pytest

from eagle3nb.boundaries import measured_store
from eagle3nb.boundaries.engine_read import read_as_engine
from eagle3nb.boundaries.export_ids import engine_ids
from eagle3nb.boundaries.measured import derive_rule, probe_plan
from eagle3nb.boundaries.rules import RULES, EngineRule, _MEASURED, engine_rule, register_measured

REC = {"device": "cpu", "dtype": "float32", "torch": "2.x", "model_file_sha256": "0" * 64}
N = 6
REFUSED = "ValueError: layer ids must be < num_hidden_layers"


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3NB_MEASURED_RULES", str(tmp_path / "kept"))
    monkeypatch.delenv("EAGLE3NB_HIDE_RULES", raising=False)
    _MEASURED.clear()
    yield
    _MEASURED.clear()


def test_the_plan_holds_0_1_a_middle_id_and_n():
    plan = probe_plan(N, [0, 1, 3])
    assert plan == [[0, 3, 4], [1, 3, 4], [0, 3, 6], [5, 6], [0, 1, 3]]
    assert {0, 1, 3, 5, 6} <= {i for ids in plan for i in ids}
    assert probe_plan(N, [0, 3, 4]) == plan[:4]  # the run's ids already there: no fifth build
    with pytest.raises(ValueError, match="n=3"):
        probe_plan(3)


def test_vllm_llama_by_hand_is_same_0_to_n():
    probes = [
        {"ids": [0, 3, 4], "boundaries": [0, 3, 4]},
        {"ids": [1, 3, 4], "boundaries": [1, 3, 4]},
        {"ids": [0, 3, 6], "boundaries": [0, 3, 6]},
        {"ids": [5, 6], "boundaries": [5, 6]},
    ]
    r = derive_rule("vllm", "0.99.0", "LlamaForCausalLM", N, probes, REC)
    assert (r.kind, r.lo, r.hi_below_n, r.refused) == ("same", 0, 0, None)
    assert r.source == "measured on a 6-layer twin (cpu, float32)" and r.known_by == "measured"
    assert (
        r.measured["probes"][2]["boundaries"] == [0, 3, 6] and "ids [5, 6]" in r.measured["matrix"]
    )


def test_sglang_llama_by_hand_is_plus1_1_to_n_minus_1():
    probes = [
        {"ids": [0, 3, 4], "boundaries": [1, 4, 5]},
        {"ids": [1, 3, 4], "boundaries": [2, 4, 5]},
        {"ids": [0, 3, 6], "error": REFUSED},
        {"ids": [5, 6], "error": REFUSED},
    ]
    r = derive_rule("sglang", "0.9.0", "LlamaForCausalLM", N, probes, REC)
    assert (r.kind, r.lo, r.hi_below_n) == ("plus1", 1, 1)
    assert r.boundaries_to_ids([1, 3, 5], 32) == [0, 2, 4]  # on the real target's N as well
    assert "refused: ValueError: layer ids must be" in r.measured["matrix"]


def test_sglang_deepseek_by_hand_is_first_id_1():
    probes = [
        {"ids": [0, 3, 4], "boundaries": [0, 3, 4]},  # first id 0: unshifted
        {"ids": [1, 3, 4], "boundaries": [2, 4, 5]},  # first id 1: +1
        {"ids": [0, 3, 6], "error": REFUSED},
        {"ids": [5, 6], "error": REFUSED},
    ]
    r = derive_rule("sglang", "0.9.0", "DeepseekV3ForCausalLM", N, probes, REC)
    assert (r.kind, r.lo, r.hi_below_n) == ("first_id_1", 0, 1)


def test_every_table_row_is_derived_back_from_its_own_behaviour():
    """A round trip: each row's ids_to_boundaries (and refusals) as the engine's answers, on twins
    of 4, 5, 6 and 12 layers; the derived rule is the row."""
    for key, row in RULES.items():
        for n in (4, 5, 6, 12):
            probes = []
            for ids in probe_plan(n, [0, 1, 2]):
                try:
                    probes.append({"ids": ids, "boundaries": row.ids_to_boundaries(ids, n)})
                except ValueError as e:
                    probes.append({"ids": ids, "error": str(e)})
            got = derive_rule(*key, n, probes, REC)
            assert got.same_rule(row), (key, n, got.summary(), row.summary())


def test_an_unnameable_slot_is_refused_with_the_matrix():
    probes = [{"ids": [0, 3, 4], "boundaries": [0, None, 4]}, {"ids": [5, 6], "error": REFUSED}]
    with pytest.raises(
        ValueError, match=r"cannot all be named[\s\S]*ids \[0, 3, 4\] -> boundaries \[0, \?, 4\]"
    ):
        derive_rule("vllm", "0.99.0", "LlamaForCausalLM", N, probes, REC)


def test_not_one_offset_per_id_set_is_refused():
    probes = [{"ids": [0, 3, 4], "boundaries": [0, 4, 4]}]  # the middle id shifted alone
    with pytest.raises(ValueError, match=r"not one offset[\s\S]*boundaries \[0, 4, 4\]"):
        derive_rule("vllm", "0.99.0", "LlamaForCausalLM", N, probes, REC)
    probes = [  # each set one offset, but no kind explains both: +1 with first id 0, 0 with 1
        {"ids": [0, 3, 4], "boundaries": [1, 4, 5]},
        {"ids": [1, 3, 4], "boundaries": [1, 3, 4]},
    ]
    with pytest.raises(ValueError, match="no one rule"):
        derive_rule("vllm", "0.99.0", "LlamaForCausalLM", N, probes, REC)


def test_a_refusal_the_rule_would_accept_is_refused():
    probes = [
        {"ids": [0, 3, 6], "boundaries": [0, 3, 6]},
        {"ids": [1, 3, 4], "error": "RuntimeError: engine died"},  # inside the measured range
    ]
    with pytest.raises(ValueError, match="would accept"):
        derive_rule("vllm", "0.99.0", "LlamaForCausalLM", N, probes, REC)


def test_all_sets_refused_is_a_refused_rule():
    probes = [
        {"ids": ids, "error": "ValueError: Model does not support EAGLE3"} for ids in probe_plan(N)
    ]
    r = derive_rule("vllm", "0.99.0", "Gemma3ForCausalLM", N, probes, REC)
    assert r.kind == "refused" and "every id set was refused" in r.refused
    with pytest.raises(ValueError, match="is refused"):
        r.ids_to_boundaries([1, 2], N)


def _sglang_llama(version="0.9.0", lo=1):
    probes = [
        {"ids": [0, 3, 4], "boundaries": [lo, 3 + lo, 4 + lo]},
        {"ids": [1, 3, 4], "boundaries": [1 + lo, 3 + lo, 4 + lo]},
        {"ids": [0, 3, 6], "error": REFUSED},
        {"ids": [5, 6], "error": REFUSED},
    ]
    return derive_rule("sglang", version, "LlamaForCausalLM", N, probes, REC)


def test_lookup_falls_back_to_a_kept_measurement(tmp_path):
    with pytest.raises(ValueError, match="not measured here"):
        engine_rule("sglang", "0.9.0", "LlamaForCausalLM")
    path = register_measured(_sglang_llama())
    assert path.parent == tmp_path / "kept" and json.loads(path.read_text())["kind"] == "plus1"
    _MEASURED.clear()  # another process: read back from the per-user store
    r = engine_rule("sglang", "0.9.0+cpu", "LlamaForCausalLM")
    assert r.known_by == "measured" and r.measured["model_file_sha256"] == "0" * 64
    assert measured_store.load_record("sglang", "0.9.0", "Qwen3ForCausalLM") is None


def test_hidden_row_then_measured_equal_row_is_used(monkeypatch):
    monkeypatch.setenv("EAGLE3NB_HIDE_RULES", "sglang 0.5.23")
    with pytest.raises(ValueError, match="not in the table"):
        engine_rule("sglang", "0.5.23", "LlamaForCausalLM")
    register_measured(_sglang_llama("0.5.23"))
    assert engine_rule("sglang", "0.5.23", "LlamaForCausalLM").known_by == "measured"
    monkeypatch.delenv("EAGLE3NB_HIDE_RULES")
    assert engine_rule("sglang", "0.5.23", "LlamaForCausalLM").known_by == "read from source"


def test_a_measured_rule_that_disagrees_with_the_row_stops():
    wrong = _sglang_llama("0.5.23", lo=0)  # "same": what vLLM does, not what llama.py:929 says
    with pytest.raises(
        ValueError, match=r"disagrees with its version file's row \(plus1, boundaries 1..N-1"
    ):
        register_measured(wrong)
    measured_store.store_record(wrong.as_record())  # kept by an older eagle3nb, say
    with pytest.raises(ValueError, match="sglang_0_5_23.py"):
        engine_rule("sglang", "0.5.23", "LlamaForCausalLM")


def test_export_writes_and_records_the_measured_rule():
    rule = _sglang_llama()
    register_measured(rule, keep=False)
    ids, rec = engine_ids("sglang", [1, 3, 5], N, "LlamaForCausalLM", "0.9.0")
    assert ids == [0, 2, 4] and rec["known_by"] == "measured"
    assert EngineRule.from_record(rec["rule_record"]).same_rule(rule)
    _MEASURED.clear()  # a reader without the store: the config carries the rule
    cfg = {
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids},
        "eagle3nb": {
            "target_architecture": "LlamaForCausalLM",
            "engine_ids": {"sglang": {"ids": ids, **rec}},
        },
    }
    assert read_as_engine(cfg, "sglang", N)["boundaries"] == [1, 3, 5]


def test_a_rule_recorded_in_a_dataset_manifest_is_used_without_the_store(monkeypatch):
    from eagle3nb.boundaries.rules import register_recorded

    monkeypatch.setenv("EAGLE3NB_MEASURED_RULES", "off")
    man = {"twin_check": {"engine_rule": _sglang_llama().as_record()}}
    assert [r.kind for r in register_recorded(man)] == ["plus1"]
    assert engine_rule("sglang", "0.9.0", "LlamaForCausalLM").known_by == "measured"
    assert register_recorded({"twin_check": None}) == []


def test_support_matrix_names_how_each_rule_is_known():
    from eagle3nb.rules import support_matrix

    register_measured(_sglang_llama(), keep=False)
    engines = [("sglang", "0.9.0", "py"), ("vllm", "0.32.0", "py")]
    rows = {(r["arch"], r["engine"]): r for r in support_matrix(engines, 32, [2, 16, 29])}
    sg, vl = rows[("LlamaForCausalLM", "sglang")], rows[("LlamaForCausalLM", "vllm")]
    assert (sg["known_by"], sg["rule"], sg["ids"], sg["reads"]) == (
        "measured",
        "plus1",
        [1, 15, 28],
        [2, 16, 29],
    )
    assert (vl["known_by"], vl["ids"], vl["reads"]) == (
        "read from source",
        [2, 16, 29],
        [2, 16, 29],
    )
    assert rows[("Qwen3ForCausalLM", "sglang")]["known_by"] == "not measured"
    assert rows[("Gemma3ForCausalLM", "vllm")]["rule"] == "refused"
