"""05's reading of the matrix (eagle3nb.steps.drift.report) on hand-made cells: seed means and
half-ranges, the diagonal check, and the recommendation, each computed here by hand."""

import pytest

from eagle3nb.steps.drift.report import matrix_block, recommend

A, B = "hf:float32:none", "vllm:float32:w4a16"


def _s(tau, a1):
    return {"tau": tau, "per_position_acceptance": [a1, a1 / 2]}


def _cells(bb=(1.9, 2.1)):
    return {
        (A, A): [_s(2.0, 0.6), _s(2.2, 0.7)],
        (A, B): [_s(1.6, 0.4), _s(1.6, 0.5)],
        (B, A): [_s(1.8, 0.5), _s(2.0, 0.6)],
        (B, B): [_s(bb[0], 0.55), _s(bb[1], 0.6)],
        ("layer offset", A): [_s(1.3, 0.2), _s(1.3, 0.2)],
        ("layer offset", B): [_s(1.2, 0.1), _s(1.4, 0.1)],
    }


def test_means_spreads_and_rows():
    m = matrix_block(_cells(), [A, B], "layer offset")
    assert m["rows"] == [A, B, "layer offset"] and m["cols"] == [A, B]
    assert m["tau"] == [[2.1, 1.6], [1.9, 2.0], [1.3, 1.3]]
    assert m["tau_spread"] == [[0.1, 0.0], [0.1, 0.1], [0.0, 0.1]]
    assert m["a1"][0] == [0.65, 0.45] and m["a1_spread"][0] == [0.05, 0.05]
    assert m["tau_seeds"][1][1] == [1.9, 2.1]
    assert m["diagonal"]["holds"] == {A: True, B: True}


def test_recommendation_by_hand():
    m = matrix_block(_cells(), [A, B], "layer offset")
    r = recommend(m, A, "layer offset")["per_source"][B]
    # reference drafter: 2.1 on A, 1.6 on B -> drift drop 0.5; own drafter on B: 2.0 -> gain 0.4;
    # offset row on B: 1.3 -> offset drop 1.6 - 1.3 = 0.3; noise max(0.0, 0.1)
    assert r == pytest.approx(
        {"drift_drop": 0.5, "train_on_serving_gain": 0.4, "noise": 0.1, "offset_drop": 0.3}
    )
    line = recommend(m, A, "layer offset")["lines"][0]
    assert line.startswith(f"serving on {B}: train on its own states: +0.400 tau")


def test_diagonal_below_its_column_is_named():
    m = matrix_block(_cells(bb=(1.3, 1.3)), [A, B], "layer offset")  # own drafter 1.3 < 1.6 +- 0
    assert m["diagonal"]["holds"] == {A: True, B: False}
    assert "below hf:float32:none 1.600" in m["diagonal"]["lines"][1]
    rec = recommend(m, A, "layer offset")
    assert rec["per_source"][B]["train_on_serving_gain"] == pytest.approx(-0.3)
    assert "reference drafter serves as well" in rec["lines"][0]
