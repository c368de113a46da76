"""Shared fixtures: the real tiny target (stories260K-hd32) loaded once per session, the stored
notebooks' own run (``outputs/smoke``) made once per session, headless, and the engine workers
kept for reuse across the session's tests (eagle3nb.engines.pool)."""

import contextlib
import os

import pytest
import torch
from testkit import ENGINE_PYTHONS, engine_skip_reason

from eagle3nb.engines import client, pool
from eagle3nb.target import models

# One engine start per engine and target for the whole session: a worker closed by a test or a step
# is kept running (at most 3 idle, ~2 GB each) and handed to the next with the same start arguments
# (eagle3nb.engines.pool); set EAGLE3NB_KEEP_ENGINES=0 to start each afresh.
os.environ.setdefault(pool.KEEP_ENV, "3")

# where a test without the ``engines`` mark finds the engine venvs: nowhere (the name says why)
HIDDEN_ENGINES = "/nonexistent/engine-venvs-hidden-from-a-test-not-marked-requires_engine"


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
def _engines_hidden():
    """The engine venvs out of reach: ``DEFAULT_ENGINE_PYTHONS`` (read at call time by every
    step) and ``EAGLE3NB_ENGINES`` (what a papermill kernel or torchrun child reads) point under
    :data:`HIDDEN_ENGINES`; restored on exit."""
    saved = dict(client.DEFAULT_ENGINE_PYTHONS), client.ENGINES_HOME
    env = os.environ.get("EAGLE3NB_ENGINES")
    os.environ["EAGLE3NB_ENGINES"] = HIDDEN_ENGINES
    client.ENGINES_HOME = type(client.ENGINES_HOME)(HIDDEN_ENGINES)
    for engine, python in ENGINE_PYTHONS.items():
        rel = os.path.relpath(python, saved[1])
        client.DEFAULT_ENGINE_PYTHONS[engine] = os.path.join(HIDDEN_ENGINES, rel)
    try:
        yield
    finally:
        client.DEFAULT_ENGINE_PYTHONS.update(saved[0])
        client.ENGINES_HOME = saved[1]
        if env is None:
            os.environ.pop("EAGLE3NB_ENGINES", None)
        else:
            os.environ["EAGLE3NB_ENGINES"] = env


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test without the ``engines`` mark runs (setup, fixtures of any scope it first asks for,
    call, teardown) with the engine venvs hidden: one that starts an engine, reads an engine's
    installed version or files, fails naming :data:`HIDDEN_ENGINES`, so the contributors' fast
    command (``-m "not engines ..."``, README "Tests") never starts an engine and needs no venv.
    Why at run time: a grep cannot see an engine started three calls down inside a step."""
    hide = item.get_closest_marker("engines") is None
    with _engines_hidden() if hide else contextlib.nullcontext():
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
    it, each re-run reading the steps' recorded results back (:mod:`eagle3nb.steps.recorded`)
    instead of starting the engines again. Returns the run folder."""
    import shutil

    from eagle3nb.rundir import REPO_ROOT
    from eagle3nb.run import run_notebooks

    root = REPO_ROOT / "outputs" / "smoke"
    shutil.rmtree(root, ignore_errors=True)  # never check an earlier session's run
    return run_notebooks(REPO_ROOT / "params" / "smoke.yaml")
