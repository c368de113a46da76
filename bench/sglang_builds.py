"""SGLang engine builds in one worker, SGLang's spawn against eagle3nb's forkserver, in one run.

    PYTHONPATH=. .venv/bin/python bench/sglang_builds.py [--rounds 2] [--out bench/results/sglang_builds.json]

Each round starts two workers in turn (``EAGLE3NB_SGLANG_FORKSERVER=0``, then unset, the
default), through ``start_sglang``, 02b's own start, with nothing kept
(``EAGLE3NB_KEEP_ENGINES=0``). Each worker then builds three engines by capturing: float32 (its
first engine), bfloat16 (02b's drift in the other dtype) and float32 again. Every number is wall
seconds of one call, engine build included. Default target, CPU, the machine's load average
recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3nb.engines import sglang_forkserver  # noqa: E402
from eagle3nb.engines.sglang_helpers import start_sglang  # noqa: E402
from eagle3nb.manifest import atomic_write_json  # noqa: E402
from eagle3nb.target import models  # noqa: E402

IDS = [0, 1, 3]
SAMPLES = [[1] + list(range(5, 105))] * 8
STEPS = ("worker_start", "first_engine_float32", "bfloat16_engine", "float32_engine_again")


def one_worker(path: Path, workdir: Path) -> dict:
    """Seconds of the worker start and of each capture call that builds an engine."""
    t = time.perf_counter()
    ctx = json.loads((path / "config.json").read_text())["max_position_embeddings"]  # as 02b
    client = start_sglang(path, "float32", "cpu", 0, None, workdir, ctx)
    out = {"worker_start": time.perf_counter() - t}
    with client:
        for name, dtype in zip(STEPS[1:], ("float32", "bfloat16", "float32")):
            t = time.perf_counter()
            client.capture(SAMPLES, IDS, dtype=dtype)
            out[name] = time.perf_counter() - t
    return {k: round(v, 2) for k, v in out.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "sglang_builds.json"))
    a = ap.parse_args(argv)
    os.environ["EAGLE3NB_KEEP_ENGINES"] = "0"
    path = Path(models.resolve_model("stories260K-hd32"))
    work = Path(a.out).parent / "sglang_builds_work"
    work.mkdir(parents=True, exist_ok=True)
    runs = {"spawn": [], "forkserver": []}
    load = [os.getloadavg()]
    for _ in range(a.rounds):
        for mode in ("spawn", "forkserver"):
            if mode == "spawn":
                os.environ[sglang_forkserver.ENV] = "0"
            else:
                os.environ.pop(sglang_forkserver.ENV, None)
            runs[mode].append(one_worker(path, work))
            print(mode, runs[mode][-1], flush=True)
    load.append(os.getloadavg())
    res = {
        "what": __doc__.strip().splitlines()[0],
        "model": str(path),
        "rounds": a.rounds,
        "loadavg_start_end": load,
        "runs": runs,
        "median_seconds": {
            m: {s: statistics.median(r[s] for r in rs) for s in STEPS} for m, rs in runs.items()
        },
    }
    atomic_write_json(Path(a.out), res)
    print(json.dumps(res["median_seconds"], indent=1))
    return res


if __name__ == "__main__":
    main()
