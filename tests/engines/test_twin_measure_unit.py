"""Measuring a rule without a real engine (eagle3nb.engines.twin_measure): a twin of the embedded
default target (5 layers) captured by fakes standing in for an engine of a version no file holds.

- HF transformers at SGLang's capture point (id L = boundary L+1, boundary N refused: HF has no
  capture point past layer N-1 there), reported as "sglang 0.9.9": measured plus1, boundaries
  1..N-1, SGLang 0.5.23's Llama row (read in sglang/srt/models/llama.py:929-941);
- a fake engine returning noise: no slot can be named, refused with the measured matrix;
- 02's twin gate with a fake client of an unknown version measures first and records the rule as
  measured (a fake's rule is never kept per user).
The real engines: tests/engines/test_measured_rules.py."""

import pytest
import torch

from eagle3nb.boundaries.rules import RULES, _MEASURED
from eagle3nb.engines.twin_measure import measure_rule
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir, read_metrics
from eagle3nb.steps.extract.twin_gate import run_twin_check
from eagle3nb.target import models
from eagle3nb.target.capture import HFCaptureEngine

TARGET = models.resolve_model("stories260K-hd32")


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3NB_MEASURED_RULES", str(tmp_path / "kept"))
    _MEASURED.clear()
    yield
    _MEASURED.clear()


def hf_at_sglang(model_path, samples, ids):
    """Not an engine: HF at SGLang's capture point (raises for ids past its range)."""
    model = models.load_target(model_path, "float32")[0]
    return [{"aux": c.aux} for c in HFCaptureEngine(model, "sglang").capture(samples, ids)]


def fake_noise_engine(model_path, samples, ids):
    """A fake engine: random states of the right shape, equal to no boundary."""
    h = models.text_config(models.read_model_config(model_path))["hidden_size"]
    g = torch.Generator().manual_seed(0)
    return [{"aux": torch.randn(len(s), len(ids) * h, generator=g)} for s in samples]


def test_hf_at_sglangs_capture_point_measures_sglangs_llama_row(tmp_path):
    rule = measure_rule(
        hf_at_sglang, "sglang", "0.9.9", TARGET, [0, 1, 3], "float32", tmp_path / "twin"
    )
    row = RULES[("sglang", "0.5.23", "LlamaForCausalLM")]
    assert (
        (rule.kind, rule.lo, rule.hi_below_n)
        == (row.kind, row.lo, row.hi_below_n)
        == (
            "plus1",
            1,
            1,
        )
    )
    probes = rule.measured["probes"]  # 5-layer twin: plan [0,2,3] [1,2,3] [0,2,5] [4,5] [0,1,3]
    assert [p["ids"] for p in probes] == [[0, 2, 3], [1, 2, 3], [0, 2, 5], [4, 5], [0, 1, 3]]
    assert probes[0]["boundaries"] == [1, 3, 4] and probes[4]["boundaries"] == [1, 2, 4]
    assert probes[2].get("error") and probes[3].get("error")  # boundary N: refused, recorded
    assert rule.source == "measured on a 5-layer twin (cpu, float32)"
    assert rule.measured["eagle3nb_commit"] and rule.measured["date"]


def test_an_unnameable_twin_is_refused_with_the_matrix(tmp_path):
    with pytest.raises(
        ValueError, match=r"cannot all be named[\s\S]*ids \[0, 2, 3\] -> boundaries \[\?, \?, \?\]"
    ):
        measure_rule(
            fake_noise_engine, "vllm", "0.99.0", TARGET, [1, 2, 4], "float32", tmp_path / "twin"
        )
    assert not _MEASURED  # nothing registered


class FakeUnknownSGLang:
    """A fake engine client: HF at SGLang's capture point, reporting SGLang 0.9.9 (no file)."""

    def info(self):
        return {"engine_name": "sglang", "engine_version": "0.9.9"}

    def capture_model(self, model_path, samples, ids, options=None):
        return hf_at_sglang(model_path, samples, ids)


def test_twin_gate_measures_an_unknown_version_first(tmp_path):
    p = RunParams(run_name="twin", outputs_dir=str(tmp_path), twin_check="enforce")
    rd = RunDir(p)
    rd.root.mkdir(parents=True)
    rec = run_twin_check(p, rd, FakeUnknownSGLang(), [0, 1, 3], [1, 2, 4], TARGET)
    assert rec["agrees"] and rec["target_boundaries"] == [1, 2, 4]
    assert rec["rule_known_by"] == "measured" and rec["rule_measured_now"]
    assert rec["engine_rule"]["kind"] == "plus1" and rec["engine_rule"]["measured"]["probes"]
    stored = read_metrics(rd.metrics)["twin_check"]["sglang"]
    assert stored["engine_rule"]["known_by"] == "measured"
    assert not (tmp_path / "kept").exists()  # a fake's measurement is never kept per user


class FakeVllmOnCuda:
    """A fake engine client reporting vLLM 0.9.9 on CUDA (no file holds it): HF at vLLM's capture
    point (id L = boundary L), except that with CUDA graphs off (``enforce_eager`` not False) id
    0's slot holds boundary N, as vLLM 0.26.0 measured on an H200 (eagle3nb.engines.vllm_eager).
    It records the options of every capture."""

    def __init__(self):
        self.options = []

    def info(self):
        return {"engine_name": "vllm", "engine_version": "0.9.9", "device": "cuda"}

    def capture_model(self, model_path, samples, ids, options=None):
        self.options.append(dict(options or {}))
        model = models.load_target(model_path, "float32")[0]
        n = models.text_config(models.read_model_config(model_path))["num_hidden_layers"]
        eager = (options or {}).get("enforce_eager", True)
        real = [n if (eager and i == 0) else i for i in ids]
        h = models.text_config(models.read_model_config(model_path))["hidden_size"]
        every = HFCaptureEngine(model, "vllm").capture(samples, list(range(n + 1)))  # 0..N
        return [
            {"aux": torch.cat([c.aux[:, b * h : (b + 1) * h] for b in real], -1)} for c in every
        ]


def test_vllm_on_cuda_is_measured_with_cuda_graphs_on(tmp_path):
    """The measurement on CUDA turns CUDA graphs on (an eager engine names no rule: id 0 ->
    boundary N), records that in the rule's record, and an eager capture of the same fake is
    refused with the matrix (what the run got before: every probe set holding id 0)."""
    from eagle3nb.engines.twin_measure import rule_for_run

    fake = FakeVllmOnCuda()
    got = rule_for_run(fake, TARGET, [1, 2, 4], "float32", tmp_path / "twin", keep=False)
    rule = got["rule"]
    assert got["measured_now"] and (rule.kind, rule.lo, rule.hi_below_n) == ("same", 0, 0)
    assert {o.get("enforce_eager") for o in fake.options} == {False}
    assert rule.measured["capture_options"]["enforce_eager"] is False
    assert rule.measured["device"] == "cuda"
    _MEASURED.clear()
    eager = FakeVllmOnCuda()
    with pytest.raises(ValueError, match=r"ids \[0, 2, 3\] came back as boundaries \[5, 2, 3\]"):
        measure_rule(
            lambda m, s, i: eager.capture_model(m, s, i, {}), "vllm", "0.9.9", TARGET,
            [1, 2, 4], "float32", tmp_path / "twin2", device="cuda", keep=False,
        )  # fmt: skip
