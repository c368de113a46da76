"""The twin-proof cache (eagle3nb.engines.twin_cache, twin_proof's ``cache``) without a real engine:
a fake engine (HF at SGLang's capture point, reported as SGLang 0.5.23) counts its captures. The
first proof measures (issue 11: no cached proof, still measured) and writes the cache; a second
with the same key does not call the engine and returns the same record, marked as read from the
cache with when and at which commit it was measured; any change of the key measures afresh. A fake
client through run_twin_check is never cached (it would poison the real engines' entries)."""

import datetime
import json

import pytest

from eagle3nb.engines import twin_cache
from eagle3nb.engines.twin_check import twin_proof
from eagle3nb.manifest import git_commit
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir, read_metrics
from eagle3nb.steps.extract.twin_gate import run_twin_check
from eagle3nb.target import models
from eagle3nb.target.capture import HFCaptureEngine

TARGET = models.resolve_model("stories260K-hd32")


class FakeCountingCapture:
    """A fake engine capture: HF at ``convention``'s capture point, counting its calls."""

    def __init__(self, convention: str = "sglang"):
        self.convention, self.calls = convention, 0

    def __call__(self, model_path, samples, ids):
        self.calls += 1
        model = models.load_target(model_path, "float32")[0]
        caps = HFCaptureEngine(model, self.convention).capture(samples, ids)
        return [{"aux": c.aux} for c in caps]


def _proof(
    fake, twin_dir, cache, version="0.5.23", ids=(0, 1, 3), dtype="float32", seed=0, extra=None
):
    return twin_proof(
        fake, "sglang", version, TARGET, list(ids), dtype, twin_dir, seed, cache, extra
    )


def _without_run_facts(rec):
    return {k: v for k, v in rec.items() if k not in ("seconds", "cache")}


def test_same_key_reads_the_cache_without_starting_the_engine(tmp_path):
    fake, cache = FakeCountingCapture(), tmp_path / "proofs"
    first = _proof(fake, tmp_path / "twin", cache)
    assert fake.calls == 1 and first["agrees"] and first["measured"] == [1, 2, 4]
    assert first["cache"]["hit"] is False  # measured, then written
    files = list(cache.glob("*.json"))
    assert [f.name for f in files] == [first["cache"]["key_sha256"] + ".json"]
    entry = json.loads(files[0].read_text())
    assert entry["key"]["engine"] == "sglang" and entry["key"]["twin_ids"] == [0, 1, 3]
    second = _proof(fake, tmp_path / "twin", cache)
    assert fake.calls == 1  # the engine was not asked again
    assert second["cache"]["hit"] is True and second["seconds"]["capture"] == 0
    assert second["cache"]["key_sha256"] == first["cache"]["key_sha256"]
    assert _without_run_facts(second) == _without_run_facts(first)
    assert second["cache"]["measured_commit"] == git_commit()
    when = datetime.datetime.fromisoformat(second["cache"]["measured_at"])
    assert abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) < 3600
    # another run's twin (built afresh in its own folder, same bytes) reads the same entry
    third = _proof(fake, tmp_path / "other_run" / "twin", cache)
    assert fake.calls == 1 and third["cache"]["hit"] is True
    assert third["twin"]["path"] == str(tmp_path / "other_run" / "twin")
    # without a cache folder every proof measures
    _proof(fake, tmp_path / "twin", None)
    assert fake.calls == 2


@pytest.mark.parametrize(
    "change",
    [
        {"version": "0.5.23+cpu"},  # another engine build (the table ignores the suffix)
        {"ids": (0, 2, 3)},
        {"dtype": "bfloat16"},
        {"seed": 1},  # another twin: other weights
        {"extra": {"torch_version": "2.9.9"}},
    ],
    ids=lambda c: next(iter(c)),
)
def test_any_key_change_measures_afresh(tmp_path, change):
    fake, cache = FakeCountingCapture(), tmp_path / "proofs"
    base = _proof(fake, tmp_path / "twin", cache)
    other = _proof(fake, tmp_path / "twin", cache, **change)
    assert fake.calls == 2 and other["cache"]["hit"] is False
    assert other["cache"]["key_sha256"] != base["cache"]["key_sha256"]
    assert len(list(cache.glob("*.json"))) == 2


def test_other_twin_config_or_a_stale_entry_misses(tmp_path):
    fake, cache = FakeCountingCapture(), tmp_path / "proofs"
    base = _proof(fake, tmp_path / "twin", cache)
    tdir = tmp_path / "twin"
    args = (
        "sglang",
        "0.5.23",
        "LlamaForCausalLM",
        tdir,
        [0, 1, 3],
        [0, 1, 3],
        [[1, 5]],
        "float32",
        1e-5,
        0,
    )
    fields = twin_cache.key_fields(*args)
    cfg = json.loads((tdir / "config.json").read_text())
    (tdir / "config.json").write_text(json.dumps(dict(cfg, rms_norm_eps=1e-3)))
    assert twin_cache.key_digest(twin_cache.key_fields(*args)) != twin_cache.key_digest(fields)
    (tdir / "config.json").write_text(json.dumps(cfg))
    # an entry whose stored key is not the key it is filed under is not trusted
    path = cache / (base["cache"]["key_sha256"] + ".json")
    entry = json.loads(path.read_text())
    entry["key"]["version"] = "0.0.0"
    path.write_text(json.dumps(entry))
    again = _proof(fake, tdir, cache)
    assert fake.calls == 2 and again["cache"]["hit"] is False
    path.write_text("{not json")
    assert twin_cache.load(cache, json.loads(json.dumps(entry["key"]))) is None


def test_cache_dir_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE3NB_TWIN_PROOFS", "off")
    assert twin_cache.cache_dir() is None
    monkeypatch.setenv("EAGLE3NB_TWIN_PROOFS", str(tmp_path / "p"))
    assert twin_cache.cache_dir() == tmp_path / "p"
    monkeypatch.delenv("EAGLE3NB_TWIN_PROOFS")
    monkeypatch.setenv("EAGLE3NB_CACHE", str(tmp_path / "c"))
    assert twin_cache.cache_dir() == tmp_path / "c" / "twin_proofs"


class FakeClient:
    """A fake engine client (not an EngineClient): HF at SGLang's capture point, as SGLang."""

    def info(self):
        return {"engine_name": "sglang", "engine_version": "0.5.23"}

    def capture_model(self, model_path, samples, ids, options=None):
        return FakeCountingCapture()(model_path, samples, ids)


def test_a_fake_client_is_never_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE3NB_TWIN_PROOFS", str(tmp_path / "proofs"))
    p = RunParams(run_name="twin", outputs_dir=str(tmp_path))
    rd = RunDir(p)
    rd.root.mkdir(parents=True)
    rec = run_twin_check(p, rd, FakeClient(), [0, 1, 3], [1, 2, 4], TARGET)
    assert rec["agrees"] and rec["cache"] is None
    assert not (tmp_path / "proofs").exists()
    assert read_metrics(rd.metrics)["twin_check"]["sglang"]["cache"] is None


def test_alignment_figure_says_the_proof_was_cached(tmp_path):
    import torch

    from eagle3nb.viz.plots import alignment_figure

    fake, cache = FakeCountingCapture(), tmp_path / "proofs"
    _proof(fake, tmp_path / "twin", cache)
    rec = _proof(fake, tmp_path / "twin", cache)
    err = torch.tensor(rec["error_matrix"])
    fig = alignment_figure(err, rec["reference_boundaries"], [1, 2, 4], "sglang", twin=rec)
    titles = " ".join(a.text for a in fig.layout.annotations)
    assert f"cached proof, measured {rec['cache']['measured_at']}" in titles
    assert git_commit()[:12] in titles
