"""The engine worker's watch over the engine processes it starts (eagle3nb.engines.child_watch),
with real child processes, no engine: a child that exits while the main thread waits on it (as
SGLang's ``_wait_for_scheduler_ready`` polls a pipe in 5 s steps, ``entrypoints/engine.py:2013``)
stops the wait within seconds with its exit code, what the worker was doing and the log's tail;
the other processes of that engine are killed; a child forked from a forkserver (as SGLang's
scheduler is on CPU, eagle3nb.engines.sglang_forkserver) registers itself and is reported with the
code its server reaped; processes stopped on purpose (``forget``) are not reported. The same with
a real SGLang refusal through the worker: tests/engines/test_sglang_child_exit.py."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3nb.engines import child_watch

WHAT = "loading /models/twin for capture with layer ids [5, 6]"


@pytest.fixture(autouse=True)
def _clean():
    child_watch.forget()
    yield
    child_watch.forget()


def _wait_forever():
    """Stands in for SGLang's wait: a pipe nobody writes, polled in 5 s steps."""
    r, _w = os.pipe()
    while True:
        select.select([r], [], [], 5.0)


def _child(code_line: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import os, sys, time; {code_line}"])


def test_a_child_that_exits_stops_the_wait_within_seconds(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(
        "loading weights\nValueError: ids [5, 6] out of range for a target with 5 layers\n"
    )
    dies = _child("time.sleep(0.5); sys.exit(3)")
    stays = _child("time.sleep(120)")  # the engine's other process (SGLang's detokenizer)
    child_watch.register(dies.pid, "run_scheduler_process")
    child_watch.register(stays.pid, "run_detokenizer_process")
    t0 = time.monotonic()
    with pytest.raises(child_watch.EngineChildExited) as got:
        with child_watch.watching(WHAT, log):
            _wait_forever()
    secs = time.monotonic() - t0
    msg = str(got.value)
    assert secs < 4, secs  # 0.5 s to die, then one 1 s read of /proc
    assert f"run_scheduler_process (pid {dies.pid}) exited with code 3" in msg
    assert WHAT in msg and "out of range for a target with 5 layers" in msg  # the log's tail
    assert dies.wait(5) == 3
    assert stays.wait(10) == -9  # the rest of that engine killed
    assert child_watch.watched() == {}


def test_a_child_killed_by_a_signal_and_one_dead_before_the_call(tmp_path):
    killed = _child("os.kill(os.getpid(), 9)")
    child_watch.register(killed.pid, "run_scheduler_process")
    time.sleep(1.0)  # dead (a zombie) before the call starts: refused at its start
    with pytest.raises(child_watch.EngineChildExited, match=r"exited with code -9"):
        with child_watch.watching(WHAT, tmp_path / "no.log"):
            raise AssertionError("the block must not run")
    killed.wait()


def test_an_engine_that_saw_its_child_die_first_gets_the_code_and_the_log(tmp_path):
    # SGLang's own wait (a pipe's EOF) notices a scheduler that dies at init before the watch does,
    # raises its own error, and the backend stops the rest of that engine (stop_all): the call's
    # error still names the process, its code and the log's tail, beside the engine's own line
    log = tmp_path / "engine.log"
    log.write_text("ValueError: --return-aux-hidden-state-layer-ids [9] out of range\n")
    with pytest.raises(child_watch.EngineChildExited) as got:
        with child_watch.watching(WHAT, log, interval=30):  # the watch's thread never reads /proc
            dies = _child("sys.exit(255)")  # the scheduler, started during the call
            child_watch.register(dies.pid, "run_scheduler_process")
            while not child_watch.exit_status(dies.pid)[0]:  # a zombie: its code in /proc
                time.sleep(0.05)
            child_watch.stop_all()  # the backend, in its start's except
            raise RuntimeError("Rank 0 scheduler died during initialization (exit code: 255).")
    dies.wait()
    msg = str(got.value)
    assert f"run_scheduler_process (pid {dies.pid}) exited with code 255" in msg and WHAT in msg
    assert "the engine raised RuntimeError: Rank 0 scheduler died during initialization" in msg
    assert "[9] out of range" in msg and isinstance(got.value.__cause__, RuntimeError)
    with pytest.raises(ValueError, match="bad input"):  # nothing exited: the error as it came
        with child_watch.watching(WHAT, log):
            raise ValueError("bad input")


def test_a_child_stopped_on_purpose_or_alive_is_not_reported(tmp_path):
    alive = _child("time.sleep(120)")
    child_watch.register(alive.pid, "run_scheduler_process")
    with child_watch.watching(WHAT):
        time.sleep(1.5)  # the watch reads /proc at least once: nothing exited
    child_watch.forget()  # the backend stops its engine
    alive.kill()
    alive.wait()
    with child_watch.watching(WHAT):
        time.sleep(1.5)


_FORKSERVER = """
import multiprocessing as mp, os, select, sys
from eagle3nb.engines import child_watch, sglang_forkserver as f

if __name__ == "__main__":
    mp.set_start_method("forkserver")
    p = f._EnvProcess(target=os._exit, args=(7,), name="run_scheduler_process")
    r, w = os.pipe()
    try:
        with child_watch.watching("loading a twin", None):
            p.start()
            while True:
                select.select([r], [], [], 5.0)
    except child_watch.EngineChildExited as e:
        print(e)
"""


def test_a_forkserver_child_registers_itself_and_its_code_comes_back(tmp_path):
    script = tmp_path / "fs.py"
    script.write_text(_FORKSERVER)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert "process _exit (pid " in out.stdout, out  # the target's name
    assert "exited with code 7 while the worker was loading a twin" in out.stdout, out
