"""Online-from-the-engine vs offline training, side by side in one run (issue 44 item 4):

    python bench/online.py params/default.yaml --steps 300 --rounds 3 --out bench/reference_online.json
    python bench/online.py params/default.yaml --from-run outputs/default  # reuse its 01/02a/02b

For each round and each engine (vLLM: 02a's dataset_vllm/, SGLang: 02b's dataset/), in
alternating order (offline first in even rounds, online first in odd ones): 03 offline on that
engine's dataset, and 03 online with ``online_engine`` set to that engine on the same 01 output (a
run folder holding only ``data/``), the same parameters and so the same batch plan; then 04's
simulator tau of both drafters (``eval_engines: [simulator]``). Round r trains with seed
``seed + r`` (both modes of a round share it): the speed ratio is taken within a round, and the
tau of each mode over the rounds' seeds is its seed noise, against which the online - offline tau
difference is judged. Records per run: loss-token-steps/s (03's own figure, held-out evaluation
excluded), seconds, the share of step time waiting for the batch, the load average before and
after, online the engine's capture seconds and the queue's waits and the bytes and files under the
run folder (to show no state is there). Per engine: the online/offline tokens/s ratio per round as
an :mod:`eagle3nb.timing` figure (median, min-max, verdict), each mode's tokens/s likewise, and the
taus.

GPU (``--device cuda``: bf16, the engine in this process with ``vllm_python: ""`` /
``sglang_python: ""``): the code path exists and is UNRUN (no GPU run of it yet).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3nb.params import load_params  # noqa: E402
from eagle3nb.rundir import RunDir, read_metrics  # noqa: E402
from eagle3nb.engines.versions import installed_engine_version  # noqa: E402
from eagle3nb.timing import summarize  # noqa: E402


def versions_now(p) -> dict:
    """torch and transformers here, each engine's installed version for the run's pythons, the
    eagle3nb commit."""
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__}
    for e, py in (("vllm", p.vllm_python), ("sglang", p.sglang_python)):
        try:
            from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS

            out[e] = installed_engine_version(e, DEFAULT_ENGINE_PYTHONS[e] if py is None else py)
        except RuntimeError as err:
            out[e] = f"not installed: {err}"
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    out["eagle3nb_commit"] = git.stdout.strip() or None
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


def _state_files(root: Path) -> list[str]:
    """Files under ``root`` that could hold captured states: dataset folders, safetensors files
    other than the exported drafter's, the checkpoints' weights and the twin proof's random-weight
    model (``twin/``), the worker's hand-over files."""
    out = [str(d.relative_to(root)) for d in root.iterdir() if d.name.startswith("dataset")]
    for f in root.rglob("*"):
        rel = str(f.relative_to(root))
        if f.name.startswith("capture-") or (
            f.suffix == ".safetensors"
            and not rel.startswith(("drafter/", "train/checkpoints/", "twin/"))
        ):
            out.append(rel)
    return sorted(out)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _train(p, src: Path, name: str, mode: str, engine: str, seed: int) -> dict:
    from eagle3nb.steps.evaluate.step import eval_step
    from eagle3nb.steps.train.step import train_step

    q = p.model_copy(
        update={
            "run_name": name,
            "training_mode": mode,
            "eval_engines": ["simulator"],
            "seed": seed,
        }
    )
    q = q.model_copy(update={"online_engine": engine} if mode == "online" else {"train_on": engine})
    root = RunDir(q).root
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(src / "data", root / "data")
    if mode == "offline":  # the dataset read in place (a link: nothing copied)
        ds = "dataset_vllm" if engine == "vllm" else "dataset"
        (root / ds).symlink_to((src / ds).resolve(), target_is_directory=True)
    load0, t0 = _load(), time.time()
    st = train_step(q, progress=False)["stats"]
    wall, load1 = time.time() - t0, _load()
    ev = eval_step(q, progress=False)
    m = read_metrics(RunDir(q).metrics)
    out = {
        "mode": mode,
        "engine": engine,
        "seed": seed,
        "loss_token_steps_per_s": st["loss_token_steps_per_s"],
        "train_seconds": st["seconds"],
        "step_wall_seconds_incl_start": round(wall, 2),
        "batch_wait_share": st["batch_wait_share"],
        "load_average_1_5_15_before": load0,
        "load_average_1_5_15_after": load1,
        "tau": ev["stats"]["tau"]["trained"],  # 04's simulator, all held-out prompts, k of params
        "eval_prompts": (m.get("eval") or {}).get("n_prompts"),
    }
    if mode == "online":
        out["online"] = st["online"]
        out["run_folder_bytes"] = _folder_bytes(root)
        out["run_folder_state_files"] = _state_files(root)
    return out


def _summary(runs: list[dict], engine: str) -> dict:
    """One engine's figures: the online/offline tokens/s ratio per round (the pair of a round is
    timed back to back, which goes first alternating), each mode's tokens/s, the taus per seed."""
    by = {m: {x["round"]: x for x in runs if x["engine"] == engine and x["mode"] == m} for m in ("offline", "online")}  # fmt: skip
    rounds = sorted(set(by["offline"]) & set(by["online"]))
    rate = {m: [by[m][r]["loss_token_steps_per_s"] for r in rounds] for m in by}
    ratios = [on / off for on, off in zip(rate["online"], rate["offline"])]
    ratio = summarize(ratios, "online / offline loss-token-steps per second", "x", neutral=1.0)
    per_mode = {
        m: summarize(rate[m], f"{m} loss-token-steps per second", "tokens/s", max_rel_spread=0.25)
        for m in rate
    }
    tau = {m: [by[m][r]["tau"] for r in rounds] for m in by}
    diffs = [round(on - off, 6) for on, off in zip(tau["online"], tau["offline"])]
    noise = max(max(t) - min(t) for t in tau.values()) if len(rounds) > 1 else None
    med = statistics.median(diffs) if diffs else None
    return {
        "online_over_offline_tokens_per_s": ratio.as_dict(),
        "tokens_per_s": {m: f.as_dict() for m, f in per_mode.items()},
        "tau": {
            "per_seed": {m: dict(zip([by[m][r]["seed"] for r in rounds], tau[m])) for m in tau},
            "online_minus_offline_per_seed": diffs,
            "median_difference": None if med is None else round(med, 6),
            "seed_noise": None if noise is None else round(noise, 6),
            "seed_noise_is": "the widest max - min of tau over the rounds' seeds, either mode",
            "within_seed_noise": None if noise is None else abs(med) <= noise,
        },
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("params", nargs="?", default=str(ROOT / "params" / "default.yaml"))
    ap.add_argument("--steps", type=int, default=300, help="max_steps of each training")
    ap.add_argument("--rounds", type=int, default=3)
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
    start, load_start = time.time(), _load()
    runs, summary = [], {}
    for r in range(a.rounds):
        for e in a.engines:
            order = ["offline", "online"] if r % 2 == 0 else ["online", "offline"]
            for mode in order:
                res = _train(p, src, f"bench-online-{e}-{mode}", mode, e, p.seed + r)
                res["round"] = r
                runs.append(res)
                print(json.dumps({k: res[k] for k in ("round", "engine", "mode", "loss_token_steps_per_s", "tau", "load_average_1_5_15_after")}), flush=True)  # fmt: skip
    for e in a.engines:
        summary[e] = _summary(runs, e)
    out = {
        "what": "03 online from the serving engine vs offline on that engine's dataset, same params and batch plan",
        "command": " ".join(["python bench/online.py", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "params": a.params,
        "steps": a.steps,
        "steps_note": f"{a.steps} steps per training (the params file's max_steps: {load_params(a.params).max_steps}) so that the whole run fits about 20 minutes; tau after {a.steps} steps is lower than the main job's",
        "rounds": a.rounds,
        "device": a.device,
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_1_5_15_start": load_start,
            "load_average_1_5_15_end": _load(),
            "note": "a shared machine: other agents' work ran beside this one; each run records its load average",
        },
        "wall_seconds": round(time.time() - start, 1),
        "versions": versions_now(p),
        "summary": summary,
        "runs": runs,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
