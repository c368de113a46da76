"""The engine worker watches the engine processes it starts: one that exits while the worker waits
on it makes the wait raise, within seconds, with its exit code and the last lines of the log.

Why: SGLang starts its scheduler and detokenizer as child processes; on this project's CPU path
they are forked from a preloaded forkserver (:mod:`eagle3nb.engines.sglang_forkserver`), so the
scheduler's parent is that server, not the worker. A scheduler that fails at start (an id set
SGLang refuses, a class it cannot build) signals its *parent* to clean up
(``srt/managers/scheduler.py:6370-6373``, 0.5.23: ``parent_process.send_signal(SIGQUIT)``) and
exits; the worker was left waiting on it and never answered the client (seen: 401 s until a
test's timeout, with the scheduler defunct).

How: every engine process is registered when it starts (:func:`register`, called by the
forkserver's process class); while the worker runs a backend call (:func:`watching`, around the
backend's creation and each request in :func:`eagle3nb.engines.worker.serve`) a thread reads each
registered process's ``/proc/<pid>/stat`` every :data:`INTERVAL` s. A process that is a zombie or
gone has exited: the thread interrupts the main thread (``SIGUSR2``, whose handler raises
:class:`ChildExited`), the processes left of that engine are killed, and the call raises
:class:`EngineChildExited` naming the process, its exit code (``/proc`` field 52, the
``waitpid`` status of a zombie), what the worker was doing (the model and id set) and the log's
last lines. Where the engine's own wait sees the process die first and raises (SGLang 0.5.23 on
a scheduler that dies at init: "Rank 0 scheduler died during initialization (exit code: 255)", its
reason only in the log), the block's error becomes the same :class:`EngineChildExited`, with the
engine's line beside it. The worker answers that error and serves the next request; the backend's
next call starts a fresh engine. A backend that stops its engine on purpose calls :func:`forget`
first.

Linux only (``/proc``); engine side: standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

__all__ = [
    "INTERVAL",
    "ChildExited",
    "EngineChildExited",
    "register",
    "forget",
    "stop_all",
    "watched",
    "exit_status",
    "watching",
    "log_tail",
    "drop_zmq_contexts",
]

INTERVAL = 1.0  # seconds between two reads of /proc
_SIGNAL = signal.SIGUSR2
_lock = threading.Lock()
# pid -> (name, multiprocessing.Process or None) of the engine processes started, not yet stopped
_watched: dict[int, tuple] = {}
# (pid, name, code) of the processes found exited when stop_all cleared them (the engine's own wait
# saw its process die first and raised: a watch under way names that process from here)
_exited_at_stop: list = []


class ChildExited(BaseException):
    """Raised in the main thread by the watch's signal handler (a BaseException, so an engine's
    own ``except Exception`` around its wait does not swallow it); :func:`watching` turns it into
    :class:`EngineChildExited`."""


class EngineChildExited(RuntimeError):
    """An engine process exited while the worker waited on it (message: which, code, log)."""


def register(pid: int, name: str, process=None) -> None:
    """Watch process ``pid`` (``name``: e.g. SGLang's ``run_scheduler_process``) from now on;
    ``process``: its ``multiprocessing.Process``, whose ``exitcode`` gives the code once the
    process is reaped (a forkserver reaps its children and reports their codes)."""
    with _lock:
        _watched[int(pid)] = (str(name), process)


def forget() -> None:
    """Stop watching every registered process (the backend is stopping its engine on purpose)."""
    with _lock:
        _watched.clear()


def watched() -> dict[int, str]:
    """The registered processes, ``{pid: name}``."""
    with _lock:
        return {pid: v[0] for pid, v in _watched.items()}


def exit_status(pid: int) -> tuple[bool, int | None]:
    """``(exited, code)`` of process ``pid`` from ``/proc/<pid>/stat``: a zombie has exited, with
    its code (a negative code: killed by that signal, as ``subprocess`` reports it); a pid that is
    gone has exited with an unknown code (None); a running one ``(False, None)``."""
    try:
        raw = Path(f"/proc/{int(pid)}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True, None
    fields = raw[raw.rfind(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    if fields[0] not in ("Z", "X"):
        return False, None
    status = int(fields[49]) if len(fields) > 49 else None  # field 52: the waitpid status
    if status is None:
        return True, None
    return True, (-(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF)


def log_tail(path: str | os.PathLike | None, n: int = 25) -> str:
    """The last ``n`` lines of ``path`` ('' where it cannot be read)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines() if path else []
    except OSError:
        return ""
    return f"--- last {min(n, len(lines))} lines of {path} ---\n" + "\n".join(lines[-n:])


def _first_exited() -> tuple[int, str, int | None] | None:
    with _lock:
        items = list(_watched.items())
    for pid, (name, proc) in items:
        done, code = exit_status(pid)
        if done and pid in watched():  # not forgotten meanwhile (stopped on purpose)
            if code is None and proc is not None:  # reaped already: its parent's report
                with contextlib.suppress(Exception):
                    code = proc.exitcode
            return pid, name, code
    return None


def stop_all() -> None:
    """SIGKILL the registered processes still running and forget them all: the rest of an engine
    that failed (its start raised, or one of its processes exited). The ones already exited are
    kept for :func:`watching`'s message."""
    if hit := _first_exited():
        _exited_at_stop.append(hit)
    for pid in watched():
        if not exit_status(pid)[0]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    forget()


def _message(hit, what: str, log: str | None, raised: BaseException | None = None) -> str:
    pid, name, code = hit
    how = f"exited with code {code}" if code is not None else "exited (its code was not kept)"
    if raised is None:
        said = "the worker stopped waiting on it"
    else:  # the engine's own wait saw it first (SGLang: a scheduler that dies at init)
        first = (str(raised).strip().splitlines() or [""])[0]
        said = f"the engine raised {type(raised).__name__}: {first}"
    return (
        f"the engine's process {name} (pid {pid}) {how} while the worker was {what}; {said} "
        f"(the engine's own error is in its log)\n{log_tail(log)}"
    )


_armed: list = []  # the exited process the handler raises for, while a watch is armed
_installed: list = []


def _handler(signum, frame):
    if _armed:
        hit = _armed.pop()
        raise ChildExited(hit)


@contextlib.contextmanager
def watching(what: str, log: str | os.PathLike | None = None, interval: float = INTERVAL):
    """Run the block while watching the registered engine processes (module docstring).

    Args:
        what: what the worker is doing, for the message (e.g. ``"loading model /m for capture of
            ids [0, 3, 6]"``).
        log: the worker's log (its stderr, where the engine's processes write too).

    Raises:
        EngineChildExited: a registered process exited before or during the block (the block is
            interrupted; the engine's processes left are killed and forgotten), or the block
            raised an error while one had exited (the engine's own wait saw it die first: the
            message names the process, its code and the log's tail beside the engine's error).
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: no watch here
        return
    _exited_at_stop.clear()
    if hit := _first_exited():  # died while the worker was idle
        stop_all()
        raise EngineChildExited(_message(hit, what, log))
    if not _installed:  # installed once and kept: a signal that comes late finds it disarmed
        signal.signal(_SIGNAL, _handler)
        _installed.append(True)
    stop = threading.Event()
    main = threading.main_thread().ident

    def watch():
        while not stop.wait(interval):
            if hit := _first_exited():
                _armed.append(hit)
                signal.pthread_kill(main, _SIGNAL)
                return

    t = threading.Thread(target=watch, name="eagle3nb-child-watch", daemon=True)
    t.start()
    try:
        yield
    except ChildExited as e:
        stop_all()
        raise EngineChildExited(_message(e.args[0], what, log)) from None
    except Exception as e:
        hit = _first_exited() or (_exited_at_stop[0] if _exited_at_stop else None)
        if hit is None or isinstance(e, EngineChildExited):
            raise
        stop_all()
        raise EngineChildExited(_message(hit, what, log, e)) from e
    finally:  # a signal still on its way finds the watch disarmed (the next call's check sees it)
        signal.pthread_sigmask(signal.SIG_BLOCK, {_SIGNAL})
        stop.set()
        _armed.clear()
        t.join(timeout=interval * 2)
        _armed.clear()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {_SIGNAL})


def drop_zmq_contexts() -> None:
    """Destroy, with linger 0, the ZMQ contexts an engine whose start failed leaves behind: their
    sockets hold messages for the dead scheduler, and ZMQ's default linger (-1) made the next
    engine's start block for ever in the garbage collector's ``Context.__del__`` -> ``term()``
    (seen with SGLang 0.5.23 after a refused id set, py-spy: ``Engine.__init__`` ->
    ``zmq/sugar/context.py:264``). Only a failed engine's are alive then (the worker runs one)."""
    import gc

    import zmq

    for obj in gc.get_objects():
        if isinstance(obj, zmq.Context) and not obj.closed:
            try:
                obj.destroy(linger=0)
            except Exception:  # noqa: BLE001 - one that cannot be destroyed is left as it is
                pass
