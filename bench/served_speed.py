"""04's served speed of a finished run, each engine with and without the drafter turn about.

    flock /tmp/eagle3nb-heavy.lock env PYTHONPATH=. .venv/bin/python bench/served_speed.py \
        [outputs/default] [--rounds 5] [--from-run] [--out bench/reference_served_speed.json]

``--from-run`` runs nothing: it reads the run's own 04 (its metrics.json, written by the main job
under the lock) into the same JSON, with the load average each engine's runs recorded before and
after serving.

Copies the run folder's inputs of 04 (params.yaml, data/, drafter/, train/'s nothing) to
``<run>-served-speed`` (so the run's own metrics and model card are left alone), runs 04 there
as users run it (``python -m eagle3nb.run <copy>/params.yaml --only 04_eval_acceptance`` with
``reuse_results: false``: two workers per engine, with and without the drafter called turn about,
``speed_rounds`` rounds), in a child under :func:`cpu_time.run_tree` (its whole process tree's
CPU seconds, so other processes' share is not overstated), and writes, per
engine, drafter, k and batch size over the whole set: the speedup's median, min-max and verdict
(:mod:`eagle3nb.timing`), each side's tokens/s over the rounds, tau (the bound), and how quiet the
machine was (load average and the CPU time of other processes before, during and after; the
machine is shared: the lock keeps only eagle3nb's heavy jobs apart).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cpu_time import machine_cpu_seconds, run_tree  # noqa: E402 (bench/, this script's folder)
from eagle3nb.manifest import atomic_write_json, provenance  # noqa: E402
from eagle3nb.params import load_params  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(REPO / "outputs" / "default"))
    ap.add_argument("--rounds", type=int, default=None, help="speed_rounds (default: the run's)")
    ap.add_argument("--out", default=str(REPO / "bench" / "reference_served_speed.json"))
    ap.add_argument("--from-run", action="store_true", help="read the run's own 04, run nothing")
    a = ap.parse_args()
    run = Path(a.run)
    if not (run / "params.yaml").is_file() or not (run / "drafter").is_dir():
        sys.exit(f"run={run}: no params.yaml or drafter/ there; run the main job first")
    if a.from_run:
        return _from_run(run, a.out)
    copy = run.with_name(run.name + "-served-speed")
    shutil.rmtree(copy, ignore_errors=True)
    for part in ("data", "drafter"):
        shutil.copytree(run / part, copy / part)
    p = load_params(run / "params.yaml")
    (copy / "params.yaml").write_text((run / "params.yaml").read_text())
    # 04 as users run it (python -m eagle3nb.run), in a child under bench/cpu_time.py's subreaper:
    # its CPU seconds then hold every engine process it started, orphaned ones too, so the other
    # processes' share is the machine's busy time less the whole tree's
    cmd = [sys.executable, "-m", "eagle3nb.run", str(copy / "params.yaml"), "--only",
           "04_eval_acceptance", "--set", f"run_name={copy.name}", "--set",
           f"outputs_dir={copy.parent}", "--set", "reuse_results=false"]  # fmt: skip
    if a.rounds:
        cmd += ["--set", f"speed_rounds={a.rounds}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    load0, (busy0, tot0) = os.getloadavg(), machine_cpu_seconds()
    tree = run_tree(cmd, cwd=REPO, env=env)
    load1, (busy1, tot1) = os.getloadavg(), machine_cpu_seconds()
    if tree.returncode != 0:
        sys.exit(f"04 failed (rc {tree.returncode}): see {copy}/eval.log")
    m = json.loads((copy / "metrics.json").read_text())
    served = m["eval"]["served"]
    rows = _rows(served["runs"])
    ncpu = os.cpu_count() or 1
    other = max(0.0, (busy1 - busy0) - tree.cpu_seconds)
    res = {
        "what": "04's served speed of the default job's drafter: each engine with and without "
        "the drafter, two workers called turn about, split into speed_rounds rounds; median, "
        "min-max and verdict per engine, drafter, k and batch size (eagle3nb/timing.py)",
        "command": "flock /tmp/eagle3nb-heavy.lock env PYTHONPATH=. .venv/bin/python "
        f"bench/served_speed.py {run} --out {a.out}"
        + (f" --rounds {a.rounds}" if a.rounds else ""),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "run": str(run),
        "speed_rounds": a.rounds or p.speed_rounds,
        "speed_prompts": p.speed_prompts,
        "eval_batch_sizes": list(p.eval_batch_sizes),
        "seconds_04": round(tree.seconds, 1),
        "cpu_seconds_04": round(tree.cpu_seconds, 1),
        "quiet": {
            "cpus": ncpu,
            "load_average_before": [round(x, 2) for x in load0],
            "load_average_after": [round(x, 2) for x in load1],
            "other_processes_cpu_share_during": round(other / max(tot1 - tot0, 1e-9), 3),
            "load_average_per_engine": {r["engine"]: r["load_average"] for r in rows},
            "how": "load average (1, 5, 15 min) before and after; the CPU time of every other "
            "process on the machine during 04 over all CPUs' time (/proc/stat's busy time less "
            "04's whole process tree, bench/cpu_time.py run_tree)",
        },
        "rows": rows,
        "note": served["speed_note"],
        "provenance": provenance(),
    }
    _write(a.out, res, rows)
    print(f"run folder {copy}")


def _rows(runs: list[dict]) -> list[dict]:
    """One row per engine, drafter, k and batch size over the whole set (category ``all``)."""
    rows = []
    for r in runs:
        if r["category"] != "all":
            continue
        sp = r.get("speed") or {}
        rows.append({
            "engine": f"{r['engine']} {r['engine_version']}", "drafter": r["drafter"],
            "k": r["k"], "batch_size": r["batch_size"], "tau": r["tau"],
            "speedup": sp.get("speedup"), "tokens_per_s_with": sp.get("tokens_per_s"),
            "tokens_per_s_without": sp.get("plain_tokens_per_s"), "pairs": sp.get("pairs"),
            "timed_on": sp.get("timed_on"), "greedy_mismatches": r["greedy_mismatches"],
            "load_average": r.get("load_average"),
        })  # fmt: skip
    return rows


def _write(out: str, res: dict, rows: list[dict]) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(out), res)
    print(json.dumps({k: res.get(k) for k in ("seconds_04", "quiet")}, indent=1))
    for r in rows:
        print(f"{r['engine']} {r['drafter']} k={r['k']} b={r['batch_size']}: "
              f"{(r['speedup'] or {}).get('text')}")  # fmt: skip
    print(f"wrote {out}")


def _from_run(run: Path, out: str) -> None:
    """The JSON of the run's own 04 (see the module docstring)."""
    m = json.loads((run / "metrics.json").read_text())
    p = load_params(run / "params.yaml")
    served = m["eval"]["served"]
    rows = _rows(served["runs"])
    res = {
        "what": "04's served speed of the default job's drafter, as the main job's own 04 measured "
        "it: each engine with and without the drafter, two workers called turn about, split into "
        "speed_rounds rounds; median, min-max and verdict per engine, drafter, k and batch size "
        "(eagle3nb/timing.py)",
        "command": "flock /tmp/eagle3nb-heavy.lock env PYTHONPATH=. .venv/bin/python -m "
        f"eagle3nb.run params/default.yaml --set run_name={run.name}; then PYTHONPATH=. "
        f".venv/bin/python bench/served_speed.py {run} --from-run --out {out}",
        "run": str(run),
        "measured": time.strftime(
            "%Y-%m-%d %H:%M UTC", time.gmtime((run / "metrics.json").stat().st_mtime)
        ),
        "speed_rounds": p.speed_rounds,
        "speed_prompts": p.speed_prompts,
        "eval_batch_sizes": list(p.eval_batch_sizes),
        "seconds_04": m["timing"]["notebook_seconds"].get("04_eval_acceptance"),
        "notebook_seconds": m["timing"]["notebook_seconds"],
        "quiet": {
            "cpus": os.cpu_count(),
            "load_average_per_engine": {r["engine"]: r["load_average"] for r in rows},
            "how": "load average (1, 5, 15 min) before each engine's workers started and after "
            "its serving, as 04 recorded them (the machine is shared: the lock keeps only "
            "eagle3nb's heavy jobs apart)",
        },
        "rows": rows,
        "note": served["speed_note"],
        "provenance": provenance(),
    }
    _write(out, res, rows)


if __name__ == "__main__":
    main()
