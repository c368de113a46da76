"""The twin proof's logic without a real engine (eagle3nb.engines.twin_check, steps.extract.twin_gate):
a twin of the embedded default target is built from its config.json, captured by HF at a
convention's capture point standing in for an engine, and its slots are named by the twin's HF
boundaries. HF at SGLang's capture point reported as SGLang agrees with engine_rules; a fake engine
(HF at vLLM's capture point, reported as SGLang 0.5.23) disagrees, which stops the run under
``twin_check: enforce`` and warns under ``warn``. The real engines: tests/engines/test_twin_engines.py."""

import json

import pytest
import torch

from eagle3nb.engines.twin_check import twin_proof
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir, read_metrics
from eagle3nb.steps.extract.twin_gate import run_twin_check
from eagle3nb.target import models
from eagle3nb.target.capture import reference_states
from eagle3nb.target.capture import HFCaptureEngine
from eagle3nb.target.twin import build_twin, twin_ids

TARGET = models.resolve_model("stories260K-hd32")


def hf_at(convention: str):
    """A capture callable: HF transformers at ``convention``'s capture point (not an engine)."""

    def capture(model_path, samples, ids):
        model = models.load_target(model_path, "float32")[0]
        return [{"aux": c.aux} for c in HFCaptureEngine(model, convention).capture(samples, ids)]

    return capture


@pytest.fixture(scope="module")
def twin_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("twin") / "twin"


def test_hf_at_sglangs_capture_point_agrees_with_the_table(twin_dir):
    rec = twin_proof(hf_at("sglang"), "sglang", "0.5.23", TARGET, [0, 1, 3], "float32", twin_dir)
    assert rec["twin"]["n_layers"] == 5 and rec["twin_ids"] == [0, 1, 3]  # N <= 12: ids as given
    assert rec["measured"] == [1, 2, 4] == rec["table"] and rec["agrees"]
    assert rec["target_boundaries"] == [1, 2, 4] and rec["shift"] == [1, 1, 1]
    assert rec["separation"] >= 0.45  # adjacent boundaries of the twin lie far apart
    assert all(s["error"] < 1e-5 and s["next_error"] > 0.4 for s in rec["slots"])
    cfg = json.loads((twin_dir / "config.json").read_text())
    src = json.loads((TARGET / "config.json").read_text())
    assert cfg["head_dim"] == src["head_dim"] and cfg["num_hidden_layers"] == 5
    assert cfg["hidden_size"] != src["hidden_size"]  # a twin, not a copy
    # the named boundaries are the twin's own HF states, checked here by a second route
    model = models.load_target(twin_dir, "float32")[0]
    s = [1, 7, 9, 11, 13]
    ref = reference_states(model, s)
    aux = hf_at("sglang")(str(twin_dir), [s], [0, 1, 3])[0]["aux"]
    H = cfg["hidden_size"]
    for k, b in enumerate([1, 2, 4]):
        torch.testing.assert_close(aux[:, k * H : (k + 1) * H], ref[b], rtol=0, atol=1e-6)


def test_twin_is_reused_when_built_for_the_same_config(twin_dir):
    build_twin(TARGET, twin_dir, 5, 0)
    before = (twin_dir / "model.safetensors").stat().st_mtime_ns
    build_twin(TARGET, twin_dir, 5, 0)
    assert (twin_dir / "model.safetensors").stat().st_mtime_ns == before


def test_fake_engine_that_shifts_otherwise_disagrees(twin_dir):
    # fake: HF at vLLM's capture point (id = boundary), reported as SGLang 0.5.23 (id + 1)
    rec = twin_proof(hf_at("vllm"), "sglang", "0.5.23", TARGET, [0, 1, 3], "float32", twin_dir)
    assert rec["measured"] == [0, 1, 3] and rec["table"] == [1, 2, 4]
    assert not rec["agrees"] and rec["verdict"].startswith("disagrees")


class FakeClient:
    """A fake engine client: HF at vLLM's capture point that reports itself as SGLang 0.5.23."""

    def info(self):
        return {"engine_name": "sglang", "engine_version": "0.5.23"}

    def capture_model(self, model_path, samples, ids, options=None):
        return hf_at("vllm")(model_path, samples, ids)


def test_run_twin_check_enforce_stops_warn_records(tmp_path):
    p = RunParams(run_name="twin", outputs_dir=str(tmp_path))
    rd = RunDir(p)
    rd.root.mkdir(parents=True)
    with pytest.raises(
        ValueError,
        match=r"twin check of LlamaForCausalLM on sglang 0\.5\.23: disagrees: .*captured "
        r"boundaries \[0, 1, 3\].*engine_rules says \[1, 2, 4\].*set twin_check: warn",
    ):
        run_twin_check(p, rd, FakeClient(), [0, 1, 3], [1, 2, 4], TARGET)
    warn = p.model_copy(update={"twin_check": "warn"})
    with pytest.warns(UserWarning, match="twin_check: warn, continuing"):
        rec = run_twin_check(warn, rd, FakeClient(), [0, 1, 3], [1, 2, 4], TARGET)
    assert not rec["agrees"] and rec["target_boundaries"] == [0, 1, 3]
    assert not rec["run_boundaries_match"]
    stored = read_metrics(rd.metrics)["twin_check"]["sglang"]
    assert stored["measured"] == [0, 1, 3] and "error_matrix" not in stored
    off = p.model_copy(update={"twin_check": "off"})
    assert run_twin_check(off, rd, FakeClient(), [0, 1, 3], [1, 2, 4], TARGET) is None


def test_twin_ids_keep_what_the_rules_depend_on():
    assert twin_ids([1, 2, 3], 5, 5) == [1, 2, 3]
    # 61-layer DeepSeek onto 12: a first id of 1 stays 1, N-1 stays the last layer below N
    assert twin_ids([1, 30, 60], 61, 12) == [1, 6, 11]
    assert twin_ids([2, 30, 58, 61], 61, 12) == [2, 6, 10, 12]
    assert twin_ids([0, 2, 3], 40, 12) == [0, 2, 3]
    with pytest.raises(ValueError, match=r"do not fit the twin's 5 layers"):
        twin_ids([2, 3, 4, 5], 40, 5)


def test_alignment_figure_shows_the_twin_panel(twin_dir):
    from eagle3nb.viz.plots import alignment_figure

    rec = twin_proof(hf_at("sglang"), "sglang", "0.5.23", TARGET, [0, 1, 3], "float32", twin_dir)
    err = torch.tensor(rec["error_matrix"])
    fig = alignment_figure(err, rec["reference_boundaries"], [1, 2, 4], "sglang", twin=rec)
    assert len(fig.data) == 2
    titles = [a.text for a in fig.layout.annotations]
    assert any("measured [1, 2, 4], engine_rules [1, 2, 4]: agrees" in t for t in titles)
    assert list(fig.data[1].y) == [f"twin id {i} (table b={i + 1})" for i in (0, 1, 3)]
