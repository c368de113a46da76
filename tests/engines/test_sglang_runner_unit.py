"""The ModelRunner capture route's gates, without SGLang: which route a version gets, the versions
it is refused on, the MLP widths SGLang's CUDA SiluAndMul faults on, and the options' refusals."""

import json

import pytest

from eagle3nb.engines import sglang_helpers as sh
from eagle3nb.engines import sglang_ops as so
from eagle3nb.engines import sglang_runner as sr


def test_route_auto_follows_the_aux_api():
    assert sr.pick_route("auto", "0.5.23", True) == "engine"
    assert sr.pick_route("auto", "0.5.17", False) == "runner"
    assert sr.pick_route("runner", "0.5.23", True) == "runner"  # the CPU test's forced route


def test_route_refusals(monkeypatch):
    monkeypatch.delenv(sr.ANY_VERSION_ENV, raising=False)
    with pytest.raises(ValueError, match="has no enable_return_aux_hidden_states"):
        sr.pick_route("engine", "0.5.17", False)
    with pytest.raises(RuntimeError, match=r"SGLang 0\.5\.18: .*0\.5\.17, 0\.5\.23 only"):
        sr.pick_route("auto", "0.5.18", False)
    with pytest.raises(ValueError, match="capture_route='hf'"):
        sr.pick_route("hf", "0.5.17", False)
    monkeypatch.setenv(sr.ANY_VERSION_ENV, "1")
    assert sr.pick_route("auto", "0.5.18", False) == "runner"


def test_native_ops_only_where_shown():
    with pytest.raises(RuntimeError, match="SGLang 0.5.23 has another op class"):
        with so.native_ops("0.5.23"):
            pass
    with pytest.raises(RuntimeError, match="SGLang 0.5.18 has another op class"):
        so.check_native("0.5.18")
    so.check_native("0.5.17")  # where it ran


@pytest.mark.parametrize(
    "width,dtype,device,native,refused",
    [
        (172, "bfloat16", "cuda", False, True),  # 172 % 8 = 4: the fault seen on the H100
        (172, "float16", "cuda", False, True),
        (176, "bfloat16", "cuda", False, False),  # the padded copy
        (172, "float32", "cuda", False, False),  # 4 floats per 16 bytes: the JIT kernel takes it
        (172, "bfloat16", "cpu", False, False),
        (172, "bfloat16", "cuda", True, False),  # torch ops
    ],
)
def test_mlp_width_problem(tmp_path, width, dtype, device, native, refused):
    (tmp_path / "config.json").write_text(json.dumps({"intermediate_size": width}))
    why = so.mlp_width_problem(str(tmp_path), dtype, device, native)
    assert (why is not None) == refused
    if refused:
        assert f"intermediate_size={width}" in why and "pad_mlp" in why


def test_options_refusals():
    assert sh.check_sglang_options({"capture_route": "runner", "native_ops": True})
    with pytest.raises(ValueError, match="capture_route='x'"):
        sh.check_sglang_options({"capture_route": "x"})
    with pytest.raises(ValueError, match="native_ops='yes'"):
        sh.check_sglang_options({"native_ops": "yes"})
