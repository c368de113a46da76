"""The engine pool (eagle3nb.engines.pool) with the FAKE backend (tests/engines/fake) in worker
subprocesses of this python: a worker is kept and handed back only for the same key, the idle ones
are bounded, a dead one or a model written again starts a new one, and 0 keeps none.
Real engines share it in tests/engines/test_engine_vllm.py and the steps (start_vllm, start_sglang)."""

import json
import os
import sys

import pytest

from eagle3nb.engines import pool
from eagle3nb.engines.worker import folder_stamp
from testkit import FAKE_BACKEND, FAKE_ENGINE_ENV


@pytest.fixture
def keep(monkeypatch):
    """A pool of its own (the session's kept workers are set aside and put back after)."""
    saved = dict(pool._POOL)
    pool._POOL.clear()

    def set_keep(n):
        monkeypatch.setenv(pool.KEEP_ENV, str(n))

    yield set_keep
    pool.stop_all()
    pool._POOL.update(saved)


def _open(model, dtype="float32", **opts):
    return pool.open_engine(
        FAKE_BACKEND,
        model,
        dtype,
        options=opts,
        python=sys.executable,
        env=FAKE_ENGINE_ENV,
        threads=1,
        startup_timeout=60,
    )


def _model(tmp_path, name="m"):
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"hidden_size": 4}))
    return d


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_same_key_gets_the_running_worker_back(keep, tmp_path):
    keep(2)
    m = _model(tmp_path)
    with _open(m) as a:
        pid = a.pid
        assert a.generate([[1, 2]], 2, [0]) == [[3, 4]]
    assert _alive(pid) and pool.running()[0]["holders"] == 0  # closed by its holder, kept
    with _open(m) as b:
        assert b is a and b.pid == pid and b.generate([[5]], 1, [0]) == [[6]]
        with _open(m) as c:  # an overlapping holder shares it
            assert c.pid == pid and pool.running()[0]["holders"] == 2
    with _open(m, dtype="bfloat16") as d:  # another start argument: another worker
        pid_d = d.pid
        assert pid_d != pid
    with _open(m, flag=1) as e:
        assert e.pid not in (pid, pid_d)
    # three idle, two kept: the one reused least (d, used once, older than e) was stopped
    assert [r["pid"] for r in pool.running()] == [pid, e.pid] and not _alive(pid_d)


def test_threads_default_to_the_budget_a_step_gives(keep, tmp_path):
    keep(2)
    from eagle3nb import threads

    m = _model(tmp_path)
    threads.clear()
    a = pool.open_engine(FAKE_BACKEND, m, options={}, python=sys.executable, env=FAKE_ENGINE_ENV)
    assert a.threads["torch_threads"] == threads.plan(0).worker  # all the cores, not unset
    a.close()
    b = pool.open_engine(
        FAKE_BACKEND, m, python=sys.executable, env=FAKE_ENGINE_ENV,
        threads=threads.plan(0).worker,
    )  # fmt: skip
    assert b is a
    b.close()


def test_idle_workers_are_bounded_and_stopped_at_the_end(keep, tmp_path):
    keep(1)
    m = _model(tmp_path)
    a = _open(m)
    b = _open(m, dtype="bfloat16")
    pa, pb = a.pid, b.pid
    a.close()
    assert _alive(pa)  # idle, within the bound
    b.close()  # two idle: the older one (a) is stopped
    assert [r["pid"] for r in pool.running()] == [pb]
    assert a.pid is None and not os.path.exists(a.workdir)
    pool.stop_all()
    assert pool.running() == [] and b.pid is None and not _alive(pb)


def test_stop_ends_a_held_worker_at_once_and_drops_it(keep, tmp_path):
    keep(2)
    m = _model(tmp_path)
    with _open(m) as a:
        pass
    with _open(m, dtype="bfloat16") as b:
        pa, pb = a.pid, b.pid
        pool.stop(b)  # held, not idle: stopped anyway, the pool forgets it
        assert b.pid is None and not _alive(pb)
    assert [r["pid"] for r in pool.running()] == [pa]
    with _open(m, dtype="bfloat16") as c:  # the same key starts a new worker
        assert c.pid not in (pa, pb)


def test_dead_worker_or_rewritten_model_starts_a_new_one(keep, tmp_path):
    keep(2)
    m = _model(tmp_path)
    with _open(m) as a:
        pid = a.pid
    a._kill()  # the worker died while idle
    with _open(m) as b:
        assert b.pid != pid and b.generate([[1]], 1, [0]) == [[2]]
        pid_b = b.pid
    stamp = folder_stamp(m)
    (m / "model.safetensors").write_bytes(b"new weights")  # the model written again
    assert folder_stamp(m) != stamp and folder_stamp(tmp_path / "absent") == ()
    with _open(m) as c:
        assert c.pid != pid_b


def test_zero_keeps_nothing_and_a_bad_value_is_refused(keep, tmp_path, monkeypatch):
    keep(0)
    with _open(_model(tmp_path)) as a:
        pid = a.pid
        assert a._release is None  # a plain client
    assert a.pid is None and not _alive(pid) and pool.running() == []
    monkeypatch.setenv(pool.KEEP_ENV, "two")
    with pytest.raises(ValueError, match="EAGLE3NB_KEEP_ENGINES='two' is not an int >= 0"):
        _open(_model(tmp_path))
