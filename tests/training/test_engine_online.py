"""eagle3nb.training.engine_online and transport, without an engine: the source fed by a capture
callable trains what the offline loader trains on a dataset of the same captures, the prefetch
queue stays within its bytes, a dead capture is restarted once, the re-check catches a changed
batch, resume equals an uninterrupted run. The captures here come from the HF target (one sample
per call, so a batch's states do not depend on its neighbours); the real engines:
tests/engines/test_online_engines.py."""

import json
import re
import threading
import time

import pytest
import torch
from testkit import ONLINE_TEXTS, TINY_MANIFEST, hf_online_source, same_weights, text_samples
from test_loop import StopAt

from eagle3nb.dataset.read import AuxDataset
from eagle3nb.dataset.write import write_dataset
from eagle3nb.target.capture import HFCaptureEngine
from eagle3nb.training.engine_online import RecheckError
from eagle3nb.training.loop import TrainConfig, train_drafter
from eagle3nb.training.transport import ByteBoundedQueue, batch_nbytes

IDS = [0, 1, 3]
CFG = TrainConfig(
    batch_size=3, max_steps=8, warmup_steps=2, ttt_steps=3, draft_vocab_size=128,
    draft_num_heads=0, draft_num_kv_heads=0, log_every=1, checkpoint_every=3,
)  # fmt: skip


class EngineDied(RuntimeError):
    """Stands for eagle3nb.engines.client.EngineError in these tests."""


def _samples(tok):
    return text_samples(tok, ONLINE_TEXTS)


def _one_by_one(model):
    eng = HFCaptureEngine(model, "sglang", batch_size=1)
    return lambda xs: eng.capture(xs, IDS)


def _trains_as_offline(src, model, d_off, out):
    """Train on ``src`` into ``out``: the drafter's weights are ``d_off``'s (the offline run's),
    exactly, tensor by tensor. Returns the training report."""
    d_on, rep = train_drafter(src, model, CFG, out)
    same_weights(d_off, d_on)
    return rep


@pytest.fixture(scope="module")
def offline(target, tmp_path_factory):
    model, tok, _ = target
    s = _samples(tok)
    d = tmp_path_factory.mktemp("off")
    write_dataset(d / "ds", s, _one_by_one(model), TINY_MANIFEST, shard_size=3)
    drafter, rep = train_drafter(AuxDataset(d / "ds"), model, CFG, d / "train")
    return s, drafter, rep


def test_streamed_training_equals_offline_bit_for_bit(target, offline, tmp_path):
    """Same captures, same batch plan: the same weights, exactly; the progress line names the
    queue; re-checks (every 2 steps) found the streamed batches equal to a fresh capture."""
    model = target[0]
    s, d_off, r_off = offline
    src = hf_online_source(s, _one_by_one(model), recheck_every=2)
    r_on = _trains_as_offline(src, model, d_off, tmp_path / "on")
    assert [h["loss"] for h in r_on["history"]] == [h["loss"] for h in r_off["history"]]
    assert [r["step"] for r in src.rechecks] == [1, 3, 5, 7]
    assert all(r["max_abs_diff"] == 0.0 for r in src.rechecks)
    log = (tmp_path / "on" / "train.log").read_text()
    assert "capture waiting" in log and "trainer waiting" in log and "queue" in log
    st = src.stats()["transport"]
    assert st["batches_put"] == CFG.max_steps and st["max_bytes"] <= st["capacity_bytes"]


def test_three_build_threads_give_the_same_batches_in_step_order(target, offline, tmp_path):
    """Batches built on 3 threads (as on CUDA) reach the trainer in step order: the same
    weights as offline, exactly; the stats count every batch once."""
    model = target[0]
    s, d_off, _ = offline
    src = hf_online_source(s, _one_by_one(model), build_threads=3)
    _trains_as_offline(src, model, d_off, tmp_path / "on3")
    assert src.stats()["transport"]["batches_put"] == CFG.max_steps


def test_queue_holds_the_engine_back_within_its_bytes():
    """A producer faster than the consumer: the queue never holds more than its capacity (each
    batch smaller than it), the producer's wait is counted; then the other way round."""
    one = {"aux": torch.zeros(1000)}  # 4000 bytes
    q = ByteBoundedQueue(3 * batch_nbytes(one))
    seen = []

    def produce():
        for _ in range(10):
            q.put(dict(one))
            seen.append(q.stats()["bytes"])
        q.close()

    th = threading.Thread(target=produce)
    th.start()
    got = 0
    while q.get() is not None:
        got += 1
        time.sleep(0.02)
    th.join()
    st = q.stats()
    assert got == 10 and max(seen) <= 12000 and st["max_bytes"] == 12000 and st["max_depth"] == 3
    assert st["capture_wait_seconds"] > 0.05
    q2 = ByteBoundedQueue(10)  # a batch larger than the capacity still passes, alone
    th = threading.Thread(target=lambda: (time.sleep(0.1), q2.put(dict(one)), q2.close()))
    th.start()
    assert q2.get() is not None and q2.get() is None
    th.join()
    assert q2.stats()["trainer_wait_seconds"] > 0.05 and q2.stats()["max_depth"] == 1


def test_dead_engine_restarted_once_then_the_run_stops_naming_the_sample(target, offline, tmp_path):
    model = target[0]
    s, d_off, _ = offline
    cap, calls, restarts = _one_by_one(model), [0], []

    def dies_at_third_call(xs):
        calls[0] += 1
        if calls[0] == 3:
            raise EngineDied("fake death")
        return cap(xs)

    src = hf_online_source(
        s, dies_at_third_call, restart=lambda: restarts.append(1), restartable=(EngineDied,)
    )
    _trains_as_offline(src, model, d_off, tmp_path / "a")
    assert restarts == [1] and src.restarts[0]["step"] == 2  # the same batch captured again

    def always_dies(xs):
        raise EngineDied("fake death")

    src = hf_online_source(s, always_dies, restart=lambda: None, restartable=(EngineDied,))
    want = [s[i][0] for i in sorted(src.configure(3).plan.global_batch_at(0), key=lambda i: (-len(s[i][1]), i))]  # fmt: skip
    with pytest.raises(
        RuntimeError, match=re.escape(f"step 0, sample ids {want} after its one restart")
    ):
        train_drafter(src, model, CFG, tmp_path / "b")


def test_recheck_catches_a_changed_batch(target, offline, tmp_path):
    model = target[0]
    s = offline[0]

    class Corrupting(ByteBoundedQueue):  # changes one value on the way (what the check is for)
        def get(self):
            b = super().get()
            if b is not None:
                b["aux"][0, 0, 0] += 1e-6
            return b

    src = hf_online_source(s, _one_by_one(model), recheck_every=1, transport=Corrupting)
    with pytest.raises(RecheckError, match="re-check at step 0: streamed aux of sample id"):
        train_drafter(src, model, CFG, tmp_path / "c")


def test_resume_after_interruption_equals_uninterrupted(target, offline, tmp_path):
    """Stopped after step 5 (last checkpoint: step 3), rerun: the same weights and history as
    the uninterrupted run, and the capture restarted at step 3's batch."""
    model = target[0]
    s, d_off, r_off = offline
    src = hf_online_source(s, _one_by_one(model))
    with pytest.raises(KeyboardInterrupt):
        train_drafter(src, model, CFG, tmp_path / "r", progress=StopAt(5))
    assert json.loads((tmp_path / "r" / "checkpoints" / "latest.json").read_text())["step"] == 3
    src = hf_online_source(s, _one_by_one(model))
    r_res = _trains_as_offline(src, model, d_off, tmp_path / "r")
    assert src.stats()["transport"]["batches_put"] == CFG.max_steps - 3
    assert r_res["history"] == r_off["history"]


def test_final_from_hf_rechecked_within_its_tolerance(target, offline, tmp_path):
    """final_tol (SGLang: boundary N from HF in this process) lets a 1e-6 change of final pass
    and still stops at one of 1e-2; aux stays bit-exact."""
    model = target[0]
    s = offline[0]

    def nudging(delta):
        class Nudge(ByteBoundedQueue):
            def get(self):
                b = super().get()
                if b is not None:
                    b["final"][0, 0, 0] += delta
                return b

        return Nudge

    src = hf_online_source(
        s, _one_by_one(model), recheck_every=4, transport=nudging(1e-6), final_tol=1e-4
    )
    train_drafter(src, model, CFG, tmp_path / "ok")
    assert [r["step"] for r in src.rechecks] == [3, 7] and 0 < src.rechecks[0][
        "max_abs_diff"
    ] < 1e-4
    src = hf_online_source(
        s, _one_by_one(model), recheck_every=1, transport=nudging(1e-2), final_tol=1e-4
    )
    with pytest.raises(RecheckError, match="streamed final .* tolerance 0.0001"):
        train_drafter(src, model, CFG, tmp_path / "bad")


def test_pin_memory_pins_every_tensor_of_each_batch(target, offline, monkeypatch):
    """On CUDA the loop asks for pinned batches (as from the offline loader): each tensor the
    capture thread puts goes through ``Tensor.pin_memory`` (stood in here: this torch has no
    CUDA), values unchanged; without the flag none does."""
    model = target[0]
    s = offline[0]
    pinned = []

    def fake_pin(self):
        pinned.append(self.data_ptr())
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    src = hf_online_source(s, _one_by_one(model)).configure(CFG.batch_size, CFG.seed)
    got = list(src.batches(0, 2, pin_memory=True))
    assert len(pinned) == 2 * len(got[0]) and len(got) == 2  # every tensor of both batches
    ref = hf_online_source(s, _one_by_one(model)).configure(CFG.batch_size, CFG.seed)
    plain = list(ref.batches(0, 2, pin_memory=False))
    for a, b in zip(got, plain):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len(pinned) == 2 * len(got[0])  # the unpinned run called it never
