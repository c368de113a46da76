"""The job on a shared machine: idle, and with a CPU-bound neighbour this benchmark starts itself,
with and without the thread budget (issue 16: loaded <= 2x idle).

    PYTHONPATH=. .venv/bin/python bench/contention.py [params/smoke.yaml] [--only 01_generate ...] \
        [--budgets 0,-1] [--out bench/results/contention.json]

For each ``threads`` value in ``--budgets`` (0: the budget, all cores this process may use; -1: no
budget, torch's and the engines' own defaults; N: N threads) the notebooks run twice through
papermill (``eagle3nb.run``, as a user runs them), each time from an empty run folder: idle, then
with a neighbour process running a 2-thread float32 matmul loop (``--load-threads``) on the same
cores. Every run's baseline is the idle run of the same budget in the same invocation: the result
is the ratio loaded / idle per budget, never a time compared with a fixed number. Also recorded:
per-notebook seconds, the neighbour's matmuls/s (it got its share too), the cores
(:func:`eagle3nb.threads.available_cores`), the thread block of each run's metrics.json, and the
load average before and after each run (other work on the machine skews everything).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3nb import threads  # noqa: E402
from eagle3nb.manifest import atomic_write_json  # noqa: E402

# the neighbour: a matmul loop on N threads that writes its iteration count once a second
LOAD_SCRIPT = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
a, b = torch.randn(512, 512), torch.randn(512, 512)
n, last = 0, time.time()
while True:
    a @ b
    n += 1
    if time.time() - last > 1:
        open(sys.argv[2], "w").write(f"{n} {time.time()}")
        last = time.time()
"""


class Neighbour:
    """A CPU-bound process on ``n_threads`` threads (own session, stopped by its group id)."""

    def __init__(self, n_threads: int):
        fd, self.count_file = tempfile.mkstemp(prefix="contention-load-")
        os.close(fd)
        env = dict(os.environ, OMP_NUM_THREADS=str(n_threads), MKL_NUM_THREADS=str(n_threads))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LOAD_SCRIPT, str(n_threads), self.count_file],
            env=env,
            start_new_session=True,
        )
        self.t0 = time.time()

    def stop(self) -> dict:
        """Stop it; returns ``{"seconds", "matmuls", "matmuls_per_s"}`` (512x512 float32)."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        try:
            n, t = open(self.count_file).read().split()
            os.remove(self.count_file)
        except (OSError, ValueError):
            return {"seconds": None, "matmuls": None, "matmuls_per_s": None}
        secs = float(t) - self.t0
        return {
            "seconds": round(secs, 1),
            "matmuls": int(n),
            "matmuls_per_s": round(int(n) / secs, 1) if secs > 0 else None,
        }


def one_run(
    params_file: str, only, run_name: str, outputs_dir: Path, threads_value: int, from_run=None
) -> dict:
    """The notebooks through papermill from an empty run folder (or from a copy of ``from_run``'s
    inputs: its folder without train/, drafter/, figures/ and notebooks/, so ``--only 03_train``
    trains on that run's dataset); what metrics.json says."""
    from eagle3nb.run import run_notebooks

    shutil.rmtree(outputs_dir / run_name, ignore_errors=True)
    if from_run:
        skip = shutil.ignore_patterns("train", "drafter", "figures", "notebooks")
        shutil.copytree(from_run, outputs_dir / run_name, ignore=skip)
    load_before = os.getloadavg()
    t0 = time.time()
    root = run_notebooks(
        params_file,
        only=only,
        overrides={
            "run_name": run_name,
            "outputs_dir": str(outputs_dir),
            "threads": threads_value,
            "interactive": False,
        },
    )
    wall = time.time() - t0
    m = json.loads((Path(root) / "metrics.json").read_text())
    return {
        "wall_seconds": round(wall, 1),
        "notebook_seconds": m.get("timing", {}).get("notebook_seconds"),
        "threads": m.get("threads"),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def main(a) -> dict:
    budgets = [int(x) for x in a.budgets.split(",")]
    outputs = Path(a.outputs_dir)
    cores = threads.available_cores()
    res = {
        "params": a.params_file,
        "only": a.only,
        "from_run": a.from_run,
        "cores": {
            "available": cores.available,
            "source": cores.source,
            "affinity_cpus": list(cores.cpus),
            "cgroup_quota_cpus": cores.quota,
        },
        "cpu_count": os.cpu_count(),
        "neighbour": f"{a.load_threads}-thread 512x512 float32 matmul loop, own process",
        "runs": {},
        "ratio_loaded_over_idle": {},
    }
    for b in budgets:
        label = {0: "budget", -1: "no_budget"}.get(b, f"threads_{b}")
        idle = one_run(a.params_file, a.only, f"contention-{label}-idle", outputs, b, a.from_run)
        res["runs"][f"{label} idle"] = idle
        atomic_write_json(a.out, res)  # what is measured so far survives a killed benchmark
        print(f"{label} idle: {idle['wall_seconds']} s {idle['notebook_seconds']}", flush=True)
        nb = Neighbour(a.load_threads)
        try:
            loaded = one_run(
                a.params_file, a.only, f"contention-{label}-loaded", outputs, b, a.from_run
            )
        finally:
            loaded_load = nb.stop()
        loaded["neighbour"] = loaded_load
        res["runs"][f"{label} loaded"] = loaded
        print(
            f"{label} loaded: {loaded['wall_seconds']} s {loaded['notebook_seconds']}", flush=True
        )
        res["ratio_loaded_over_idle"][label] = round(
            loaded["wall_seconds"] / idle["wall_seconds"], 3
        )
        atomic_write_json(a.out, res)
    res["ratio_is"] = (
        "wall seconds of the notebooks with the neighbour running / without it, same budget, "
        "same invocation (the target of issue 16 is <= 2)"
    )
    atomic_write_json(a.out, res)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("params_file", nargs="?", default=str(REPO / "params" / "smoke.yaml"))
    ap.add_argument("--only", action="append", default=None, help="notebook to run (repeatable)")
    ap.add_argument("--budgets", default="0,-1", help="threads values, comma-separated")
    ap.add_argument("--load-threads", type=int, default=2)
    ap.add_argument("--from-run", default=None, help="run folder whose inputs each run starts from")
    ap.add_argument("--outputs-dir", default=str(REPO / "bench" / "results" / "outputs"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "contention.json"))
    print(json.dumps(main(ap.parse_args()), indent=1))
