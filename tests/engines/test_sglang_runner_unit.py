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
    assert sr.pick_route("auto", "0.5.22", False) == "runner"  # no aux API; shown on CPU
    assert sr.pick_route("runner", "0.5.23", True) == "runner"  # the CPU test's forced route


def test_route_refusals(monkeypatch):
    monkeypatch.delenv(sr.ANY_VERSION_ENV, raising=False)
    with pytest.raises(ValueError, match="has no enable_return_aux_hidden_states"):
        sr.pick_route("engine", "0.5.17", False)
    with pytest.raises(RuntimeError, match=r"SGLang 0\.5\.18: .*0\.5\.17, 0\.5\.22, 0\.5\.23 only"):
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


def test_float32_refused_on_cuda_with_0517_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"intermediate_size": 176}))
    why = so.mlp_width_problem(str(tmp_path), "float32", "cuda", False, "0.5.17")
    assert "rmsnorm takes bfloat16 and float16 only" in why and "native_ops: true" in why
    assert so.mlp_width_problem(str(tmp_path), "float32", "cuda", True, "0.5.17") is None
    assert so.mlp_width_problem(str(tmp_path), "bfloat16", "cuda", False, "0.5.17") is None
    assert so.mlp_width_problem(str(tmp_path), "float32", "cuda", False, "0.5.23") is None


def test_options_refusals():
    assert sh.check_sglang_options({"capture_route": "runner", "native_ops": True})
    with pytest.raises(ValueError, match="capture_route='x'"):
        sh.check_sglang_options({"capture_route": "x"})
    with pytest.raises(ValueError, match="native_ops='yes'"):
        sh.check_sglang_options({"native_ops": "yes"})


def test_backend_routes_capture_to_the_runner_without_the_aux_api(tmp_path, monkeypatch):
    """Backend.capture on an SGLang whose ServerArgs lacks the aux API (a fake sglang 0.5.17
    module) goes to the runner, keeps it for the next call, rebuilds it for another dtype, and an
    engine start for plain generation frees it first; a runner-only generate of one greedy token
    takes the runner's prefill. The runner is a fake that records its calls (named as one)."""
    import sys
    import types

    import torch

    from eagle3nb.engines import sglang_backend as sb

    (tmp_path / "config.json").write_text('{"hidden_size": 4, "intermediate_size": 8}')
    calls = []

    class FakeServerArgs:  # 0.5.17's fields lack enable_return_aux_hidden_states
        def __init__(self, model_path=None, dtype=None):
            pass

    class FakeRunnerCapture:
        def __init__(self, path, dtype, device, seed, mtt, native, kw):
            calls.append(("build", dtype, native))

        def capture(self, samples, ids, logprobs):
            calls.append(("capture", tuple(ids)))
            return [{"aux": torch.zeros(len(s), 4 * len(ids))} for s in samples]

        def prefill(self, samples):
            calls.append(("prefill", len(samples)))
            return [[7] for _ in samples]

        def close(self):
            calls.append(("close",))

    class FakeEngine:
        def __init__(self, **kw):
            calls.append(("engine", kw["dtype"]))

        def shutdown(self):
            calls.append(("shutdown",))

        def generate(self, input_ids, sampling_params):
            return [{"output_ids": [5, 6]} for _ in input_ids]

    fake = types.ModuleType("sglang")
    fake.__version__, fake.Engine = "0.5.17", FakeEngine
    srt = types.ModuleType("sglang.srt.server_args")
    srt.ServerArgs = FakeServerArgs
    monkeypatch.setitem(sys.modules, "sglang", fake)
    monkeypatch.setitem(sys.modules, "sglang.srt", types.ModuleType("sglang.srt"))
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", srt)
    monkeypatch.setattr(sr, "RunnerCapture", FakeRunnerCapture)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "cpu-shim"))
    be = sb.Backend(str(tmp_path), "float32", {"device": "cpu"})
    assert be.capture_route() == "runner"
    out = be.capture([[1, 2, 3], [1, 4]], [0, 1])
    assert [o["aux"].shape for o in out] == [(3, 8), (2, 8)]
    be.capture([[1, 2]], [2])  # the same runner, other ids: no rebuild
    assert be.generate([[1, 2]], 1, [], on_capture_engine=True) == [[7]]
    be.capture([[1, 2]], [0], dtype="bfloat16")  # another dtype: rebuilt
    be.generate([[1, 2]], 3, [])  # plain generation: the runner is freed before the engine
    assert calls == [
        ("build", "float32", False),
        ("capture", (0, 1)),
        ("capture", (2,)),
        ("prefill", 1),
        ("close",),
        ("build", "bfloat16", False),
        ("capture", (0,)),
        ("close",),
        ("engine", "float32"),
    ]
    with pytest.raises(
        RuntimeError, match=r"aux states 3 wide for layer ids \[0\], not 1 x hidden_size 4"
    ):  # width still checked
        monkeypatch.setattr(
            FakeRunnerCapture,
            "capture",
            lambda self, s, ids, lp: [{"aux": torch.zeros(len(x), 3) for x in s}],
        )
        be.capture([[1, 2]], [0])
