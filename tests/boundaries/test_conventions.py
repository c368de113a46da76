"""eagle3nb.boundaries.conventions: layer ids <-> boundaries per engine and trainer, the default picker, and
what each engine cannot capture (values by hand and from the reference table)."""

import pytest

from eagle3nb.boundaries.conventions import (
    CONVENTIONS,
    boundary_table,
    check_boundaries,
    get_convention,
    pick_default_boundaries,
)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8, 12, 32, 61, 80])
def test_default_picker_strictly_increasing_in_range(n):
    b = pick_default_boundaries(n)
    assert len(b) == 3 and all(1 <= x <= n for x in b) and b[0] < b[1] < b[2]


def test_default_picker_values_by_hand():
    # N >= 7 follows the shared engine default (2, N//2, N-3); small N use the fallback
    assert pick_default_boundaries(32) == [2, 16, 29]
    assert pick_default_boundaries(7) == [2, 3, 4]
    assert pick_default_boundaries(5) == [1, 2, 4]
    assert pick_default_boundaries(3) == [1, 2, 3]
    assert pick_default_boundaries(6) == [1, 3, 5]
    for bad in (0, 1, 2):
        with pytest.raises(ValueError, match="n_layers"):
            pick_default_boundaries(bad)


def test_engine_defaults_at_32_layers_match_reference_table():
    # ../shared/reference/conventions.md section 1, "physical default (N=32)"
    expect = {
        "sglang": [2, 16, 29],
        "vllm": [2, 16, 29],
        "speculators_le_0.4": [3, 17, 30],
        "speculators_ge_0.5": [2, 16, 29],
        "specforge": [2, 16, 29],
        "eagle": [2, 16, 29],
    }
    for name, b in expect.items():
        assert get_convention(name).default_boundaries(32) == b, name


def test_explicit_ids_by_hand():
    # SGLang id L -> boundary L+1; vLLM id L -> boundary L
    assert get_convention("sglang").ids_to_boundaries([0, 1, 3], 5) == [1, 2, 4]
    assert get_convention("vllm").ids_to_boundaries([1, 2, 4], 5) == [1, 2, 4]
    assert get_convention("vllm").ids_to_boundaries([5], 5) == [5]  # id N = final pre-norm state
    # same boundaries, different numbers: SGLang id = vLLM id - 1
    assert get_convention("sglang").boundaries_to_ids([2, 16, 29], 32) == [1, 15, 28]
    assert get_convention("vllm").boundaries_to_ids([2, 16, 29], 32) == [2, 16, 29]


@pytest.mark.parametrize("n", [3, 4, 5, 7, 32])
@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_round_trip_every_capturable_boundary(n, name):
    c = get_convention(name)
    lo, hi = c.capturable(n)
    for b in range(lo, hi + 1):
        ids = c.boundaries_to_ids([b], n)
        assert c.ids_to_boundaries(ids, n) == [b]


def test_uncapturable_ids_raise():
    # SGLang captures inside the layer loop: id N-1 would be boundary N, never reached
    with pytest.raises(ValueError, match="captures only boundaries 1..4"):
        get_convention("sglang").ids_to_boundaries([0, 4], 5)
    with pytest.raises(ValueError, match="cannot be captured"):
        get_convention("sglang").boundaries_to_ids([5], 5)
    with pytest.raises(ValueError, match="boundary -1"):
        get_convention("vllm").ids_to_boundaries([-1], 5)
    with pytest.raises(ValueError, match="unknown"):
        get_convention("tensorrt")


def test_check_boundaries_rejects_duplicates_and_unsorted():
    # the [2, N//2, N-3] rule at N=5 gives [2, 2, 2]
    with pytest.raises(ValueError, match="strictly increasing"):
        check_boundaries(get_convention("sglang").default_boundaries(5), 5)
    with pytest.raises(ValueError, match="strictly increasing"):
        check_boundaries([3, 1, 2], 5)
    with pytest.raises(ValueError, match="0..5"):
        check_boundaries([1, 2, 6], 5)


def test_boundary_table_marks_uncapturable():
    rows = {r["convention"]: r["ids"] for r in boundary_table([1, 2, 5], 5)}
    assert rows["vllm"] == [1, 2, 5]
    assert rows["sglang"] is None  # boundary 5 (final) is not capturable by SGLang
