"""CPU seconds the benches record to say how quiet the machine was (standard library only; Linux,
/proc). Imported by bench scripts (their own folder is on ``sys.path`` when run as
``python bench/x.py``) and by tests that put ``bench/`` on ``sys.path``; run as a script it is the
wrapper of :func:`run_tree`.

Why here and not in :mod:`eagle3nb.timing`: that module judges speed figures the workbook itself
prints; this only describes a bench's machine, and nothing in ``eagle3nb`` needs it.

A timed command's CPU seconds must count its whole process tree, or the other-load share
(machine busy seconds less the command's, :func:`machine_cpu_seconds`) counts the command's own
engine workers as other processes. ``RUSAGE_CHILDREN`` alone does not: it holds a descendant's
time only when every process on the way up waited for it, and 04's engine workers' processes are
not all waited for (an engine worker runs in its own session and is stopped by ``killpg``; the
processes it started, such as SGLang's forkserver and the scheduler under it, are orphaned then,
and init reaps them, so their time lands in nobody's rusage). Sampling ``/proc/<pid>/stat`` of the
descendants instead misses what runs between the last sample and the exit, and processes that live
less than one sampling interval. So :func:`run_tree` runs the command under a wrapper that is a
child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux >= 3.4): every orphaned descendant is
re-parented to it rather than to init, it waits for each one, and after the last has exited its
``RUSAGE_CHILDREN`` is the CPU time of the whole tree, as the kernel accounted it. Not counted: a
process whose own parent ignores SIGCHLD (the kernel reaps it without accounting), and a
descendant that outlives the command by more than ``grace`` seconds is killed, then counted.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["machine_cpu_seconds", "TreeRun", "run_tree", "become_subreaper", "reap_children"]

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def machine_cpu_seconds(stat: str | os.PathLike = "/proc/stat") -> tuple[float, float]:
    """``(busy, total)`` CPU seconds of the whole machine since boot, over all CPUs, from the
    ``cpu`` line of ``stat`` (``proc(5)``: clock ticks of ``SC_CLK_TCK``); idle is ``idle`` +
    ``iowait``, busy is the rest. A difference of two readings over a run, less the run's own CPU
    seconds (:func:`run_tree`), is what the other processes took meanwhile."""
    f = [float(x) for x in Path(stat).read_text().split("\n")[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = f[3] + (f[4] if len(f) > 4 else 0.0)
    return (sum(f) - idle) / hz, sum(f) / hz


@dataclass(frozen=True)
class TreeRun:
    """One command run by :func:`run_tree`.

    Attributes:
        proc: its ``CompletedProcess`` (``returncode`` the command's own; negative: killed by
            that signal).
        seconds: wall seconds from its start to its own exit (not the wait for its descendants).
        cpu_seconds: user + system CPU seconds of the command and every descendant it had.
        killed: pids of descendants still running ``grace`` seconds after the command exited,
            killed then (their time up to then is in ``cpu_seconds``).
    """

    proc: subprocess.CompletedProcess
    seconds: float
    cpu_seconds: float
    killed: tuple[int, ...]

    @property
    def returncode(self) -> int:
        return self.proc.returncode


def run_tree(cmd: list[str], grace: float = 120.0, **kw) -> TreeRun:
    """Run ``cmd`` (``subprocess.run`` keywords ``kw``: cwd, env, capture_output, text, ...) under
    this file as a subreaper wrapper and return its wall seconds and the CPU seconds of its whole
    process tree (module docstring: why and what is not counted).

    Raises:
        RuntimeError: the wrapper wrote no report (it failed to start, or ``prctl`` failed: not
            Linux), with its stderr.
    """
    with tempfile.TemporaryDirectory(prefix="cpu_time-") as tmp:
        report = Path(tmp) / "report.json"
        wrap = [sys.executable, str(Path(__file__).resolve()), "--report", str(report)]
        proc = subprocess.run([*wrap, "--grace", str(grace), "--", *cmd], **kw)
        if not report.is_file():
            raise RuntimeError(f"cpu_time wrapper wrote no report (rc {proc.returncode}): "
                               f"{proc.stderr!r}")  # fmt: skip
        r = json.loads(report.read_text())
    proc.returncode = r["returncode"]
    return TreeRun(proc, r["seconds"], r["cpu_seconds"], tuple(r["killed"]))


def become_subreaper() -> None:
    """Make this process the child subreaper of its descendants (``prctl(2)``).

    Raises:
        OSError: prctl failed (not Linux, or a kernel older than 3.4).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def _children() -> list[int]:
    """Pids of the running (not zombie) processes whose parent is this one (``/proc/<pid>/stat``
    fields 3 and 4)."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, ppid = raw[raw.rfind(")") + 2 :].split()[:2]
        if int(ppid) == me and state not in ("Z", "X"):
            out.append(int(d.name))
    return out


def reap_children(first: int, grace: float) -> tuple[int, float, list[int]]:
    """Wait for child ``first`` and then for every other child this process has or is given (as a
    subreaper) until none is left; those still running ``grace`` seconds after ``first`` exited
    are sent SIGKILL (and their orphans in turn, as they are re-parented here).

    Returns:
        ``(waitpid status of first, time.perf_counter() when it was reaped, pids killed)``.
    """
    status, exited, killed = None, None, []
    while True:
        try:
            pid, st = os.waitpid(-1, 0 if exited is None else os.WNOHANG)
        except ChildProcessError:  # no child left
            return status, exited, killed
        if pid == first:
            status, exited = st, time.perf_counter()
        elif pid == 0:  # children left, none exited yet
            if time.perf_counter() > exited + grace:
                for c in set(_children()) - set(killed):
                    try:
                        os.kill(c, signal.SIGKILL)
                        killed.append(c)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)


def _wrapper(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="run_tree's wrapper (see the module docstring)")
    ap.add_argument("--report", required=True)
    ap.add_argument("--grace", type=float, required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    become_subreaper()
    t0 = time.perf_counter()
    pid = os.posix_spawnp(cmd[0], cmd, os.environ)
    status, exited, killed = reap_children(pid, a.grace)
    secs = exited - t0  # the command's wall time ends at its exit, not at the last descendant's
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    rc = os.waitstatus_to_exitcode(status)
    tmp = Path(a.report + ".tmp")
    tmp.write_text(json.dumps({"returncode": rc, "seconds": secs, "killed": killed,
                               "cpu_seconds": r.ru_utime + r.ru_stime}))  # fmt: skip
    os.replace(tmp, a.report)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(_wrapper(sys.argv[1:]))
