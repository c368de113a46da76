"""A vLLM CPU worker serving a finished run's drafter with 1 and with 2 threads, turn about, on a
quiet machine and beside one busy process (why 04's two vLLM workers get half the budget each,
eagle3nb/steps/evaluate/bench.py ``_half_budget``).

    flock /tmp/eagle3nb-heavy.lock env PYTHONPATH=. .venv/bin/python bench/worker_threads.py \
        [outputs/default] [--prompts 12] [--rounds 3] [--out bench/reference_worker_threads.json]

Two workers of the run's vLLM (``vllm_python``), one with 1 thread and one with 2, each serve the
first ``--prompts`` story openings one request at a time (k = 5, 96 new tokens, the run's
drafter); per round the seconds of each, which goes first alternating; then the same with a
``while True: pass`` process beside them. The JSON holds every round's seconds and the load
average before each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3nb.engines.pool import open_engine  # noqa: E402
from eagle3nb.engines.vllm_helpers import vllm_python  # noqa: E402
from eagle3nb.manifest import atomic_write_json, provenance  # noqa: E402
from eagle3nb.params import load_params  # noqa: E402
from eagle3nb.target import models  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(REPO / "outputs" / "default"))
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "reference_worker_threads.json"))
    a = ap.parse_args()
    run = Path(a.run)
    if not (run / "drafter").is_dir():
        sys.exit(f"run={run}: no drafter/ there; run the main job first")
    from transformers import AutoTokenizer

    p = load_params(run / "params.yaml")
    path = str(models.resolve_model(p.model))
    tok = AutoTokenizer.from_pretrained(path)
    lines = [x.strip() for x in (REPO / p.prompts_file).read_text().splitlines() if x.strip()]
    prompts = [tok(x)["input_ids"] for x in lines[: a.prompts]]
    eos, drafter = [tok.eos_token_id], str(run / "drafter")
    clients = {t: open_engine("vllm", path, "float32", {}, python=vllm_python(p),
                              workdir_parent=str(run.parent), threads=t) for t in (1, 2)}  # fmt: skip
    for c in clients.values():
        c.serve_acceptance(drafter, [prompts[0]], 5, 2, eos)  # warm-up
    res = {"what": __doc__.splitlines()[0], "command": " ".join(sys.argv), "seconds": {},
           "load_average_before": {}, "provenance": provenance()}  # fmt: skip
    try:
        for busy in (False, True):
            key = "beside one busy process" if busy else "no process started beside"
            res["load_average_before"][key] = [round(x, 2) for x in os.getloadavg()]
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            for r in range(a.rounds):
                for t in (1, 2) if r % 2 == 0 else (2, 1):
                    t0 = time.perf_counter()
                    for q in prompts:
                        clients[t].serve_acceptance(drafter, [q], 5, 96, eos)
                    secs = round(time.perf_counter() - t0, 2)
                    res["seconds"].setdefault(f"{key}, {t} thread(s)", []).append(secs)
                    print(json.dumps(res["seconds"]), flush=True)
            if hog is not None:
                hog.kill()
    finally:
        for c in clients.values():
            c.close()
    atomic_write_json(Path(a.out), res)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
