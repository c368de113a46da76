"""04's wall time with this checkout's code against another commit's, turn about, on one finished run.

    PYTHONPATH=. .venv/bin/python bench/eval_time.py outputs/default --base 6196c1b \
        [--rounds 3] [--lock /tmp/eagle3nb-heavy.lock] [--out bench/reference_eval_time.json]

``--lock``: each 04 run takes this file's lock (flock) for its duration only, so other heavy jobs
on a shared machine run between the runs, never during one.

Issue 43 asks that the main job's 04 take no longer than before the served-speed rounds existed
(commit 6196c1b). For each round (the side that goes first alternates), each side's code runs
``python -m eagle3nb.run <copy>/params.yaml --only 04_eval_acceptance`` on its own copy of the
run's ``data/``, ``drafter/`` and ``params.yaml`` (``reuse_results: false``; the run's own 04 is
left alone), with that code on ``PYTHONPATH`` and as working directory (the base commit checked
out by ``git worktree add`` under /tmp). Per run (``fields`` in the JSON says each): wall
seconds, CPU seconds of 04's whole process tree (engine workers and their orphaned processes
included: :func:`cpu_time.run_tree`), the machine's load average before and after and the share
of CPU time other processes took meanwhile (/proc/stat less that tree). Per round: the ratio
this / base; the median with its spread and verdict (:mod:`eagle3nb.timing`: neutral 1.0;
fewer than 3 rounds, or a spread wider than the effect, is disturbed). Each side's timed pairs
per setting (its plain calls beside the drafter's) are read from its metrics.json: a count load
does not move.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3nb import timing  # noqa: E402
from eagle3nb.manifest import atomic_write_json, provenance  # noqa: E402
from cpu_time import machine_cpu_seconds, run_tree  # noqa: E402 (bench/, this script's folder)


FIELDS = {
    "seconds": "wall seconds of 04's process (python -m eagle3nb.run --only 04_eval_acceptance), "
    "from its start to its exit",
    "cpu_seconds": "user + system CPU seconds of 04's whole process tree: the run, its notebook "
    "kernel, its engine workers and every process those started, the orphaned ones too (run "
    "under a subreaper that waits for each: bench/cpu_time.py run_tree)",
    "other_cpu_share": "(machine busy CPU seconds from /proc/stat over the run - cpu_seconds) / "
    "machine total CPU seconds (all CPUs) over the run: the CPU other processes took; 04's own "
    "engine processes are not in it (up to commit b780cec, cpu_seconds was RUSAGE_CHILDREN: "
    "processes not waited for by their parents were in neither field's own side, so this share "
    "counted them as others and overstated the other load)",
    "descendants_killed": "processes of 04's tree still running 120 s after 04 exited, killed then "
    "(their CPU up to then is in cpu_seconds)",
    "notebook_seconds": "04's notebook time as its metrics.json records it",
}


def _base_checkout(ref: str) -> Path:
    """A worktree of ``ref`` under /tmp (made once), with the ignored ``models`` link if any."""
    sha = subprocess.check_output(["git", "-C", str(REPO), "rev-parse", ref], text=True).strip()
    path = Path(f"/tmp/eagle3nb-base-{sha[:12]}")
    if not (path / "eagle3nb").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), sha],
                       check=True, capture_output=True)  # fmt: skip
    return path


def _copy_run(run: Path, name: str, code: Path) -> tuple[Path, list[str]]:
    """The run's inputs of 04 copied to ``name``; its params.yaml without the keys ``code``'s
    schema does not know (parameters added since the base commit: their defaults are 04's
    behaviour there). Returns the copy and the keys dropped."""
    import yaml

    copy = run.with_name(name)
    shutil.rmtree(copy, ignore_errors=True)
    for part in ("data", "drafter"):
        shutil.copytree(run / part, copy / part)
    env = {**os.environ, "PYTHONPATH": str(code)}
    known = json.loads(subprocess.check_output([sys.executable, "-c", "import json; from "
        "eagle3nb.params import RunParams; print(json.dumps(list(RunParams.model_fields)))"],
        cwd=code, env=env, text=True))  # fmt: skip
    p = yaml.safe_load((run / "params.yaml").read_text())
    dropped = sorted(k for k in p if k not in known)
    (copy / "params.yaml").write_text(yaml.safe_dump({k: v for k, v in p.items() if k in known},
                                                     sort_keys=False))  # fmt: skip
    return copy, dropped


def _one(code: Path, run: Path, side: str, i: int, lock: str | None) -> dict:
    copy, dropped = _copy_run(run, f"{run.name}-time-{side}", code)
    cmd = [sys.executable, "-m", "eagle3nb.run", str(copy / "params.yaml"), "--only",
           "04_eval_acceptance", "--set", f"run_name={copy.name}", "--set",
           f"outputs_dir={copy.parent}", "--set", "reuse_results=false"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code)}
    shared = REPO.parent / "shared" / "models"  # the base worktree under /tmp has no ../shared
    if shared.is_dir():
        env.setdefault("EAGLE3NB_MODEL_PATH", str(shared))
    held = open(lock, "a") if lock else None  # noqa: SIM115 (closed below)
    if held:
        fcntl.flock(held, fcntl.LOCK_EX)
    load0, (b0, t0m) = os.getloadavg(), machine_cpu_seconds()
    # the whole process tree of 04, its engine workers' orphaned processes too, reaped before the
    # second reading (bench/cpu_time.py: RUSAGE_CHILDREN alone counted those as other load)
    tree = run_tree(cmd, cwd=code, env=env, capture_output=True, text=True)
    load1, (b1, t1m) = os.getloadavg(), machine_cpu_seconds()
    proc, own = tree.proc, tree.cpu_seconds
    if held:
        held.close()
    if proc.returncode != 0:
        sys.exit(f"round {i} {side}: 04 failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}"
                 f"\n{proc.stderr[-3000:]}")  # fmt: skip
    m = json.loads((copy / "metrics.json").read_text())
    return {
        "side": side, "round": i, "seconds": round(tree.seconds, 1), "cpu_seconds": round(own, 1),
        "descendants_killed": len(tree.killed), "params_dropped": dropped,
        "notebook_seconds": m.get("timing", {}).get("notebook_seconds", {}).get(
            "04_eval_acceptance"),
        "load_average_before": [round(x, 2) for x in load0],
        "load_average_after": [round(x, 2) for x in load1],
        "other_cpu_share": round(max(0.0, (b1 - b0) - own) / max(t1m - t0m, 1e-9), 3),
        "tau": {e: v.get("tau") for e, v in m["eval"].get("served_by", {}).items()},
        "speed_pairs": {f"{r['engine']} {r['drafter']} b{r['batch_size']}":
                        (r.get("speed") or {}).get("pairs")
                        for r in m["eval"]["served"]["runs"] if r["category"] == "all"},
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(REPO / "outputs" / "default"))
    ap.add_argument("--base", default="6196c1b", help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lock", default=None, help="a flock file each 04 run holds")
    ap.add_argument("--out", default=str(REPO / "bench" / "reference_eval_time.json"))
    a = ap.parse_args()
    run = Path(a.run).resolve()
    if not (run / "params.yaml").is_file() or not (run / "drafter").is_dir():
        sys.exit(f"run={run}: no params.yaml or drafter/ there; run the main job first")
    if a.rounds < 1:
        sys.exit(f"--rounds={a.rounds}: give 1 or more (3 or more for a measurement)")
    sides = {"this": REPO, "base": _base_checkout(a.base)}
    runs: list[dict] = []
    res = {
        "what": "04's wall time on one finished run: this checkout's code against --base's, "
        "turn about, each on its own copy of the run's inputs",
        "command": "PYTHONPATH=. .venv/bin/python bench/eval_time.py "
        f"{a.run} --base {a.base} --rounds {a.rounds} --lock {a.lock} --out {a.out}",
        "base": a.base,
        "fields": FIELDS,
        "runs": runs,
        "provenance": provenance(),
    }
    for i in range(a.rounds):
        for side in ("this", "base") if i % 2 == 0 else ("base", "this"):
            runs.append(_one(sides[side], run, side, i, a.lock))
            print(json.dumps(runs[-1]), flush=True)
            _summarize(res, runs, a.out)


def _summarize(res: dict, runs: list[dict], out: str) -> None:
    """The per-round ratio this / base and each side's seconds; the JSON rewritten each run."""
    by = {(r["round"], r["side"]): r for r in runs}
    rounds = sorted({r["round"] for r in runs if (r["round"], "base") in by
                     and (r["round"], "this") in by})  # fmt: skip
    for key, what in (("seconds", "wall"), ("cpu_seconds", "CPU")):
        ratios = [by[i, "this"][key] / by[i, "base"][key] for i in rounds]
        res[f"{what}_ratio_this_over_base"] = timing.summarize(
            ratios, f"04's {what} seconds, this code / base", neutral=1.0).as_dict()  # fmt: skip
        for side in ("this", "base"):
            vals = [r[key] for r in runs if r["side"] == side]
            res[f"{what}_seconds_{side}"] = timing.summarize(
                vals, f"04's {what} seconds ({side})", unit="s", max_rel_spread=0.5).as_dict()  # fmt: skip
    atomic_write_json(Path(out), res)


if __name__ == "__main__":
    main()
