"""Shared fixtures: the real tiny target (stories260K-hd32) loaded once per session, the stored
notebooks' own run (``outputs/smoke``) made once per session, headless, and the engine workers
kept for reuse across the session's tests (eagle3nb.engines.pool)."""

import os

import pytest
import torch

from eagle3nb.engines import pool
from eagle3nb.target import models

# One engine start per engine and target for the whole session: a worker closed by a test or a step
# is kept running (at most 3 idle, ~2 GB each) and handed to the next with the same start arguments
# (eagle3nb.engines.pool); set EAGLE3NB_KEEP_ENGINES=0 to start each afresh.
os.environ.setdefault(pool.KEEP_ENV, "3")


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
