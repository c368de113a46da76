"""04's layer-offset baseline: the boundaries the other engine reads from the same layer ids,
checked against the conventions written out by hand (SGLang id L = boundary L+1, vLLM id L =
boundary L; ``../shared/reference/conventions.md``)."""

from eagle3nb.steps.evaluate.step import offset_boundaries
from eagle3nb.boundaries.conventions import get_convention


def test_sglang_trained_served_by_vllm_is_minus_one():
    # SGLang ids [0, 1, 3] were captured at boundaries [1, 2, 4]; vLLM reads 0, 1, 3 as 0, 1, 3
    assert offset_boundaries("sglang", [1, 2, 4], 5) == [0, 1, 3]


def test_vllm_trained_served_by_sglang_is_plus_one():
    assert offset_boundaries("vllm", [1, 2, 4], 5) == [2, 3, 5]


def test_equals_reading_the_ids_in_the_other_convention():
    n = 32
    for ids in ([1, 15, 28], [2, 16, 29], [0, 10, 20]):
        trained = get_convention("sglang").ids_to_boundaries(ids, n)
        assert offset_boundaries("sglang", trained, n) == get_convention("vllm").ids_to_boundaries(
            ids, n
        )


def test_falls_back_to_the_other_direction_at_the_edges():
    assert offset_boundaries("sglang", [0, 2, 4], 5) == [1, 3, 5]  # -1 would leave [0, n]
    assert offset_boundaries("vllm", [1, 3, 5], 5) == [0, 2, 4]
    assert offset_boundaries("vllm", [0, 1, 2], 2) is None
