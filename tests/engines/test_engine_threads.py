"""An engine worker really runs with its share of the thread budget: the FAKE backend
(tests/engines/fake) and, when its venv exists, the real vLLM engine's python report the torch
threads and pool variables they see; a user's own OMP_NUM_THREADS is kept."""

import pytest
import torch

from testkit import FAKE_ENGINE_ENV, fake_engine, requires_engine
from eagle3nb import threads
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS, EngineClient


def test_fake_worker_runs_with_the_budget(tmp_path, monkeypatch):
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    with fake_engine(tmp_path, threads=1) as c:
        assert c.threads == {
            "torch_threads": 1,
            "env": {
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "VLLM_CPU_OMP_THREADS_BIND": None,
            },
        }
        info = c.info()  # the backend's own view, after its import
        assert info["torch_threads"] == 1 and info["env"]["OMP_NUM_THREADS"] == "1"


def test_worker_takes_this_process_budget_and_keeps_a_users_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        threads.apply(threads.plan(1, threads.Cores(2, (0, 1), None, "affinity")))
        with fake_engine(
            tmp_path, env=dict(FAKE_ENGINE_ENV, OMP_NUM_THREADS="2")
        ) as c:  # the user's own 2 is kept
            assert c.threads["env"]["OMP_NUM_THREADS"] == "2"
            assert c.threads["env"]["MKL_NUM_THREADS"] == "1" and c.threads["torch_threads"] == 1
        threads.clear()  # threads: -1 -> no setting at all
        with fake_engine(tmp_path) as c:
            assert c.threads["env"]["MKL_NUM_THREADS"] is None
    finally:
        threads.clear()
        torch.set_num_threads(before)


VLLM_PY = DEFAULT_ENGINE_PYTHONS["vllm"]


@requires_engine("vllm")
def test_real_vllm_worker_python_runs_with_the_budget(tmp_path, monkeypatch):
    # the worker in vLLM's venv (its own torch build) builds the vLLM backend; vLLM's engine itself
    # starts on the first request, so no engine is started here
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.delenv(k, raising=False)
    model = REPO_ROOT.parent / "shared" / "models" / "stories260K-hd32"
    if not model.is_dir():
        pytest.skip(f"model folder {model} absent")
    with EngineClient(
        "vllm", model, python=VLLM_PY, workdir_parent=tmp_path, threads=1, startup_timeout=300
    ) as c:
        assert c.info()["engine_name"] == "vllm"
        assert c.threads == {
            "torch_threads": 1,
            "env": {
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            },
        }
