"""A finished notebook run again: measured again (``reuse_results: false``, the baseline) against
reading its recorded result back (``reuse_results: true``), through ``eagle3nb.run`` as a user runs
it (papermill, a fresh kernel per notebook), in one invocation.

    PYTHONPATH=. .venv/bin/python bench/rerun.py [outputs/smoke] [--out bench/results/rerun.json]

Needs a finished run folder (its params.yaml). For each of 02a, 02b, 04 and 05 (those present in the
run): first with ``reuse_results: false`` (engines start, probes and speeds are measured again,
the record is written anew), then as is (the record just written is read back). The JSON holds both
wall times per notebook, their ratio, and ``read_back``: the record file was left untouched by
the second run (a step that ran again would have rewritten it).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3nb.manifest import atomic_write_json  # noqa: E402
from eagle3nb.run import run_notebooks  # noqa: E402

NOTEBOOKS = ["02a_extract_vllm", "02b_extract_sglang", "04_eval_acceptance", "05_drift"]


def _timed(params: Path, nb: str, overrides: dict) -> float:
    t0 = time.perf_counter()
    run_notebooks(params, only=[nb], overrides=overrides)
    return round(time.perf_counter() - t0, 2)


def _each(run: Path, params: Path, where: dict, rows: dict) -> None:
    for nb in NOTEBOOKS:
        if not (run / "notebooks" / f"{nb}.ipynb").is_file():
            continue  # the run did not include this notebook
        rec = run / "recorded" / f"{nb}.pt"
        again = _timed(params, nb, {**where, "reuse_results": False})
        stamp = rec.stat().st_mtime_ns if rec.is_file() else None
        read = _timed(params, nb, {**where, "reuse_results": True})
        rows[nb] = {
            "measured_again_s": again,
            "read_back_s": read,
            "speedup": round(again / read, 2),
            "read_back": stamp is not None and rec.stat().st_mtime_ns == stamp,
            "record_bytes": rec.stat().st_size if rec.is_file() else None,
        }
        print(nb, rows[nb], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(REPO / "outputs" / "smoke"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "rerun.json"))
    a = ap.parse_args()
    run = Path(a.run).resolve()
    params = run / "params.yaml"
    if not params.is_file():
        sys.exit(f"run={run}: no params.yaml; give a finished run folder (python -m eagle3nb.run)")
    where = {"outputs_dir": str(run.parent), "run_name": run.name}
    original = params.read_text()  # eagle3nb.run rewrites it with the overrides; put back below
    rows: dict = {}
    try:
        _each(run, params, where, rows)
    finally:
        params.write_text(original)
    out = {
        "run": str(run),
        "machine": platform.platform(),
        "what": "eagle3nb.run --only NB on a finished run: reuse_results false vs true",
        "notebooks": rows,
        "total_measured_again_s": round(sum(r["measured_again_s"] for r in rows.values()), 2),
        "total_read_back_s": round(sum(r["read_back_s"] for r in rows.values()), 2),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(a.out, out)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
