"""vLLM on CUDA with CUDA graphs off captures boundary N at aux id 0 (eagle3nb/engines/vllm_eager.py):
when the refusal applies, and that the engine sources it cites hold the code it rests on. The
measurement itself ran on an H200 (bench/h200_2026-12-04/boundaries.json); the last test reads it
back from that file rather than restating its numbers."""

from __future__ import annotations

import json

import pytest

from eagle3nb.engines.vllm_eager import SOURCE, id0_hazard, refuse_id0
from eagle3nb.repo_paths import REPO_ROOT
from testkit import VLLM_026_SRC, cited_range, engine_file_lines, requires_engine


@pytest.mark.parametrize(
    "ids, cuda, eager, refused",
    [
        ([0, 1, 3], True, True, True),
        ([3, 1, 0], True, True, True),  # any position
        ([0, 1, 3], True, False, False),  # CUDA graphs on: measured boundary 0
        ([0, 1, 3], False, True, False),  # CPU: measured boundary 0 (vLLM 0.32.0)
        ([1, 2, 4], True, True, False),  # no id 0
        ([], True, True, False),
    ],
)
def test_hazard_only_for_id0_on_cuda_without_graphs(ids, cuda, eager, refused):
    why = id0_hazard(ids, cuda, eager)
    assert (why is not None) == refused
    if refused:
        assert "enforce_eager: false" in why and "boundary N" in why
        with pytest.raises(ValueError, match=r"capture asks vLLM for aux ids \[0, 1, 3\]"):
            refuse_id0(ids, cuda, eager, "capture")
    else:
        refuse_id0(ids, cuda, eager, "capture")  # no raise


def _line(root, rel: str, n: int) -> str:
    return cited_range(root, rel, n, n)


def test_cited_vllm_026_lines_hold_the_aliasing():
    """The kept tensor (residual None at id 0), layer 0 making it its residual, and the in-place
    add + norm: each at the line SOURCE cites."""
    if not (VLLM_026_SRC / "vllm/model_executor/layers/layernorm.py").is_file():
        pytest.skip(
            f"{VLLM_026_SRC} absent (bash .ci/setup_engines.sh fetches vLLM 0.26.0's sdist)"
        )
    m = "vllm/model_executor/"
    assert "interfaces.py:1357" in SOURCE and "llama.py:317-318 and 419" in SOURCE
    assert "layernorm.py:88" in SOURCE
    kept = _line(VLLM_026_SRC, m + "models/interfaces.py", 1357)
    assert "if residual is not None else hidden_states" in kept
    assert _line(VLLM_026_SRC, m + "models/llama.py", 317).strip() == "if residual is None:"
    assert _line(VLLM_026_SRC, m + "models/llama.py", 318).strip() == "residual = hidden_states"
    assert "_maybe_add_hidden_state([], 0, hidden_states, residual)" in _line(
        VLLM_026_SRC, m + "models/llama.py", 419
    )
    assert "fused_add_rms_norm.maybe_inplace(" in _line(VLLM_026_SRC, m + "layers/layernorm.py", 88)


@requires_engine("vllm")
def test_vllm_032_keeps_the_same_tensor():
    """The module's claim about the installed vLLM 0.32.0: the same uncopied tensor at id 0."""
    lines = engine_file_lines("vllm", "vllm/model_executor/models/interfaces.py")
    assert "if residual is not None else hidden_states" in lines[1609 - 1]
    assert "aux_hidden_states.append(value)" in lines[1610 - 1]


def test_the_h200_measurement_shows_what_the_module_says():
    """bench/h200_2026-12-04/boundaries.json (written on the H200): id 0 read boundary N with
    graphs off and boundary 0 with graphs on, ids 1 and 3 right in both."""
    d = json.loads((REPO_ROOT / "bench/h200_2026-12-04/boundaries.json").read_text())
    assert d["versions"]["vllm"] == "0.26.0" and "H200" in d["device"]["name"]
    eager, graphs = d["float32_offset_ids_eager"], d["float32_offset_ids_graphs"]
    assert eager["enforce_eager"] and not graphs["enforce_eager"]
    got = {k: [s["gpu_boundary"] for s in r["slots"]] for k, r in (("e", eager), ("g", graphs))}
    assert got == {"e": [5, 1, 3, 5], "g": [0, 1, 3, 5]}
    assert id0_hazard(eager["vllm_ids"], True, True) and not id0_hazard(
        graphs["vllm_ids"], True, False
    )


def test_04_leaves_out_vllm_rows_read_from_id0_on_cuda_eager():
    """04's drafters: the offset copy (vLLM reads [0, 1, 3]) loses vLLM on CUDA with graphs off,
    with the reason; the trained drafter, SGLang, CPU and graphs-on runs keep theirs."""
    from eagle3nb.steps.evaluate.served import OFFSET, drop_vllm_id0

    def drafters():
        return {
            "trained": (
                "d",
                [5],
                [1],
                {"vllm", "sglang"},
                {"vllm": [1, 2, 4], "sglang": [1, 2, 4]},
            ),
            OFFSET: ("o", [5], [1], {"vllm", "sglang"}, {"vllm": [0, 1, 3], "sglang": [0, 1, 3]}),
        }

    d = drafters()
    out = drop_vllm_id0(d, "cuda", {"enforce_eager": True})
    assert list(out) == [f"vllm: {OFFSET}"] and "enforce_eager: false" in out[f"vllm: {OFFSET}"]
    assert d[OFFSET][3] == {"sglang"} and d["trained"][3] == {"vllm", "sglang"}
    assert drop_vllm_id0(drafters(), "cuda", None)  # the backend's default is eager
    for device, opts in (("cpu", {"enforce_eager": True}), ("cuda:0", {"enforce_eager": False})):
        d = drafters()
        assert drop_vllm_id0(d, device, opts) == {} and d[OFFSET][3] == {"vllm", "sglang"}
