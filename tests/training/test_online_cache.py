"""eagle3nb.training.online_cache through the engine-fed online source, without an engine: epochs
2+ read from the first-epoch cache train the same weights, bit for bit, as recapturing every
epoch; the cache holds its byte bound (samples past it recaptured every epoch, said in the
progress line); the folder is a dataset the offline reader opens, holding the captured states; the
re-check asks the engine the very call a cached sample came from; a resumed run reads the shards a
killed one wrote. Captures: the HF target one sample per call (batch-independent states, so
equality is exact); the real engines: tests/engines/test_online_engines.py."""

import dataclasses
import json

import pytest
import torch
from testkit import ONLINE_TEXTS, hf_online_source, same_weights, text_samples
from test_loop import StopAt

from eagle3nb.dataset.read import AuxDataset
from eagle3nb.target.capture import HFCaptureEngine
from eagle3nb.training.loop import TrainConfig, train_drafter
from eagle3nb.training.online_cache import FirstEpochCache, check_cache_space

IDS = [0, 1, 3]
# 7 samples in batches of 3: 3 steps per epoch, 9 steps = 3 epochs
CFG = TrainConfig(
    batch_size=3, max_steps=9, warmup_steps=2, ttt_steps=3, draft_vocab_size=128,
    draft_num_heads=0, draft_num_kv_heads=0, log_every=1, checkpoint_every=3,
)  # fmt: skip
N = len(ONLINE_TEXTS)


def _samples(tok):
    return text_samples(tok, ONLINE_TEXTS)


class Counting:
    """The HF target capturing one sample per call; counts the samples it was asked for."""

    def __init__(self, model):
        self.eng, self.samples = HFCaptureEngine(model, "sglang", batch_size=1), 0

    def __call__(self, xs):
        self.samples += len(xs)
        return self.eng.capture(xs, IDS)


@pytest.fixture(scope="module")
def recaptured(target, tmp_path_factory):
    """3 epochs, every epoch captured again (no cache)."""
    model, tok, _ = target
    s, cap = _samples(tok), Counting(target[0])
    src = hf_online_source(s, cap)
    d, rep = train_drafter(src, model, CFG, tmp_path_factory.mktemp("nocache"))
    assert cap.samples == 3 * N and src.cache is None
    return s, d, rep


def test_epochs_from_the_cache_equal_recapturing(target, recaptured, tmp_path):
    model = target[0]
    s, d_ref, r_ref = recaptured
    cap = Counting(model)
    src = hf_online_source(
        s, cap, cache_dir=tmp_path / "cache", cache_bytes=1 << 30, recheck_every=1,
        batches_log=tmp_path / "batches.jsonl",
    )  # fmt: skip
    d, rep = train_drafter(src, model, CFG, tmp_path / "train")
    src.close()  # as 03 does: the last, partial shard is written
    same_weights(d_ref, d)
    assert [h["loss"] for h in rep["history"]] == [h["loss"] for h in r_ref["history"]]
    # the engine captured the first epoch only (+ the re-checks' own calls, counted apart)
    asked_by_rechecks = sum(r["samples"] for r in src.rechecks)
    assert cap.samples - asked_by_rechecks == N
    assert all(r["max_abs_diff"] == 0.0 for r in src.rechecks) and len(src.rechecks) == 9
    st = src.stats()
    assert st["cache"]["samples_stored"] == N and st["cache"]["reads"] == 2 * N
    assert st["batches"]["from_cache_rows"] == 2 * N
    log = [json.loads(x) for x in (tmp_path / "batches.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(9)) and [r["cached"] for r in log[:3]] == [0] * 3
    # the folder is a dataset the offline reader opens, holding the engine's states of each sample
    ds = AuxDataset(tmp_path / "cache")
    man = ds.manifest
    assert (man["engine"]["name"], man["layer_ids"], man["aux_boundaries"]) == (
        "hf-one-by-one", IDS, [1, 2, 4],
    )  # fmt: skip
    assert man["dtype"] == "float32" and "template" in man and man["online_cache"]["full"] is False
    assert sorted(x["sample_id"] for x in ds) == list(range(N))
    ref = HFCaptureEngine(model, "sglang", batch_size=1)
    for x in ds:
        c = ref.capture([s[x["sample_id"]][1]], IDS)[0]
        assert torch.equal(x["aux"], c.aux) and torch.equal(x["final"], c.final)
    assert "cache " in (tmp_path / "train" / "train.log").read_text()


def test_bound_held_samples_past_it_recaptured(target, recaptured, tmp_path):
    """A bound of about half the first epoch: the shard files stay within it, the samples past
    it are captured in every epoch, the weights are still the recaptured run's."""
    model = target[0]
    s, d_ref, _ = recaptured
    # bytes of the whole first epoch, from a cache with room for everything
    big = hf_online_source(s, Counting(model), cache_dir=tmp_path / "big", cache_bytes=1 << 30)
    train_drafter(big, model, dataclasses.replace(CFG, max_steps=3), tmp_path / "b")
    big.close()
    whole = AuxDataset(tmp_path / "big").manifest["online_cache"]["bytes"]
    bound = whole // 2
    cap = Counting(model)
    src = hf_online_source(s, cap, cache_dir=tmp_path / "half", cache_bytes=bound)
    d, _ = train_drafter(src, model, CFG, tmp_path / "train")
    src.close()
    same_weights(d_ref, d)
    files = sorted((tmp_path / "half").glob("*.safetensors"))
    on_disk = sum(f.stat().st_size for f in files)
    st = src.stats()["cache"]
    assert st["full"] and 0 < st["samples_stored"] < N and on_disk == st["bytes"] <= bound
    past = N - st["samples_stored"]
    assert st["samples_recaptured_every_epoch"] == past
    assert cap.samples == N + 2 * past  # epochs 2 and 3 captured only those past the bound
    line = src.progress_status()
    assert f"bound reached: {past} recaptured every epoch" in line


def test_resume_reads_the_shards_a_stopped_run_wrote(target, recaptured, tmp_path):
    """Stopped in epoch 2 (last checkpoint: step 3), rerun: the shards of epoch 1 are read back
    (the engine is asked for nothing), the weights are the recaptured run's."""
    model = target[0]
    s, d_ref, r_ref = recaptured
    kw = dict(cache_dir=tmp_path / "cache", cache_bytes=1 << 30)
    src = hf_online_source(s, Counting(model), **kw)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(src, model, CFG, tmp_path / "r", progress=StopAt(5))
    src.close()  # 03 closes the source also when training raised
    cap = Counting(model)
    src = hf_online_source(s, cap, **kw)
    d, rep = train_drafter(src, model, CFG, tmp_path / "r")
    assert cap.samples == 0 and src.stats()["batches"]["first_step"] == 3
    same_weights(d_ref, d)
    assert rep["history"] == r_ref["history"]


def test_cache_changed_on_disk_is_filled_again(target, recaptured, tmp_path):
    model = target[0]
    s = recaptured[0]
    kw = dict(cache_dir=tmp_path / "cache", cache_bytes=1 << 30)
    src = hf_online_source(s, Counting(model), **kw)
    train_drafter(src, model, dataclasses.replace(CFG, max_steps=3), tmp_path / "a")
    src.close()
    shard = sorted((tmp_path / "cache").glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
    said = []
    c = FirstEpochCache(tmp_path / "cache", src.manifest, 1 << 30, log=said.append)
    assert not c.index and "fail their sha256" in said[0]
    assert not list((tmp_path / "cache").iterdir())


def test_cache_bound_over_the_free_disk_refused(tmp_path):
    with pytest.raises(ValueError, match=r"online_cache_gib=1e\+06: .* lower online_cache_gib"):
        check_cache_space(tmp_path / "cache", 10**6 * (1 << 30))
