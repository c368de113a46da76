"""Run the four steps in-process, without Jupyter (e.g. on a GPU box without papermill):

    python bench/steps_direct.py params/default.yaml --device cuda

Same functions the notebooks call (eagle3nb.steps), same artefacts and metrics.json; prints the
eval summary and per-step wall times.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3nb.steps.evaluate.step import eval_step
from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.extract.from_vllm import extract_vllm_step
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.steps.train.step import train_step
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.params import load_params, resolve_device


def main(params_file: str, device: str = "cpu", **overrides) -> dict:
    p = load_params(params_file, device=device, interactive=False, **overrides)
    times = {}
    for name, fn in [
        ("01_generate", generate_step),
        ("02a_extract_vllm", extract_vllm_step),
        ("02b_extract_sglang", extract_sglang_step),
        ("03_train", train_step),
        ("04_eval_acceptance", eval_step),
    ]:
        if name == "02a_extract_vllm" and not p.vllm_extract:
            continue
        t0 = time.time()
        fn(p, progress=False)
        times[name] = round(time.time() - t0, 2)
        print(f"{name}: {times[name]} s", flush=True)
    rd = RunDir(p)
    update_metrics(
        rd.metrics, "timing", {"step_seconds_in_process": times, "device": resolve_device(p)}
    )
    return json.loads(rd.metrics.read_text())


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("params_file")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    ap.add_argument("--outputs-dir", default=None)
    a = ap.parse_args()
    m = main(a.params_file, a.device, **({"outputs_dir": a.outputs_dir} if a.outputs_dir else {}))
    print(json.dumps({k: m[k] for k in ("eval", "train", "timing") if k in m}, indent=1))
