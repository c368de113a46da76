"""04's progress and notices on the terminal: what was refused or left out (bad benchmark records
with file and line, an engine ``eval_engines: [auto]`` left out and why), engine starts, and per
setting (engine, drafter, k, batch size) the prompts served and an ETA.

Each line is printed (the executed notebook keeps it) and appended to ``outputs/<run>/eval.log``,
which ``python -m eagle3nb.run`` echoes as it grows, as it does 03's ``train/train.log``
(:class:`eagle3nb.training.progress.LogFollower`); the runner counts the notices (lines holding
:data:`NOTICE`) into its "done" line.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, TextIO

__all__ = ["PREFIX", "NOTICE", "EvalLog", "report_refused", "report_left_out"]

PREFIX = "[04] "
NOTICE = "notice: "  # a line the runner counts: something refused or left out


class EvalLog:
    """``log(text)`` prints ``[04] text`` to ``stream`` and appends it to ``path`` (started
    empty, so a follower sees this run's lines only).

    Args:
        path: the log file (``outputs/<run>/eval.log``), or None for none.
        stream: where lines are printed (None: not printed).
    """

    def __init__(self, path: str | os.PathLike | None, stream: Optional[TextIO] = sys.stdout):
        self.path, self.stream, self.notices = path, stream, 0
        if path is not None:
            with open(path, "w"):
                pass

    def __call__(self, text: str) -> None:
        line = PREFIX + text
        self.notices += text.startswith(NOTICE)
        if self.stream is not None:
            print(line, file=self.stream, flush=True)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def report_refused(log, block: dict | None) -> None:
    """One notice per refused benchmark record (``file:line: reason``) and a count, from
    :func:`eagle3nb.steps.evaluate.bench.read_eval_dataset`'s block (None: no benchmark)."""
    if not block or not block.get("refused"):
        return
    ref = block["refused"]
    n = block["n_records_read"] + len(ref)
    log(f"{NOTICE}eval_dataset={block['eval_dataset']}: {len(ref)} of {n} records refused, "
        f"{block['n_records_read']} kept")  # fmt: skip
    for x in ref:
        log(f"{NOTICE}refused {x['where']}: {x['reason']}")


def report_left_out(log, eval_engines: list[str], left_out: dict) -> None:
    """One notice per engine or drafter left out of 04 and why (``left_out``: ``{name: why}``)."""
    for name, why in left_out.items():
        log(f"{NOTICE}eval_engines={list(eval_engines)}: {name} left out: {why}")
