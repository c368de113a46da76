"""One thread budget per process: the cores this process may use, shared out between the notebook
kernel and each engine worker subprocess.

Why: torch (and the OpenMP/MKL pools under it) sizes its thread pools from the machine's cores, not
from the cores a container or ``taskset`` grants, and every engine worker (vLLM, SGLang and the
processes SGLang spawns) does the same on its own. On a shared machine the pools then outnumber the
cores, and an OpenMP parallel region waits for its slowest (descheduled) thread.

The cores this process may use (:func:`available_cores`): ``os.sched_getaffinity(0)`` (``taskset``,
cpusets), capped by the CPU quota of the cgroup it runs in and of every cgroup above it (cgroup v2
``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``), rounded down (at least 1): a quota of
1.5 CPUs gives 1 thread, as Go's automaxprocs does.

How it is shared out (:func:`plan`): the kernel and each engine worker get the whole budget, because
they take turns: the notebook waits on the worker during an engine call, and the worker's engine
waits for the notebook in between (vLLM runs its engine core in the worker's own thread,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``; SGLang's scheduler sleeps on idle, see
:mod:`eagle3nb.engines.sglang_backend`). Inter-op threads (torch's pool for ``torch.jit.fork``) are 1
in the kernel.

What each engine worker is given (:func:`worker_env`, read by the engines' installed sources):

- ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``: the size of the OpenMP/MKL pools torch creates on import,
  in the worker and in every process the engine spawns (SGLang's scheduler and detokenizer inherit
  the environment). vLLM 0.32.0 keeps an ``OMP_NUM_THREADS`` set from outside
  (``vllm/utils/torch_utils.py:276`` "Respects an externally-set OMP_NUM_THREADS";
  ``vllm/v1/engine/utils.py:205-209`` skips its own startup thread count on CPU and when it is set).
- the worker calls ``torch.set_num_threads`` with the budget before it imports the engine
  (:mod:`eagle3nb.engines.worker`): vLLM's CPU worker later replaces ``torch.set_num_threads`` with a
  no-op (``vllm/v1/worker/cpu_worker.py:139-145``), so the pool must be sized first.
- ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless set: read only by vLLM's multi-process executor
  (``vllm/utils/ompmultiprocessing.py:123``, ``multiproc_executor.py:189``, e.g. with
  ``tensor_parallel_size`` > 1), whose default ``auto`` binds each rank to a whole NUMA node and
  sets ``OMP_NUM_THREADS`` to its size (``ompmultiprocessing.py:78``); ``nobind`` leaves the ranks
  the budget's ``OMP_NUM_THREADS``. The single-process engine eagle3nb runs does not read it.
- ``SGLANG_CPU_OMP_THREADS_BIND`` is left alone: SGLang 0.5.23 reads it
  (``sglang/srt/utils/numa_utils.py:459``) but uses it only through the AMX/arm64 CPU kernels
  (``sglang/srt/distributed/bootstrap.py:277-285``), which the CPU install of
  ``.ci/setup_engines.sh`` lacks, and setting it also stops SGLang sizing its memory per NUMA node
  (``sglang/srt/utils/common.py:913``); there ``OMP_NUM_THREADS`` sizes its pools.

Other work on the cores (:class:`Rebalancer`): with ``threads: 0`` and a process that may use every
CPU of the machine, each step starts on the cores other processes leave idle (at least 1; the engine
workers it starts get the same), and CPU training re-sizes torch's intra-op pool to them every
10 s. Idle cores: the available ones minus the runnable threads of other processes, read from
``/proc/stat``'s machine-wide ``procs_running`` (:func:`others_running`). Why: an OpenMP parallel region ends when its slowest thread does, and a thread
that shares its core with a busy neighbour is descheduled for a whole time slice at a time. Measured
on 2 cores beside a 2-thread matmul loop (03's default step, b4 x TTT 5): 2 threads 0.251 s/step,
1 thread 0.147 s/step; idle 0.0645 (2 threads) and 0.0907 (1 thread). Pinned budgets (``threads: N``)
and processes confined to some of the machine's CPUs (affinity, cgroup quota: the machine-wide count
says nothing about their cores) are left as they are.
A float result can depend on the thread count (how a reduction is split), so a run's last bits
depend on the load it met; pin ``threads: N`` for bitwise-repeatable runs.

Variables the user already set in the environment are kept (an explicit choice wins); the budget
actually seen by each worker is reported back (:class:`eagle3nb.engines.client.EngineClient`'s
``threads``) and recorded in ``metrics.json["threads"]``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Cores",
    "Budget",
    "available_cores",
    "cgroup_cpu_quota",
    "plan",
    "apply",
    "current",
    "clear",
    "worker_env",
    "THREAD_ENV",
    "others_running",
    "idle_share",
    "Rebalancer",
]

# the pool sizes every engine worker gets (the engine-specific ones are added by worker_env)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_ENGINE_ENV = {"vllm": {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}}


@dataclass(frozen=True)
class Cores:
    """The cores this process may use.

    Attributes:
        available: threads the budget may use (>= 1): ``min(len(cpus), floor(quota))``.
        cpus: CPU ids of the affinity mask, sorted.
        quota: the tightest cgroup CPU quota in CPUs (e.g. 1.5), None without one.
        source: ``"affinity"`` or ``"cgroup"`` (which of the two set ``available``).
    """

    available: int
    cpus: tuple[int, ...]
    quota: float | None
    source: str


@dataclass
class Budget:
    """One process's thread budget and how it is shared out (see the module docstring).

    Attributes:
        cores: what :func:`available_cores` found.
        requested: the ``threads`` run parameter (0 = automatic).
        total: the budget: ``requested`` or, for 0, ``cores.available``.
        processes: processes sharing it (torchrun ranks, extraction workers on one node).
        threads: this process's share, ``max(1, total // processes)``.
        worker: threads each engine worker subprocess of this process gets (= ``threads``).
        kernel: ``{"torch_threads", "interop_threads"}`` the kernel runs with (after :func:`apply`).
    """

    cores: Cores
    requested: int
    total: int
    processes: int
    threads: int
    worker: int
    kernel: dict = field(default_factory=dict)

    def as_metrics(self) -> dict:
        """The ``metrics.json["threads"]`` block (engine workers are added by the steps)."""
        return {
            "available": self.cores.available,
            "source": self.cores.source,
            "affinity_cpus": list(self.cores.cpus),
            "cgroup_quota_cpus": self.cores.quota,
            "requested": self.requested,
            "budget": self.total,
            "processes": self.processes,
            "per_process": self.threads,
            "kernel": dict(self.kernel),
            "per_engine_worker": self.worker,
        }


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _walk_up(base: Path, rel: str):
    """``base/rel``, then each parent folder up to ``base`` itself."""
    d = base / rel.strip("/")
    while True:
        yield d
        if d == base or base not in d.parents:
            return
        d = d.parent


def _quota_v2(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")  # "max 100000" or "150000 100000"
    if not text:
        return None
    q, _, period = text.partition(" ")
    if q == "max" or not period:
        return None
    return int(q) / int(period)


def _quota_v1(folder: Path) -> float | None:
    q, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if q is None or period is None or int(q) <= 0 or int(period) <= 0:
        return None
    return int(q) / int(period)


def cgroup_cpu_quota(
    proc_cgroup: str | os.PathLike = "/proc/self/cgroup", root: str | os.PathLike = "/sys/fs/cgroup"
) -> float | None:
    """The tightest CPU quota (in CPUs) of this process's cgroup and the cgroups above it.

    Reads ``proc_cgroup`` (lines ``hierarchy:controllers:path``): the v2 line ``0::path`` against
    ``root`` (or ``root/unified`` on a hybrid host), the v1 line whose controllers include ``cpu``
    against ``root/<controllers>`` (or ``root/cpu``). A folder without a quota, or files that cannot
    be read, count as no limit.

    Returns:
        e.g. 1.5 for ``cpu.max`` = ``"150000 100000"``; None when no quota applies.
    """
    text = _read(Path(proc_cgroup))
    if not text:
        return None
    root = Path(root)
    quotas = []
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        ctrls, _, rel = rest.partition(":")
        if hier == "0" and ctrls == "":  # a v2 mount has cgroup.controllers at its root
            bases, reader, mark = [root, root / "unified"], _quota_v2, "cgroup.controllers"
        elif "cpu" in ctrls.split(","):
            bases, reader, mark = [root / ctrls, root / "cpu"], _quota_v1, ""
        else:
            continue
        for base in bases:
            if (base / mark).exists() if mark else base.is_dir():
                quotas += [q for d in _walk_up(base, rel) if (q := reader(d)) is not None]
                break
    return min(quotas) if quotas else None


def available_cores(
    affinity: set[int] | None = None,
    proc_cgroup: str | os.PathLike = "/proc/self/cgroup",
    root: str | os.PathLike = "/sys/fs/cgroup",
) -> Cores:
    """The cores this process may use: its affinity mask capped by its cgroup CPU quota.

    Args:
        affinity: CPU ids (default ``os.sched_getaffinity(0)``, or ``os.cpu_count()`` CPUs where
            the platform has no affinity call).
        proc_cgroup, root: see :func:`cgroup_cpu_quota` (tests pass fake files).
    """
    if affinity is None:
        if hasattr(os, "sched_getaffinity"):
            affinity = os.sched_getaffinity(0)
        else:
            affinity = set(range(os.cpu_count() or 1))
    cpus = tuple(sorted(affinity))
    quota = cgroup_cpu_quota(proc_cgroup, root)
    by_quota = max(1, math.floor(quota)) if quota is not None else None
    if by_quota is not None and by_quota < len(cpus):
        return Cores(by_quota, cpus, quota, "cgroup")
    return Cores(max(1, len(cpus)), cpus, quota, "affinity")


def plan(
    requested: int, cores: Cores | None = None, param: str = "threads", processes: int = 1
) -> Budget:
    """The budget for ``requested`` threads (0 = all available cores) and its share-out over
    ``processes`` processes of the same kind running at once (each gets ``total // processes``, at
    least 1; each of their engine workers gets the same).

    Raises:
        ValueError: ``requested`` is negative or above the available cores (names ``param``, the
            value, what is available and where that comes from, and the fix).
    """
    cores = cores or available_cores()
    if requested < 0 or requested > cores.available:
        where = (
            f"cgroup CPU quota {cores.quota:g}"
            if cores.source == "cgroup"
            else f"affinity CPUs {list(cores.cpus)}"
        )
        raise ValueError(
            f"{param}={requested}: this process may use {cores.available} cores ({where}); set "
            f"{param} to a value from 1 to {cores.available}, or 0 to use all of them"
        )
    n = requested or cores.available
    per = max(1, n // max(1, int(processes)))
    return Budget(cores, requested, n, max(1, int(processes)), per, worker=per)


_CURRENT: Budget | None = None


def apply(budget: Budget) -> Budget:
    """Size this process's torch pools to ``budget`` (intra-op: ``budget.threads``, inter-op: 1)
    and remember it for the engine workers this process starts (:func:`current`).

    Inter-op threads can only be set before torch first uses them; a later call keeps torch's
    count (recorded as it is in ``budget.kernel``).
    """
    import torch

    global _CURRENT
    torch.set_num_threads(budget.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already started in this process (e.g. a second step in one kernel)
        pass
    budget.kernel = {
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
    }
    _CURRENT = budget
    return budget


def current() -> Budget | None:
    """The budget :func:`apply` set in this process, None before (or after :func:`clear`)."""
    return _CURRENT


def clear() -> None:
    """Forget this process's budget (``threads: -1``): engine workers then get no thread setting."""
    global _CURRENT
    _CURRENT = None


def worker_env(threads: int, engine: str, base: dict | None = None) -> dict:
    """Variables that give an engine worker ``threads`` threads (see the module docstring for what
    each engine reads); variables already in ``base`` (default ``os.environ``) are left out, so a
    user's explicit setting wins.

    Returns:
        ``{name: value}`` to add to the worker's environment.
    """
    base = os.environ if base is None else base
    env = {k: str(int(threads)) for k in THREAD_ENV}
    env.update(_ENGINE_ENV.get(engine, {}))
    return {k: v for k, v in env.items() if k not in base}


def others_running(
    samples: int = 5, interval: float = 0.01, stat: str | os.PathLike = "/proc/stat"
) -> int | None:
    """Runnable threads on the machine besides the caller: the fewest over ``samples`` reads,
    ``interval`` seconds apart, of ``procs_running`` in ``stat`` minus 1 (the reading thread).
    The fewest: a CPU-bound neighbour is runnable in every read, a short burst of other work
    (a process printing, an engine shutting down) is not, and should not change the threads.

    The pauses also let this process's own OpenMP threads stop spinning (libgomp spins briefly
    after a parallel region), so they are not counted as other work.

    Returns:
        A count >= 0, or None where ``stat`` cannot be read or has no ``procs_running`` line (not
        Linux).
    """
    counts = []
    for i in range(samples):
        if i:
            time.sleep(interval)
        text = _read(Path(stat))
        line = next((x for x in (text or "").splitlines() if x.startswith("procs_running ")), None)
        if line is None:
            return None
        counts.append(max(0, int(line.split()[1]) - 1))
    return min(counts)


def idle_share(budget_threads: int, available: int, others: int) -> int:
    """Threads to run with when ``others`` runnable threads of other processes share the
    ``available`` cores: the idle cores, within ``[1, budget_threads]``."""
    return max(1, min(int(budget_threads), int(available) - int(others)))


class Rebalancer:
    """Keeps torch's intra-op pool at the cores other processes leave idle, checked at most every
    ``every_s`` seconds of ``clock`` (see the module docstring for why and what was measured).

    Active only under an automatic budget (:func:`apply` with ``threads: 0``) whose process may use
    every CPU of the machine, and with ``cpu`` (False: the work runs on a GPU, where the host's
    thread count does not set the speed); :meth:`tick` is a no-op otherwise.

    Attributes:
        changes: ``[{"step", "threads", "others"}]``, one entry per re-size (the first check is
            always recorded).
    """

    def __init__(self, every_s: float = 10.0, clock=time.monotonic, sampler=None, cpu=True):
        b = current()
        self.budget = b
        self.active = bool(
            cpu and b is not None and b.requested == 0 and b.cores.available == os.cpu_count()
        )
        self.every_s, self.clock = float(every_s), clock
        self.sampler = sampler or others_running  # (default looked up now: tests replace it)
        self.next_t = -math.inf
        self.changes: list[dict] = []

    def tick(self, step: int) -> None:
        """Check the load if ``every_s`` have passed and re-size the pool when the idle share moved."""
        if not self.active or self.clock() < self.next_t:
            return
        import torch

        others = self.sampler()
        self.next_t = self.clock() + self.every_s
        if others is None:
            self.active = False
            return
        n = idle_share(self.budget.threads, self.budget.cores.available, others)
        if not self.changes or n != torch.get_num_threads():
            torch.set_num_threads(n)
            self.changes.append({"step": int(step), "threads": n, "others": int(others)})
