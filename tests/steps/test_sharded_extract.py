"""Sharded extraction: N worker processes, one manifest; a lost worker's slice redone on rerun."""

import json
import os
import shutil
import signal
import time

import pytest
import torch

from eagle3nb.steps.extract import sharded as extract
from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.rundir import RunDir
from eagle3nb.params import RunParams


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs")
    # engine hf: sharded extraction workers each load an HF engine (SGLang with workers > 1 is refused)
    p = RunParams(
        outputs_dir=str(out),
        run_name="one",
        max_train_prompts=20,
        max_new_tokens=24,
        shard_size=1,
        interactive=False,
        extract_engine="hf",
    )
    generate_step(p, progress=False)
    return p


def _copy_run(p, name):
    q = p.model_copy(update={"run_name": name})
    shutil.copytree(RunDir(p).root / "data", RunDir(q).root / "data")
    return q


@pytest.mark.slow  # over 20 s on a 2-core box (2026-12-04)
def test_two_workers_equal_one_and_lost_worker_redone(generated, monkeypatch):
    r1 = extract_sglang_step(generated, progress=False)
    one = r1["manifest"]
    written = sum(f.stat().st_size for f in RunDir(generated).dataset.glob("shard-*.safetensors"))
    assert r1["stats"]["disk"]["shard_bytes"] == written  # the estimate shown before capture, exact
    sp = r1["stats"]["capture_speed"]
    assert sp["measured_on_tokens"] == sum(
        len(x[1]) for x in extract.train_samples(RunDir(generated))[:128]
    )
    assert sp["capture_overhead_ratio"] == pytest.approx(
        sp["plain_forward_tokens_per_s"] / sp["capture_tokens_per_s"], rel=2e-3
    )
    over = sp["capture_overhead"]  # per alternated repeat, with its verdict (eagle3nb/timing.py)
    assert over["rounds"] == sp["repeats"] == 3 and over["low"] <= over["median"] <= over["high"]
    assert over["verdict"] in ("measured", "disturbed") and over["text"]
    p2 = _copy_run(generated, "two").model_copy(update={"extract_workers": 2})
    rd2 = RunDir(p2)
    real_launch = extract.launch_workers
    killed = {}

    def launch_then_kill_worker_1(plan_file, workers):
        procs = real_launch(plan_file, workers)
        rec = rd2.dataset / "workers" / "worker-00001.json"
        deadline = time.time() + 120
        while time.time() < deadline and not (
            rec.exists() and json.loads(rec.read_text())["shards"]
        ):
            time.sleep(0.002)
        os.kill(procs[1].pid, signal.SIGKILL)  # lost mid-slice
        procs[1].wait()
        killed["done"] = len(json.loads(rec.read_text())["shards"])
        return procs

    monkeypatch.setattr(extract, "launch_workers", launch_then_kill_worker_1)
    with pytest.raises(
        RuntimeError,
        match=r"missing .* from worker\(s\) \[1\] of 2.*worker 1 exit code -9 \(killed\)",
    ):
        extract_sglang_step(p2, progress=False)
    n_shards = len(one["shards"])
    assert 1 <= killed["done"] < n_shards // 2  # the kill really cut worker 1's slice short
    m = json.loads((rd2.dataset / "manifest.json").read_text())
    assert not m["complete"] and len(m["shards"]) == n_shards // 2 + killed["done"]
    with pytest.raises(ValueError, match="incomplete"):
        AuxDataset(rd2.dataset)
    before = {f.name: f.stat().st_mtime_ns for f in rd2.dataset.glob("shard-*.safetensors")}

    monkeypatch.setattr(extract, "launch_workers", real_launch)
    two = extract_sglang_step(p2, progress=False)["manifest"]
    after = {f.name: f.stat().st_mtime_ns for f in rd2.dataset.glob("shard-*.safetensors")}
    assert all(after[k] == v for k, v in before.items())  # finished shards were not rewritten
    assert not (rd2.dataset / "workers").exists() and not list(rd2.dataset.glob("*.tmp"))
    ds1, ds2 = AuxDataset(RunDir(generated).dataset), AuxDataset(rd2.dataset)
    ids2 = [x["sample_id"] for x in ds2]
    assert (
        len(ids2) == len(set(ids2)) == two["n_samples"] == one["n_samples"]
    )  # no duplicate, none lost
    assert ids2 == [x["sample_id"] for x in ds1]
    for a, b in zip(ds1, ds2):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(
            a["loss_mask"], b["loss_mask"]
        )
        # same samples per forward (shard_size 1) but another thread count: float32 noise at most
        torch.testing.assert_close(a["aux"], b["aux"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a["final"], b["final"], rtol=1e-5, atol=1e-5)
    assert [s["file"] for s in two["shards"]] == [s["file"] for s in one["shards"]]
    assert two["n_tokens"] == one["n_tokens"] and two["skipped"] == one["skipped"]
