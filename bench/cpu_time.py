"""CPU seconds the benches record to say how quiet the machine was (standard library only; Linux,
/proc). Imported by bench scripts (their own folder is on ``sys.path`` when run as
``python bench/x.py``) and by tests that put ``bench/`` on ``sys.path``.

Why here and not in :mod:`eagle3nb.timing`: that module judges speed figures the workbook itself
prints; this only describes a bench's machine, and nothing in ``eagle3nb`` needs it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["machine_cpu_seconds"]


def machine_cpu_seconds(stat: str | os.PathLike = "/proc/stat") -> tuple[float, float]:
    """``(busy, total)`` CPU seconds of the whole machine since boot, over all CPUs, from the
    ``cpu`` line of ``stat`` (``proc(5)``: clock ticks of ``SC_CLK_TCK``); idle is ``idle`` +
    ``iowait``, busy is the rest. A difference of two readings over a run, less the run's own CPU
    seconds, is what the other processes took meanwhile."""
    f = [float(x) for x in Path(stat).read_text().split("\n")[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = f[3] + (f[4] if len(f) > 4 else 0.0)
    return (sum(f) - idle) / hz, sum(f) / hz
