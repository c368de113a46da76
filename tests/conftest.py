"""Shared fixtures: the real tiny target (stories260K-hd32) loaded once per session, the stored
notebooks' own run (``outputs/smoke``) made once per session, headless, and the engine workers
kept for reuse across the session's tests (eagle3nb.engines.pool)."""

import contextlib
import os
from pathlib import Path

import pytest
import torch
from testkit import engine_skip_reason

from eagle3nb.engines import client, pool
from eagle3nb.target import models

# One engine start per engine and target for the whole session: a worker closed by a test or a step
# is kept running (at most 3 idle, ~2 GB each) and handed to the next with the same start arguments
# (eagle3nb.engines.pool); set EAGLE3NB_KEEP_ENGINES=0 to start each afresh.
os.environ.setdefault(pool.KEEP_ENV, "3")

# the engine venvs' folder (~/.cache/eagle3nb/engines/<venv>/bin/python)
ENGINES_HOME = Path(client.ENGINES_HOME)
# what a test without the ``engines`` mark meets when it starts an engine
UNMARKED_START = "an engine started by a test not marked requires_engine(...) (tests/testkit.py)"


def pytest_collection_modifyitems(config, items):
    """Skip each test marked :func:`testkit.requires_engine` whose engine venv is absent (or
    holds another version), with :func:`testkit.engine_skip_reason`'s one reason."""
    reasons = {}
    for item in items:
        for mark in item.iter_markers("engines"):
            if not mark.args:
                continue  # a bare ``engines`` mark (nbval's notebooks): needs both, no skip here
            key = (mark.args[0], mark.kwargs.get("version"))
            if key not in reasons:
                reasons[key] = engine_skip_reason(*key)
            if reasons[key]:
                item.add_marker(pytest.mark.skip(reason=reasons[key]))
                break


@contextlib.contextmanager
def _engine_starts_refused():
    """``EngineClient`` (every engine worker start, pooled or not) raises :data:`UNMARKED_START`
    before it starts a process; restored on exit. Reading an engine's installed version (preflight)
    stays allowed: it starts nothing and takes milliseconds."""
    init = client.EngineClient.__init__

    def refuse(self, engine, model_path, dtype="float32", options=None, python=None, **kw):
        # only the engine venvs' pythons are refused: a fake worker (tests/engines/fake) or the
        # in-process mode (python None: no engine installed in this venv) is a unit test
        if not python or Path(python).expanduser().parent.parent.parent != ENGINES_HOME:
            return init(self, engine, model_path, dtype, options, python, **kw)
        raise RuntimeError(f"{UNMARKED_START}: {engine}; mark the test requires_engine({engine!r})")

    client.EngineClient.__init__ = refuse
    try:
        yield
    finally:
        client.EngineClient.__init__ = init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test without the ``engines`` mark runs (setup, fixtures of any scope it first asks for,
    call, teardown) with engine starts refused in this process, so one that starts an engine
    unmarked fails naming the mark, and the contributors' fast command (``-m "not engines ..."``,
    docs/development.md#tests) starts none. Why at run time: a grep cannot see an engine started three calls
    down inside a step. (A papermill kernel or torchrun child is not watched: the tests that run
    notebooks on the engines carry the mark.)"""
    refuse = item.get_closest_marker("engines") is None
    with _engine_starts_refused() if refuse else contextlib.nullcontext():
        yield


@pytest.fixture(autouse=True)
def steady_threads(request, monkeypatch):
    """No other work seen on the cores by this process's thread rebalancing
    (:class:`eagle3nb.threads.Rebalancer`, :func:`eagle3nb.threads.others_running`), except in
    ``tests/test_threads.py``, which tests it.

    Why: once a step has applied an automatic budget in the pytest process, training re-sizes
    torch's pool to the cores other processes leave idle, and a different thread count changes
    float sums in the last bits. Tests that train twice and compare weights bit for bit (resume
    equals uninterrupted, evaluation leaves weights unchanged) then failed beside a neighbour
    whose load came and went (reproduced with a 0.7 s on / 0.5 s off matmul loop)."""
    if request.path.name != "test_threads.py":
        from eagle3nb import threads

        monkeypatch.setattr(threads, "others_running", lambda *a, **k: 0)


@pytest.fixture(scope="session")
def target():
    torch.manual_seed(0)
    model, tok, path = models.load_target("stories260K-hd32")
    return model, tok, path


@pytest.fixture(scope="session")
def tiny_ds(target, tmp_path_factory):
    """The tiny HF-captured dataset (:func:`testkit.write_tiny_dataset`: five stories, SGLang ids
    [0, 1, 3], shards of 2), built once per session, as an in-memory AuxDataset."""
    from testkit import write_tiny_dataset

    from eagle3nb.dataset.read import AuxDataset

    return AuxDataset(write_tiny_dataset(target, tmp_path_factory.mktemp("tiny_ds")))


@pytest.fixture(scope="session")
def smoke_run():
    """The stored notebooks' run, ``outputs/smoke``, from scratch through ``eagle3nb.run`` headless
    (``params/smoke.yaml`` equals their parameters cells' defaults, tests/test_params.py).

    Made once per session, by the first test that asks: ``tests/test_pipeline.py`` checks its
    artefacts; the JupyterLab browser test then runs the stored notebooks on it, and nbval after
    it, each re-run reading the steps' recorded results back (:mod:`eagle3nb.steps.shared.recorded`)
    instead of starting the engines again. Returns the run folder."""
    import shutil

    from eagle3nb.repo_paths import REPO_ROOT
    from eagle3nb.run import run_notebooks

    root = REPO_ROOT / "outputs" / "smoke"
    shutil.rmtree(root, ignore_errors=True)  # never check an earlier session's run
    return run_notebooks(REPO_ROOT / "params" / "smoke.yaml")
