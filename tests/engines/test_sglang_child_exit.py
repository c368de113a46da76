"""A real SGLang 0.5.23 start that its scheduler refuses fails the call within seconds, through the
worker's watch over its engine processes (eagle3nb.engines.child_watch; the same with plain child
processes: tests/engines/test_child_watch.py), not a hang: the capture engine asked for SGLang
ids [0, 9] of the 5-layer target, which SGLang's ModelRunner refuses in the scheduler child
(``srt/model_executor/model_runner_components/spec_aux_hidden_state.py:113-130``: "out of range for
a target with 5 layers"). Its ``run_scheduler_process`` catches the error, logs it, sends SIGQUIT to
its parent and returns (``srt/managers/scheduler.py:6370-6373``): the process exits with code 0,
and its parent, eagle3nb's forkserver, dies of the signal, so multiprocessing reports 255 for it
(``popen_forkserver.py:67-72``: the forkserver's pipe closed). SGLang's own wait sees the
scheduler's pipe close first (``entrypoints/engine.py:2027-2029``) and raises "Rank 0 scheduler died
during initialization (exit code: 255)" without the reason; the watch turns that into an error
naming the scheduler (or the forkserver, whichever it finds gone first), its own exit code (read
in ``/proc``: 0, or -3 for the forkserver), the model and ids, SGLang's line and
the log's tail with SGLang's own reason (a scheduler that dies where SGLang's wait does not see it is the case
tests/engines/test_child_watch.py covers: the hang this watch ended, 401 s until a test's timeout).
The same worker then serves a capture again (a fresh engine: the failed one's processes and ZMQ
contexts are gone). One SGLang worker, the one the other SGLang tests share (eagle3nb.engines.pool).
Skipped, with the reason, when the SGLang venv is absent (``bash .ci/setup_engines.sh``).
"""

import re
import time

import pytest

from testkit import requires_engine, sglang_ctx
from eagle3nb.target import models

pytestmark = requires_engine("sglang", "0.5.23")


def test_a_scheduler_refusal_fails_the_call_within_seconds_and_the_worker_serves_on(tmp_path):
    from eagle3nb.engines.sglang_helpers import start_sglang

    path = models.resolve_model("stories260K-hd32")
    client = start_sglang(path, "float32", "cpu", 0, None, tmp_path, sglang_ctx(path))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as got:
        client.capture([[1, 20, 30]], [0, 9])  # id 9: SGLang's scheduler refuses it at start
    secs = time.monotonic() - t0
    msg = str(got.value)
    # the first of the engine's processes the watch finds gone: the scheduler (code 0) or the
    # forkserver its SIGQUIT killed (code -3), each by its registered name
    hit = (
        r"(run_scheduler_process|SGLang's forkserver .*) \(pid \d+\) exited with code (0|-3) while"
    )
    assert re.search(hit, msg), msg
    assert "running capture of sglang on" in msg and "with layer ids [0, 9]" in msg, msg
    assert "the engine raised RuntimeError: Rank 0 scheduler died during initialization" in msg
    assert "--- last " in msg and "out of range for a target with 5 layers" in msg, msg
    assert secs < 60, f"the refused start took {secs:.0f} s to come back"
    out = client.capture([[1, 20, 30]], [0, 1, 3])  # the same worker, a fresh engine
    assert tuple(out[0]["aux"].shape) == (3, 3 * 64)
