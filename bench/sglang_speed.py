"""SGLang's speed in one run, with and without aux capture (writes bench/results/sglang_speed.json):

    python bench/sglang_speed.py params/default.yaml [--max-train-prompts 64 --max-new-tokens 64]

Runs 01 (HF generation, unless the run folder has it) and 02b with ``engine: sglang`` and
``measure_engine_speed: true`` (same code as the notebook): plain generation tokens/s through a plain
SGLang engine, prefill tokens/s of the dataset's samples without capture, extraction tokens/s of the
same requests with aux states returned, and their ratio. Engine start-up is excluded and reported
apart. Times depend on machine load: run it on a quiet machine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3nb import steps  # noqa: E402
from eagle3nb.params import RunDir, load_params  # noqa: E402


def main(params_file: str, **overrides) -> dict:
    p = load_params(params_file, interactive=False, engine="sglang", measure_engine_speed=True, **overrides)
    rd = RunDir(p)
    if not rd.generation_manifest.exists():
        steps.generate_step(p, progress=False)
    t0 = time.time()
    out = steps.extract_step(p, progress=False)
    res = {"params_file": params_file, "overrides": overrides, "run_dir": str(rd.root), "step_02b_seconds": round(time.time() - t0, 1),
           "sglang": out["speed"], "n_samples": out["stats"]["n_samples"], "n_tokens": out["stats"]["n_tokens"],
           "load_average_1min_at_end": os.getloadavg()[0], "cpu_count": os.cpu_count()}
    dst = ROOT / "bench" / "results" / "sglang_speed.json"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("params_file")
    ap.add_argument("--run-name", default=None)
    ap.add_argument("--max-train-prompts", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    a = ap.parse_args()
    ov = {k: v for k, v in {"run_name": a.run_name, "max_train_prompts": a.max_train_prompts, "max_new_tokens": a.max_new_tokens}.items() if v is not None}
    main(a.params_file, **ov)
