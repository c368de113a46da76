"""Offline vs online training on one params file, CPU or GPU, with the numbers issue 4 asks for:

    python bench/online_offline.py params/default.yaml            # -> bench/results/online_offline.json

Runs the notebooks (papermill, as a user would) twice on the same 01 output: offline (01, 02b, 03,
04) and online (03 and 04 on the same generated data, no dataset on disk). Then re-extracts the
same samples with ``aux_storage: int8`` and with 2 extraction workers. Records, from each run's
metrics.json: extraction tokens/s with and without capture (same process, ratio), extraction incl.
writing, training tokens/s offline vs online (and the target's share online), whole pipeline
time, tau of both drafters, the exact disk estimate vs the bytes written, and the int8 error.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3nb.steps.evaluate.step import eval_step
from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.steps.train.step import train_step
from eagle3nb.rundir import RunDir
from eagle3nb.params import load_params
from eagle3nb.rundir import update_metrics


def _run(params_file, only, overrides, direct: bool) -> Path:
    """The notebooks through papermill, or (``direct``, on a box without Jupyter) the same step
    functions in this process."""
    if not direct:
        from eagle3nb.run import run_notebooks

        return run_notebooks(params_file, only=only, overrides=overrides)
    p = load_params(params_file, interactive=False, **overrides)
    fns = {
        "01_generate": generate_step,
        "02b_extract_sglang": extract_sglang_step,
        "03_train": train_step,
        "04_eval_acceptance": eval_step,
    }
    times = {}
    for name in only or ["01_generate", "02b_extract_sglang", "03_train", "04_eval_acceptance"]:
        t0 = time.time()
        fns[name](p, progress=False)
        times[name] = round(time.time() - t0, 2)
        print(f"{p.run_name} {name}: {times[name]} s", flush=True)
    update_metrics(RunDir(p).metrics, "timing", {"notebook_seconds": times, "in_process": True})
    return RunDir(p).root


def _m(root: Path) -> dict:
    return json.loads((root / "metrics.json").read_text())


def _shard_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("shard-*.safetensors"))


def main(params_file: str, outputs_dir: str, device: str = "cpu", direct: bool = False) -> dict:
    out = Path(outputs_dir)
    ov = {
        "outputs_dir": str(out),
        "device": device,
        "vllm_extract": False,
        "eval_engines": ["simulator"],
    }  # the HF path: online training is HF-only
    t0 = time.time()
    off = _run(params_file, None, dict(ov, run_name="bench-offline"), direct)
    t_off = time.time() - t0
    on_root = out / "bench-online"
    shutil.rmtree(on_root, ignore_errors=True)
    (on_root / "data").mkdir(parents=True)
    for f in (off / "data").iterdir():  # the same 01 output: online needs nothing else
        shutil.copy(f, on_root / "data" / f.name)
    t0 = time.time()
    on = _run(
        params_file,
        ["03_train", "04_eval_acceptance"],
        dict(ov, run_name="bench-online", training_mode="online"),
        direct,
    )
    t_on = time.time() - t0
    mo, mn = _m(off), _m(on)
    import os

    import torch

    res = {
        "params": params_file,
        "device": device,
        "runner": "step functions in-process" if direct else "papermill notebooks",
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": None,
    }
    res["extraction"] = {
        "hf-transformers": mo["extract"].get("capture_speed"),
        "extraction_incl_writing_tokens_per_s": mo["extract"]["tokens_per_s"],
        "n_tokens": mo["extract"]["n_tokens"],
    }
    res["disk"] = {
        "estimated_shard_bytes": mo["extract"]["disk"]["shard_bytes"],
        "written_shard_bytes": _shard_bytes(off / "dataset"),
        "formula": mo["extract"]["disk"]["formula"],
    }
    res["training"] = {
        "offline": {
            "seconds": mo["train"]["seconds"],
            "loss_token_steps_per_s": mo["train"]["loss_token_steps_per_s"],
            "final_loss": mo["train"]["final_loss"],
        },
        "online": {
            "seconds": mn["train"]["seconds"],
            "loss_token_steps_per_s": mn["train"]["loss_token_steps_per_s"],
            "final_loss": mn["train"]["final_loss"],
            **mn["train"].get("online", {}),
        },
    }
    res["tau"] = {"offline": mo["eval"]["tau"], "online": mn["eval"]["tau"]}
    res["pipeline_seconds"] = {
        "offline_01_02b_03_04": round(t_off, 1),
        "offline_notebooks": mo["timing"]["notebook_seconds"],
        "online_01_03_04": round(mo["timing"]["notebook_seconds"]["01_generate"] + t_on, 1),
        "online_notebooks": mn["timing"]["notebook_seconds"],
    }
    # the same samples re-extracted: int8 storage, and 2 worker processes
    for name, extra in (("int8", {"aux_storage": "int8"}), ("workers2", {"extract_workers": 2})):
        root = out / f"bench-{name}"
        shutil.rmtree(root, ignore_errors=True)
        (root / "data").mkdir(parents=True)
        for f in (off / "data").iterdir():
            shutil.copy(f, root / "data" / f.name)
        p = load_params(
            params_file, interactive=False, **dict(ov, run_name=f"bench-{name}", **extra)
        )
        t0 = time.time()
        r = extract_sglang_step(p, progress=False)
        res[f"extract_{name}"] = {
            "seconds": round(time.time() - t0, 2),
            "tokens_per_s": r["stats"]["tokens_per_s"],
            "shard_bytes": _shard_bytes(RunDir(p).dataset),
            "estimated_shard_bytes": r["stats"]["disk"]["shard_bytes"],
            "aux_quantization": r["manifest"].get("aux_quantization"),
        }
    res["int8_size_ratio"] = round(
        res["extract_int8"]["shard_bytes"] / res["disk"]["written_shard_bytes"], 4
    )
    res["load_average_at_end"] = os.getloadavg()
    dst = ROOT / "bench" / "results" / f"online_offline_{device.replace(':', '')}.json"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("params_file")
    ap.add_argument("--outputs-dir", default=str(ROOT / "bench" / "results" / "outputs"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--direct",
        action="store_true",
        help="run the step functions in-process (no Jupyter needed)",
    )
    ap.add_argument("--out", default=None, help="also copy the JSON here")
    a = ap.parse_args()
    r = main(a.params_file, a.outputs_dir, a.device, a.direct)
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=1))
    print(json.dumps(r, indent=1))
