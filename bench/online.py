"""Online-from-the-engine vs offline training, side by side in one run (issue 44 item 4):

    python bench/online.py params/default.yaml --steps 300 --rounds 2     # -> bench/results/online.json
    python bench/online.py params/default.yaml --from-run outputs/default  # reuse its 01/02a/02b

For each engine (vLLM: 02a's dataset_vllm/, SGLang: 02b's dataset/) and each round, in
alternating order: 03 offline on that engine's dataset, and 03 online with ``online_engine`` set
to that engine on the same 01 output (a run folder holding only ``data/``), the same parameters
and batch plan; then 04's simulator tau of both drafters (``eval_engines: [simulator]``). Records
per run: loss-token-steps/s (03's own figure, held-out evaluation excluded), seconds, the share
of step time waiting for the batch, online the engine's capture seconds and the queue's waits;
per engine the median online/offline ratio over rounds with its spread, and the tau of both.
Bytes under the online run folders are listed, to show no state is there.

GPU (``--device cuda``: bf16, the engine in this process with ``vllm_python: ""`` /
``sglang_python: ""``): the code path exists and is UNRUN (no GPU run of it yet).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3nb.params import load_params  # noqa: E402
from eagle3nb.rundir import RunDir, read_metrics  # noqa: E402
from eagle3nb.engines.versions import installed_engine_version  # noqa: E402


def versions_now(p) -> dict:
    """torch here and each engine's installed version for the run's pythons."""
    import torch

    out = {"torch": torch.__version__}
    for e, py in (("vllm", p.vllm_python), ("sglang", p.sglang_python)):
        try:
            from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS

            out[e] = installed_engine_version(e, DEFAULT_ENGINE_PYTHONS[e] if py is None else py)
        except RuntimeError as err:
            out[e] = f"not installed: {err}"
    return out


def _prepare(p, from_run: Path | None, engines) -> Path:
    """A run folder with 01's output and each engine's offline dataset (made here if absent)."""
    from eagle3nb.steps.extract.from_sglang import extract_sglang_step
    from eagle3nb.steps.extract.from_vllm import extract_vllm_step
    from eagle3nb.steps.generate.step import generate_step

    if from_run is not None:
        return from_run
    generate_step(p, progress=False)
    if "vllm" in engines:
        extract_vllm_step(p, progress=False)
    if "sglang" in engines:
        extract_sglang_step(p, progress=False)
    return RunDir(p).root


def _folder_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _train(p, src: Path, name: str, mode: str, engine: str) -> dict:
    from eagle3nb.steps.evaluate.step import eval_step
    from eagle3nb.steps.train.step import train_step

    q = p.model_copy(
        update={"run_name": name, "training_mode": mode, "eval_engines": ["simulator"]}
    )
    q = q.model_copy(update={"online_engine": engine} if mode == "online" else {"train_on": engine})
    root = RunDir(q).root
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(src / "data", root / "data")
    if mode == "offline":  # the dataset read in place (a link: nothing copied)
        ds = "dataset_vllm" if engine == "vllm" else "dataset"
        (root / ds).symlink_to((src / ds).resolve(), target_is_directory=True)
    t0 = time.time()
    st = train_step(q, progress=False)["stats"]
    wall = time.time() - t0
    ev = eval_step(q, progress=False)
    m = read_metrics(RunDir(q).metrics)
    out = {
        "mode": mode,
        "engine": engine,
        "loss_token_steps_per_s": st["loss_token_steps_per_s"],
        "train_seconds": st["seconds"],
        "step_wall_seconds_incl_start": round(wall, 2),
        "batch_wait_share": st["batch_wait_share"],
        "tau": ev["stats"]["tau"]["trained"],  # 04's simulator, all held-out prompts, k of params
        "eval_prompts": (m.get("eval") or {}).get("n_prompts"),
    }
    if mode == "online":
        out["online"] = st["online"]
        out["run_folder_bytes"] = _folder_bytes(root)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("params", nargs="?", default=str(ROOT / "params" / "default.yaml"))
    ap.add_argument("--steps", type=int, default=300, help="max_steps of each training")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--engines", nargs="+", default=["vllm", "sglang"])
    ap.add_argument("--from-run", type=Path, default=None, help="run folder with 01/02a/02b done")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (UNRUN: bf16, engine in-process)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "online.json")
    a = ap.parse_args(argv)
    over = {"max_steps": a.steps, "interactive": False, "eval_every": 0, "device": a.device}
    over.update(eval_dataset=None, baselines=False)  # 04: the held-out prompts' tau only
    if a.device.startswith("cuda"):
        over.update(dtype="bfloat16", vllm_python="", sglang_python="")
    p = load_params(a.params, **over)
    src = _prepare(p, a.from_run, a.engines)
    runs, summary = [], {}
    for r in range(a.rounds):
        for e in a.engines:
            order = ["offline", "online"] if r % 2 == 0 else ["online", "offline"]
            for mode in order:
                res = _train(p, src, f"bench-online-{e}-{mode}", mode, e)
                res["round"] = r
                runs.append(res)
                print(json.dumps({k: res[k] for k in ("round", "engine", "mode", "loss_token_steps_per_s", "tau")}), flush=True)  # fmt: skip
    for e in a.engines:
        by = {m: [x for x in runs if x["engine"] == e and x["mode"] == m] for m in ("offline", "online")}  # fmt: skip
        ratios = [
            on["loss_token_steps_per_s"] / off["loss_token_steps_per_s"]
            for on, off in zip(by["online"], by["offline"])
        ]
        summary[e] = {
            "online_over_offline_tokens_per_s": {
                "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            },
            "tau": {m: [x["tau"] for x in by[m]] for m in by},
        }  # fmt: skip
    out = {
        "what": "03 online from the serving engine vs offline on that engine's dataset, same params and batch plan",
        "command": " ".join(["python bench/online.py", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "params": a.params,
        "steps": a.steps,
        "device": a.device,
        "versions": versions_now(p),
        "summary": summary,
        "runs": runs,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
