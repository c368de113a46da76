"""Live progress of training on rank 0: text lines for headless runs and the run's log file, the
loss in a progress bar's postfix for interactive ones, and scalars for experiment trackers.

- :class:`ProgressLog` writes one line (step, loss, per-TTT-step accuracy, lr, tokens/s, ETA)
  every ``log_every`` steps and whenever ``interval_s`` (60 s) of its clock passed since the last
  line, to a stream (stdout in headless runs, so papermill's ``--log-output`` streams it and the
  executed notebook keeps it) and to ``train.log``; held-out evaluations get their own line.
- :class:`Tracker` sends the same numbers to tensorboard (event files in the run folder, offline)
  and, when asked and importable, to wandb (offline mode) or mlflow (a local ``file:`` store). No
  credential is read or written: the run folder receives only the numbers and the config given.
- :class:`LogFollower` echoes the lines appended to ``train.log`` while a headless run's 03
  executes (``python -m eagle3nb.run`` shows them live), and :data:`KERNEL_ARGS` keeps jupyter's
  plaintext-TCP warning out of that terminal (:class:`LoopbackKernelFilter`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, TextIO

__all__ = [
    "ProgressLog",
    "Tracker",
    "TRACKERS",
    "fmt_seconds",
    "LogFollower",
    "LoopbackKernelFilter",
    "KERNEL_ARGS",
]

TRACKERS = ("tensorboard", "wandb", "mlflow")


def fmt_seconds(s: float | None) -> str:
    """``s`` seconds as ``1h02m``, ``3m05s`` or ``42s`` (``?`` when unknown)."""
    if s is None or s != s or s == float("inf"):
        return "?"
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class ProgressLog:
    """Progress lines of one training call (rank 0 only; other ranks pass ``enabled=False``).

    Args:
        total: the run's last step (``max_steps``); start: the step this call starts from (resume).
        log_every: a line every this many steps; interval_s: and at least every this many seconds
            of ``clock`` (a line is due at the first step ending after the interval).
        stream: where lines are printed (None: not printed, e.g. interactive runs with a bar).
        log_file: appended with every line (None: no file).
        bar: a tqdm-like bar (``update``, ``set_postfix``, ``close``) or None.
        clock: seconds, monotonic (tests pass a controllable one).
    """

    def __init__(
        self,
        total: int,
        start: int,
        log_every: int,
        interval_s: float = 60.0,
        stream: Optional[TextIO] = None,
        log_file: str | os.PathLike | None = None,
        bar=None,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
    ):
        self.total, self.start, self.log_every, self.interval_s = (
            total,
            start,
            log_every,
            interval_s,
        )
        self.stream, self.bar, self.clock, self.enabled = stream, bar, clock, enabled
        self.file = None
        if enabled and log_file is not None:
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(log_file, "a", buffering=1)
        self.t0 = self.last = clock()
        self.tokens = 0
        self.lines = 0

    def time_due(self) -> bool:
        """Called once per step: True when another step as long as the last one would end more
        than ``interval_s`` after the last line (so lines come at most ``interval_s`` apart while
        step times are steady); always False when disabled."""
        now = self.clock()
        step_s, self.prev = now - getattr(self, "prev", self.t0), now
        return self.enabled and now - self.last + step_s >= self.interval_s

    def write(self, text: str) -> None:
        """Print ``text`` (one line) to the stream and append it to the log file."""
        if not self.enabled:
            return
        self.last = self.clock()
        self.lines += 1
        if self.stream is not None:
            print(text, file=self.stream, flush=True)
        if self.file is not None:
            self.file.write(text + "\n")

    def step_line(self, entry: dict, tokens: int, extra: str = "") -> str:
        """Write the line of history ``entry`` (step, loss, lr, step_acc) after ``tokens``
        loss-token-steps (global) of this call, with ``extra`` appended (online from an engine:
        its prefetch queue); returns it. tokens/s and ETA from this call's clock time."""
        step = entry["step"]
        el = self.clock() - self.t0
        done = step - self.start
        tps = tokens / el if el > 0 else float("nan")
        eta = el / done * (self.total - step) if done > 0 else None
        acc = " ".join(f"{a:.2f}" for a in entry["step_acc"])
        line = (
            f"[train] step {step}/{self.total} loss {entry['loss']:.4f} acc/ttt-step [{acc}] "
            f"lr {entry['lr']:.2e} {tps:,.0f} tok-steps/s elapsed {fmt_seconds(el)} "
            f"ETA {fmt_seconds(eta)}"
        )
        line += f"; {extra}" if extra else ""
        self.write(line)
        return line

    def heldout_line(self, step: int, res: dict, best: Optional[dict]) -> str:
        """Write the line of a held-out evaluation ``res`` (tau, step_acc) at ``step``; ``best``:
        the best pointer after it. Returns the line."""
        acc = " ".join(f"{a:.2f}" for a in res["step_acc"])
        line = (
            f"[eval]  step {step}/{self.total} held-out tau {res['tau']:.3f} (k={res['k']}, "
            f"{res['prompts']} prompts) teacher-forced acc/ttt-step [{acc}] "
            f"({res['seconds']:.1f} s)"
        )
        if best is not None:
            line += f"; best tau {best['tau']:.3f} at step {best['step']}"
        self.write(line)
        if self.enabled and self.stream is None and hasattr(self.bar, "write"):
            self.bar.write(line)  # interactive: shown under the bar (tqdm.write)
        return line

    def bar_step(self, loss: Optional[float]) -> None:
        """Advance the bar by one step, with the last loss in its postfix."""
        if self.bar is not None:
            if loss is not None and hasattr(self.bar, "set_postfix"):
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        """Close the bar and the log file."""
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
            self.file = None


class Tracker:
    """Scalars to experiment trackers (rank 0; ``enabled=False`` elsewhere makes it a no-op).

    Args:
        backends: names from :data:`TRACKERS`; tensorboard writes ``log_dir/tensorboard``, wandb
            runs in offline mode under ``log_dir/wandb``, mlflow logs to ``log_dir/mlruns``.
            wandb and mlflow are used only when importable (else skipped, named in ``skipped``).
        log_dir: the run's training folder; name: the run name; config: parameters logged once
            (plain values, no secrets).

    Raises:
        ValueError: a backend not in :data:`TRACKERS`.
    """

    def __init__(
        self,
        backends: Sequence[str],
        log_dir: str | os.PathLike,
        name: str = "eagle3nb",
        config: Optional[dict] = None,
        enabled: bool = True,
    ):
        bad = [b for b in backends if b not in TRACKERS]
        if bad:
            raise ValueError(f"tracking={list(backends)}: unknown {bad}; use {list(TRACKERS)}")
        self.log_dir, self.active, self.skipped = Path(log_dir), {}, {}
        if not enabled:
            return
        for b in dict.fromkeys(backends):
            try:
                self.active[b] = getattr(self, f"_open_{b}")(name, config or {})
            except ImportError as e:
                self.skipped[b] = f"not importable ({e})"

    def _open_tensorboard(self, name, config):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.log_dir / "tensorboard"))

    def _open_wandb(self, name, config):
        import wandb  # offline: nothing leaves the machine, no API key is needed or stored

        d = self.log_dir / "wandb"
        d.mkdir(parents=True, exist_ok=True)
        return wandb.init(mode="offline", dir=str(d), project="eagle3nb", name=name, config=config)

    def _open_mlflow(self, name, config):
        import mlflow

        mlflow.set_tracking_uri((self.log_dir / "mlruns").resolve().as_uri())
        run = mlflow.start_run(run_name=name)
        mlflow.log_params({k: str(v)[:250] for k, v in config.items()})
        return run

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log ``values`` (name -> float; names like ``train/loss``) at ``step``."""
        for b, h in self.active.items():
            if b == "tensorboard":
                for k, v in values.items():
                    h.add_scalar(k, v, step)
                h.flush()
            elif b == "wandb":
                h.log(dict(values), step=step)
            elif b == "mlflow":
                import mlflow

                mlflow.log_metrics({k.replace("/", "."): v for k, v in values.items()}, step=step)

    def close(self) -> None:
        """Flush and close every backend."""
        for b, h in self.active.items():
            if b == "tensorboard":
                h.close()
            elif b == "wandb":
                h.finish()
            elif b == "mlflow":
                import mlflow

                mlflow.end_run()
        self.active = {}


def default_stream(interactive: bool) -> Optional[TextIO]:
    """stdout for headless runs (lines), None for interactive ones (the bar shows progress)."""
    return None if interactive else sys.stdout


class LogFollower:
    """While a ``with`` block runs, a thread passes each line appended to ``path`` (after its size
    at entry: a resumed run's earlier lines are not repeated) to ``emit``, polling every
    ``interval_s`` seconds; on exit the rest is passed and the thread joined. A file that appears
    later is read from its start, one that shrinks (rewritten) from its new start; a line is passed
    once complete (ending in a newline), or at exit.

    Args:
        path: the log file (need not exist yet). emit: called with each line, without its newline.
    """

    def __init__(self, path: str | os.PathLike, emit: Callable[[str], None], interval_s=1.0):
        self.path, self.emit, self.interval_s = Path(path), emit, interval_s
        self.offset = self.path.stat().st_size if self.path.is_file() else 0
        self.partial = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-follower", daemon=True)

    def __enter__(self) -> "LogFollower":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()
        if self.partial:
            self.emit(self.partial.decode("utf-8", "replace").rstrip("\r"))
            self.partial = b""

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        """Pass the complete lines appended since the last call."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size < self.offset:  # rewritten: read it from its start
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = self.partial + f.read(size - self.offset)
        self.offset = size
        *lines, self.partial = data.split(b"\n")
        for line in lines:
            self.emit(line.decode("utf-8", "replace").rstrip("\r"))


# ipykernel warns at every start that its ZMQ sockets are plain TCP ("Kernel is running over TCP
# without encryption ... susceptible to eavesdropping"). A headless run's kernel talks to its
# client on loopback only (jupyter_client binds 127.0.0.1 and signs every message with the
# connection file's key), so nothing leaves the machine: the warning is not the user's concern.
# It is filtered where it is raised, in the kernel's own log handler, and nothing else is.
PLAINTEXT_TCP_WARNING = "Kernel is running over TCP without encryption"


class LoopbackKernelFilter(logging.Filter):
    """Drops ipykernel's plaintext-TCP warning (:data:`PLAINTEXT_TCP_WARNING`), keeps every other
    record. Loaded by the kernel process at its start (:data:`KERNEL_ARGS`), hence here: this
    module imports only the standard library."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(PLAINTEXT_TCP_WARNING)


# extra kernel arguments (nbclient's extra_arguments): traitlets' logging_config adds the filter
# to the console handler of the kernel application's log (ipykernel/kernelapp.py init_sockets)
KERNEL_ARGS = [
    "--IPKernelApp.logging_config="
    + json.dumps(
        {
            "filters": {"loopback": {"()": f"{__name__}.LoopbackKernelFilter"}},
            "handlers": {"console": {"filters": ["loopback"]}},
        }
    )
]
