"""Data integrity: kill -9 during extraction, disk full, corrupted bytes (see also test_dataset)."""

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import eagle3nb.dataset.write as dsmod
from eagle3nb.target.capture import Captured
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.dataset.write import DiskFullError, write_dataset

MAN = {
    "target": {"name": "fake"},
    "engine": {"name": "fake-engine-for-tests"},
    "convention": "sglang",
    "layer_ids": [0],
    "aux_boundaries": [1],
    "final_boundary": 2,
    "dtype": "float32",
    "template": {"mode": "completion"},
}
SAMPLES = [(i, list(range(1, 4 + i % 5)), [0] + [1] * (2 + i % 5)) for i in range(12)]


def fake_engine_capture(xs):
    """A fake engine (tests only): states are a function of the token ids, so any rerun agrees."""
    return [
        Captured(
            aux=torch.tensor(x, dtype=torch.float32)[:, None].repeat(1, 2),
            final=torch.tensor(x, dtype=torch.float32)[:, None].repeat(1, 2) * -1,
        )
        for x in xs
    ]


CHILD = textwrap.dedent(
    """
    import sys, time, json
    sys.path.insert(0, {tests!r})
    from test_integrity import SAMPLES, MAN, fake_engine_capture
    from eagle3nb.dataset.write import write_dataset
    def slow(xs):
        time.sleep(0.4)
        return fake_engine_capture(xs)
    write_dataset({out!r}, SAMPLES, slow, MAN, shard_size=2)
    """
)


def test_kill_9_mid_extraction_loses_nothing_and_rerun_has_no_duplicates(tmp_path):
    out = tmp_path / "ds"
    code = CHILD.format(tests=os.path.dirname(__file__), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code])
    man = out / "manifest.json"
    deadline = time.time() + 60
    while time.time() < deadline:
        if man.exists() and len(json.loads(man.read_text())["shards"]) >= 2:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    m = json.loads(man.read_text())
    assert not m["complete"] and 2 <= len(m["shards"]) < 6
    with pytest.raises(ValueError, match="incomplete"):
        AuxDataset(out)  # a later step never reads a half-finished dataset
    listed = {s["file"] for s in m["shards"]}
    calls = []
    write_dataset(
        out, SAMPLES, lambda xs: calls.append(1) or fake_engine_capture(xs), MAN, shard_size=2
    )
    assert len(calls) == 6 - len(listed)  # finished shards were skipped
    assert not list(out.glob("*.tmp"))
    ds = AuxDataset(out)
    assert sorted(x["sample_id"] for x in ds) == list(range(12))  # no duplicates, none lost
    ref = fake_engine_capture([s[1] for s in SAMPLES])
    for x in ds:
        assert torch.equal(x["aux"], ref[x["sample_id"]].aux)


def test_disk_full_gives_clear_error_and_keeps_earlier_shards(tmp_path, monkeypatch):
    real = dsmod.write_safetensors
    n = {"calls": 0}

    def write_then_disk_full(tensors, path, metadata=None):
        n["calls"] += 1
        if n["calls"] == 3:
            with open(path, "wb") as f:
                f.write(b"partial")  # what a full disk leaves behind
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, path, metadata)

    monkeypatch.setattr(dsmod, "write_safetensors", write_then_disk_full)
    out = tmp_path / "ds"
    with pytest.raises(DiskFullError, match="disk full while writing shard-00002.safetensors"):
        write_dataset(out, SAMPLES, fake_engine_capture, MAN, shard_size=2)
    m = json.loads((out / "manifest.json").read_text())
    assert [s["file"] for s in m["shards"]] == [
        "shard-00000.safetensors",
        "shard-00001.safetensors",
    ] and not m["complete"]
    assert not (out / "shard-00002.safetensors").exists() and not list(out.glob("*.tmp"))
    monkeypatch.setattr(dsmod, "write_safetensors", real)
    write_dataset(out, SAMPLES, fake_engine_capture, MAN, shard_size=2)  # space freed: resume
    assert len(AuxDataset(out)) == 12


def test_wrong_row_count_from_engine_is_an_error(tmp_path):
    def fake_engine_dropping_rows(
        xs,
    ):  # a fake engine (tests only) returning another request's rows
        return [
            Captured(aux=torch.zeros(len(x) - 1, 2), final=torch.zeros(len(x) - 1, 2)) for x in xs
        ]

    with pytest.raises(RuntimeError, match="rows for sample"):
        write_dataset(tmp_path / "ds", SAMPLES, fake_engine_dropping_rows, MAN, shard_size=4)


def test_engine_error_while_a_shard_is_written_keeps_that_shard(tmp_path, monkeypatch):
    """The third capture fails while shard 1 is on the writer thread: shard 1 must still be
    recorded in the manifest (it is complete on disk), and a rerun captures only shards 2..5."""
    real, calls = dsmod.write_safetensors, []

    def slow_write(tensors, path, metadata=None):  # the write still running when capture fails
        time.sleep(0.3)
        return real(tensors, path, metadata)

    def fake_engine_failing_third(xs):
        calls.append(len(calls))
        if len(calls) == 3:
            raise RuntimeError("engine died")
        return fake_engine_capture(xs)

    monkeypatch.setattr(dsmod, "write_safetensors", slow_write)
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError, match="engine died"):
        write_dataset(out, SAMPLES, fake_engine_failing_third, MAN, shard_size=2)
    m = json.loads((out / "manifest.json").read_text())
    assert [s["file"] for s in m["shards"]] == [
        "shard-00000.safetensors",
        "shard-00001.safetensors",
    ]
    for s in m["shards"]:
        assert s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()
    again = []
    write_dataset(out, SAMPLES, lambda xs: again.append(1) or fake_engine_capture(xs), MAN, 2)
    assert len(again) == 4  # only shards 2..5 of 6
    ds = AuxDataset(out)
    ref = fake_engine_capture([s[1] for s in SAMPLES])
    assert sorted(x["sample_id"] for x in ds) == list(range(12))
    for x in ds:
        assert torch.equal(x["aux"], ref[x["sample_id"]].aux)
