"""The SGLang worker's launch settings (no engine started): CPU switch and shim on CPU only, a
loopback-only namespace prefix, the drift figure's numbers, and the aux width check (n_ids x the
text model's hidden_size)."""

import os
import subprocess

import pytest
import torch

from eagle3nb.engines import sglang_backend as sb
from eagle3nb.engines import sglang_netns
from eagle3nb.viz.plots import engine_drift_figure


def test_launch_env_cpu_has_switch_and_shim(tmp_path):
    (tmp_path / "cpu-shim").mkdir()
    (tmp_path / "cpu-shim" / "libcuda.so.1").write_bytes(b"\x7fELF")
    env = sb.launch_env("cpu", tmp_path, base={"LD_LIBRARY_PATH": "/opt/x"})
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [str(tmp_path / "cpu-shim"), "/opt/x"]
    assert env["HF_HUB_OFFLINE"] == "1"


def test_launch_env_gpu_has_neither_even_if_inherited(tmp_path):
    env = sb.launch_env(
        "cuda:1",
        tmp_path,
        base={
            "SGLANG_USE_CPU_ENGINE": "1",
            "LD_LIBRARY_PATH": f"{tmp_path}/cpu-shim{os.pathsep}/usr/local/cuda/lib64",
        },
    )
    assert "SGLANG_USE_CPU_ENGINE" not in env and env["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_launch_env_refuses_missing_shim_and_auto(tmp_path):
    with pytest.raises(FileNotFoundError, match="setup_engines.sh"):
        sb.launch_env("cpu", tmp_path, base={})
    with pytest.raises(ValueError, match="auto"):
        sb.launch_env("auto", tmp_path, base={})


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare -n needs root here")
def test_loopback_prefix_gives_a_namespace_with_lo_only():
    pre = sglang_netns.loopback_prefix()
    out = subprocess.run(
        [*pre, "ip", "-o", "link"], capture_output=True, text=True, check=True
    ).stdout
    assert [ln.split(":")[1].strip() for ln in out.splitlines()] == ["lo"]
    assert "UP" in out.split("<", 1)[1].split(">", 1)[0]  # lo was brought up


def test_loopback_prefix_off_switch(monkeypatch):
    monkeypatch.setenv("EAGLE3NB_ENGINE_NETNS", "off")
    assert sglang_netns.loopback_prefix() == []


def test_drift_figure_deviation_is_per_token_relative_error():
    g = torch.Generator().manual_seed(0)
    ref = {1: torch.randn(6, 4, generator=g), 2: torch.randn(6, 4, generator=g)}
    other = {b: x * 1.01 for b, x in ref.items()}  # exactly 1% off on every token
    fig = engine_drift_figure(
        {"hf-transformers float32 (reference)": ref, "engine-x bfloat16": other},
        "hf-transformers float32 (reference)",
    )
    devs = [t for t in fig.data if t.xaxis in ("x2", "x4")]
    assert len(devs) == 2  # one deviation histogram per boundary, none for the reference itself
    for t in devs:
        # all 6 tokens in the one bin that holds log10(0.01) = -2
        hit = [(x, y, t.width) for x, y in zip(t.x, t.y) if y > 0]
        assert len(hit) == 1 and hit[0][1] == 6, hit
        assert abs(hit[0][0] - (-2.0)) <= hit[0][2] / 2 + 1e-6, hit
    vals = [t for t in fig.data if t.xaxis == "x" and t.name == "engine-x bfloat16"][0]
    assert abs(sum(vals.y) * vals.width - 1) < 1e-3  # a probability density over every value
    with pytest.raises(ValueError, match="same tokens"):
        engine_drift_figure({"r": ref, "y": {1: torch.zeros(5, 4)}}, "r")
    with pytest.raises(ValueError, match="reference"):
        engine_drift_figure({"r": ref}, "missing")


def test_aux_width_must_be_n_ids_times_hidden(tmp_path):
    from eagle3nb.engines.worker import check_aux_width, text_hidden_size

    (tmp_path / "config.json").write_text('{"text_config": {"hidden_size": 64}}')  # a wrapper
    assert text_hidden_size(str(tmp_path)) == 64
    check_aux_width(0, 192, [0, 1, 3], 64, "SGLang")
    # 128 divides by 2 ids but is 2 x 64, not the 2 x 96 asked: refused (the old check passed it)
    with pytest.raises(
        RuntimeError,
        match=r"sample 3: SGLang returned aux states 128 wide for "
        r"layer ids \[0, 1\], not 2 x hidden_size 96 = 192",
    ):
        check_aux_width(3, 128, [0, 1], 96, "SGLang")


def test_sglang_options_reach_sglang_engine_and_fixed_ones_are_refused(tmp_path, monkeypatch):
    """``sglang_options.engine_kwargs`` (e.g. tp_size on a GPU host) reaches ``sglang.Engine``
    next to eagle3nb's capture settings; a kwarg that would change the capture is refused."""
    import sys
    import types

    from eagle3nb.engines import sglang_helpers as sh

    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    seen = {}

    class FakeSglangEngine:  # stands in for sglang.Engine: records its arguments, runs nothing
        def __init__(self, **kw):
            seen.update(kw)

    monkeypatch.setitem(
        sys.modules, "sglang", types.SimpleNamespace(Engine=FakeSglangEngine, __version__="0.5.23")
    )
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "cpu-shim"))
    opts = sh.check_sglang_options({"max_total_tokens": 4096, "engine_kwargs": {"tp_size": 2}})
    be = sb.Backend(str(tmp_path), "float32", {"device": "cpu", "seed": 3, **opts})
    be._start(("capture", [0, 1, 3], "float32"))
    assert seen["tp_size"] == 2 and seen["max_total_tokens"] == 4096 and seen["random_seed"] == 3
    assert seen["return_aux_hidden_state_layer_ids"] == [0, 1, 3]
    assert seen["disable_radix_cache"] is True and seen["chunked_prefill_size"] == -1
    for bad, match in (
        ({"engine_kwargs": {"disable_radix_cache": False}}, r"sets \['disable_radix_cache'\]"),
        ({"engine_kwargs": [("tp_size", 2)]}, "give a mapping"),
        ({"max_total_tokens": 0}, "positive int"),
        ({"tp_size": 2}, "unknown keys"),
    ):
        with pytest.raises(ValueError, match=match):
            sh.check_sglang_options(bad)
