"""The engine process boundary (worker + client) with a FAKE backend (tests/engines/fake), in a
subprocess of this python: protocol, tensors through files, errors, timeouts, missing venvs, and a
worker killed after logging its error (the error is named in the raised message).
Real engines: tests/engines/test_engine_vllm.py."""

import os
from pathlib import Path

import pytest
import torch

from eagle3nb.engines.client import EngineClient, EngineError, check_engine_python
from testkit import FAKE_ENGINE_DIR, fake_engine


def _client(tmp_path, **opts):
    return fake_engine(tmp_path, options=opts)


def test_protocol_roundtrip_and_tensors(tmp_path):
    with _client(tmp_path) as c:
        assert c.info()["engine_name"] == "fake" and c.info()["pid"] == c.pid != os.getpid()
        assert c.generate([[1, 2], [5]], 3, [0]) == [[3, 4, 5], [6, 0, 1]]  # (last + j + 1) % 7
        samples = [[1, 2, 3], [4]]
        out = c.capture(samples, [0, 2])
        for s, o in zip(samples, out):
            t = torch.tensor(s, dtype=torch.float32)[:, None]
            want = torch.cat([(t * 10).expand(-1, 4), (t * 10 + 2).expand(-1, 4)], dim=1)
            assert torch.equal(o["aux"], want) and torch.equal(o["final"], t.expand(-1, 4))
        wd = Path(c.workdir)
        assert wd.parent == tmp_path and not list(wd.glob("capture-*"))  # transfer files deleted
    assert not wd.exists() and c.pid is None  # closed: worker gone, temp folder removed


def test_tensor_handover_concatenates_shared_keys_and_splits_them_back(tmp_path):
    """The worker's file of one call (``_save_tensors``) read back as the client does (``load_tensors``):
    a key every sample has with one dtype and trailing shape travels as one tensor plus lengths
    (an empty sample included), keys some samples lack or whose dtype differs travel per sample;
    every tensor comes back equal, in its sample, with its dtype."""
    from safetensors.torch import load_file

    from eagle3nb.engines.worker import _save_tensors, load_tensors

    g = torch.Generator().manual_seed(0)
    lens = [3, 0, 5, 1]
    items = [
        {"aux": torch.randn(n, 6, generator=g), "ids": torch.arange(n) + 7 * i}
        for i, n in enumerate(lens)
    ]
    for i in (0, 2):  # "final" in two samples only
        items[i]["final"] = torch.randn(lens[i], 2, generator=g).to(torch.bfloat16)
    items[3]["ids"] = items[3]["ids"].to(torch.int32)  # another dtype: per sample
    res = _save_tensors(str(tmp_path), 1, items)
    stored = set(load_file(res["file"]))
    assert {"cat.aux", "len.aux", "0.ids", "3.ids", "0.final", "2.final"} <= stored
    assert not {"cat.ids", "cat.final", "1.final", "0.aux"} & stored
    out = load_tensors(res)  # what EngineClient does with a worker's answer
    assert not Path(res["file"]).exists() and len(out) == len(items)
    for want, got in zip(items, out):
        assert set(got) == set(want)
        for k, t in want.items():
            assert got[k].dtype == t.dtype and torch.equal(got[k], t), k


def test_engine_errors_are_raised_with_the_engine_message(tmp_path):
    with _client(tmp_path) as c:
        with pytest.raises(
            ValueError, match=r"fake_engine_backend engine, capture: layer_ids=\[-1\]: negative"
        ):
            c.capture([[1]], [-1])
        assert c.generate([[1]], 1, [0]) == [[2]]  # still serving after an error


def test_start_failure_names_the_error(tmp_path):
    with pytest.raises(
        EngineError, match="failed to start: ValueError: fake engine asked to fail at start"
    ):
        _client(tmp_path, fail_start=True)


def test_request_timeout_stops_the_worker(tmp_path):
    c = fake_engine(tmp_path, options={"sleep": 30}, request_timeout=2)
    pid = c.pid
    with pytest.raises(EngineError, match="no answer to capture within 2 s"):
        c.capture([[1]], [0])
    c.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_killed_worker_surfaces_the_engines_reason_from_its_log(tmp_path):
    # SGLang 0.5.23 asked for Qwen3-MoE boundary N logs an IndexError and kills itself (-9)
    why = "IndexError: index 6 is out of range"
    c = _client(tmp_path, die_with=why)
    with pytest.raises(
        EngineError,
        match=r"exited \(code -9\) during capture: IndexError: index 6 is out of range \(the "
        r"engine's last error in its log\)\n--- last",
    ):
        c.capture([[1]], [0])
    c.close()


def test_missing_engine_venv_names_param_and_setup():
    with pytest.raises(
        FileNotFoundError, match=r"vllm_python='/nope/bin/python'.*bash \.ci/setup_engines\.sh"
    ):
        EngineClient("vllm", "m", python="/nope/bin/python", param="vllm_python")
    with pytest.raises(ValueError, match="engine='nope' is unknown"):
        EngineClient("nope", "m", python=None)


def test_in_process_mode_refuses_missing_engine_package():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip(
            "vllm imports in this environment (GPU box): the in-process refusal cannot be shown"
        )
    with pytest.raises(
        ImportError, match=r"vllm_python='' runs vllm in this process.*bash \.ci/setup_engines\.sh"
    ):
        check_engine_python("vllm", "", "vllm_python")


def test_in_process_mode_same_contract(tmp_path, monkeypatch):
    """python '' runs the backend in this process (GPU box): same answers, no worker, temp folder removed."""
    monkeypatch.syspath_prepend(str(FAKE_ENGINE_DIR))
    with EngineClient(
        "module:fake_engine_backend", "unused", python="", workdir_parent=tmp_path
    ) as c:
        assert c.pid is None and c.info()["pid"] == os.getpid()
        assert c.generate([[1, 2]], 3, [0]) == [[3, 4, 5]]
        out = c.capture([[1, 2, 3]], [0, 2])[0]
        assert out["aux"].shape == (3, 8) and torch.equal(
            out["final"][:, 0], torch.tensor([1.0, 2.0, 3.0])
        )
        wd = Path(c.workdir)
    assert not wd.exists()


def test_in_process_engine_keeps_this_process_compile_threads(tmp_path, monkeypatch):
    """An engine that sets TORCHINDUCTOR_COMPILE_THREADS=1 when imported (as ``import vllm``
    does, vllm/env_override.py): in-process, inductor's thread count stays what this host gives
    and the variable is put back (here: absent) once the engine started."""
    import torch._inductor.config as inductor

    monkeypatch.syspath_prepend(str(FAKE_ENGINE_DIR))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    (tmp_path / "fake_sets_compile_threads.py").write_text(
        "import os\nos.environ['TORCHINDUCTOR_COMPILE_THREADS'] = '1'\n"
        "from fake_engine_backend import Backend  # noqa: F401\n"
    )
    before = inductor.compile_threads
    with EngineClient("module:fake_sets_compile_threads", "unused", python="") as c:
        assert c.info()["pid"] == os.getpid()  # the fake ran here and set the variable at import
        assert "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ
        assert inductor.compile_threads == before == inductor.decide_compile_threads()
