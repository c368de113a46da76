"""Quality levers of the default job (issue 16): held-out tau(k=5) per data setting and training
budget, through the step functions the notebooks call (01 generate, 02b extract at SGLang's
capture point, 03 train, 04 evaluate), so the chosen default is a measured one.

    python bench/quality_sweep.py --device cuda --out-dir DIR      # the sweep (GPU: minutes)
    python bench/quality_sweep.py --cpu-step-seconds                # per-step CPU time here

Data settings ``D<n>``: ``params/default.yaml`` with ``sampled_continuations: n`` (n extra
continuations per train prompt at ``sample_temperature`` 0.8; D0 is today's data). Each is generated
and extracted once (``extract_engine: hf``: HF at SGLang's capture point, proven equal to SGLang's
own capture in 02b), then each training budget of that setting trains from it in its own run folder
(a copy of the data) and is evaluated by 04's simulator on the held-out prompts (``eval_engines:
[simulator]``: on the main job vLLM's served tau equalled the simulator's, 3.551 both). Training runs in
float32 without compile on the sweep's device (the CPU default's function); the x axis users pay
for is CPU seconds, so ``--cpu-step-seconds`` times 20 steps of each drafter shape on this machine
(2 threads) and the JSON's ``cpu_seconds_est`` = steps x that time (an estimate, labelled so).

Writes ``quality_sweep.json`` (rewritten after every run, so a cut-short sweep keeps what ran).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the recipe every run starts from (params/default.yaml's until 2026-12-02, which the stored sweeps
# ran against); each run's train overrides below, and in the sweep JSONs, are relative to it
RECIPE = {"draft_intermediate_size": 688, "batch_size": 16, "ttt_steps": 7}
# (data setting, train overrides) in order of priority: the sweep stops adding runs near --budget
RUNS = [
    (0, {"max_steps": 1000}),  # the default until 2026-12-02
    (0, {"max_steps": 1000, "seed": 1}),  # seed noise
    (3, {"max_steps": 1000}),
    (3, {"max_steps": 3000}),
    (0, {"max_steps": 3000}),
    (0, {"max_steps": 1000, "ttt_steps": 5}),  # k = 5 reads TTT steps 0-4 only
    (0, {"max_steps": 2000, "batch_size": 8}),  # the same samples in twice the updates
    (0, {"max_steps": 2000, "batch_size": 8, "ttt_steps": 5}),
    (0, {"max_steps": 3000, "batch_size": 8, "ttt_steps": 5}),
    (0, {"max_steps": 4000, "batch_size": 4, "ttt_steps": 5}),
    (0, {"max_steps": 6000, "batch_size": 8, "ttt_steps": 5}),
]
BASE = dict(extract_engine="hf", measure_engine_speed=False, drift_samples=0,
    drift_both_dtypes=False, vllm_extract=False, eval_engines=["simulator"], baselines=False, k_sweep=False,
    generate_speed_engines=[], precision="float32", torch_compile="off", attention="eager",
    eval_every=0, interactive=False, tracking=[])  # fmt: skip


DATA_KEYS = ("sampled_prefix_tokens",)  # run overrides that change 01's data, not 03's training


def _data(d: int, tr: dict) -> tuple[str, dict]:
    """``(run name, 01 parameters)`` of a run's data setting: ``D<n>``, with ``p<N>`` when the
    extra continuations sample only their first N tokens."""
    pre = tr.get("sampled_prefix_tokens", 0)
    return f"data_D{d}" + (f"p{pre}" if pre else ""), {
        "sampled_continuations": d,
        "sampled_prefix_tokens": pre,
    }


def _name(d: int, tr: dict) -> str:
    return f"D{d}_" + "_".join(f"{k}{v}" for k, v in tr.items())


def _train_eval(a, name: str, d: int, tr: dict, kw: dict) -> dict:
    """One run: a copy of data setting ``d``'s run folder, 03's ``train_step`` with ``tr`` over
    :data:`RECIPE`, 04's ``eval_step``. Keys of ``tr`` that are TrainConfig fields but no run
    parameters (``grad_clip``, ``min_lr_ratio``) are set on the TrainConfig 03 builds."""
    from dataclasses import replace

    from eagle3nb.params import RunParams, load_params
    from eagle3nb.rundir import RunDir
    from eagle3nb.steps.train import step as train_mod
    from eagle3nb.steps.evaluate.step import eval_step

    tc_only = {k: v for k, v in tr.items() if k not in RunParams.model_fields}
    rp = {k: v for k, v in tr.items() if k not in tc_only and k not in DATA_KEYS}
    data_name, data_kw = _data(d, tr)
    src = RunDir(load_params(a.params, run_name=data_name, **kw, **data_kw)).root
    p = load_params(a.params, run_name=name, **kw, **data_kw, **{**RECIPE, **rp})
    dst = RunDir(p).root
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("train", "drafter", "figures"))
    base = train_mod._train_config  # patched for this run only: sequential runs share a process
    train_mod._train_config = lambda q: replace(base(q), **tc_only)
    try:
        t0 = time.time()
        out = train_mod.train_step(p, progress=False)
        t1 = time.time()
    finally:
        train_mod._train_config = base
    ev = eval_step(p, progress=False)["stats"]
    return {
        "data": data_name,
        "train": tr,
        "train_s_on_device": round(t1 - t0, 1),
        "eval_s": round(time.time() - t1, 1),
        "tau": ev["tau"]["trained"],
        "final_loss": out["stats"]["final_loss"],
        "steps": out["stats"]["steps"],
    }


def sweep(a) -> dict:
    """Generate and extract each data setting once, then train and evaluate every run: one after
    another, or ``--parallel`` N at a time in processes of their own (``threads`` pinned to
    ``--threads`` each, so N x threads should not exceed the cores)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing as mp

    from eagle3nb.params import load_params
    from eagle3nb.steps.extract.from_sglang import extract_sglang_step
    from eagle3nb.steps.generate.step import generate_step

    od = Path(a.out_dir)
    od.mkdir(parents=True, exist_ok=True)
    res = {"started": time.time(), "device": a.device, "runs": {}, "data": {}}
    res["parallel"], res["threads"] = a.parallel, a.threads
    t_start = time.time()

    def save():
        res["wall_s"] = time.time() - t_start
        (od / "quality_sweep.json").write_text(json.dumps(res, indent=1, default=str))

    kw = dict(BASE, device=a.device, outputs_dir=str(od / "runs"), **a.extra)
    runs = RUNS[: a.max_runs] if a.max_runs else RUNS
    for data_name, data_kw in sorted(dict(_data(d, tr) for d, tr in runs).items()):
        p = load_params(a.params, run_name=data_name, **kw, **data_kw)  # all cores: one at a time
        t0 = time.time()
        g = generate_step(p, progress=False)
        t1 = time.time()
        extract_sglang_step(p, progress=False)
        res["data"][data_name] = {
            **data_kw,
            "train_records": sum(1 for r in g["records"] if r["split"] == "train"),
            "generated_tokens": g["stats"]["generated_tokens"],
            "generate_s": round(t1 - t0, 1),
            "extract_s": round(time.time() - t1, 1),
        }
    save()
    if a.threads:
        kw["threads"] = a.threads

    def done(name, rec):
        res["runs"][name] = rec
        print(name, rec, flush=True)
        save()

    if a.parallel <= 1:
        for d, tr in runs:
            if time.time() - t_start > a.budget:
                res.setdefault("skipped", []).append(_name(d, tr))
                continue
            done(_name(d, tr), _train_eval(a, _name(d, tr), d, tr, kw))
    else:
        ctx = mp.get_context("spawn")  # no fork of a process that already ran torch threads
        with ProcessPoolExecutor(a.parallel, mp_context=ctx, max_tasks_per_child=1) as ex:
            futs = {
                ex.submit(_train_eval, a, _name(d, tr), d, tr, kw): _name(d, tr) for d, tr in runs
            }
            for f in as_completed(futs):
                try:
                    done(futs[f], f.result())
                except Exception as e:  # one failed run must not lose the others
                    res.setdefault("failed", {})[futs[f]] = repr(e)
                    save()
    save()
    return res


def _shape(tr: dict) -> tuple[int, int, int]:
    """What a training step's CPU time depends on: (MLP width, batch size, TTT steps)."""
    r = {**RECIPE, **tr}
    return (r["draft_intermediate_size"], r["batch_size"], r["ttt_steps"])


def _shape_key(shape: tuple[int, int, int]) -> str:
    return "w{}_b{}_t{}".format(*shape)


def cpu_step_seconds(a) -> dict:
    """Seconds per training step on this machine's CPU for each step shape of RUNS (MLP width,
    batch size, TTT steps): 23 steps of 03's training (``train_step``, the function the notebook
    calls) on ``--cpu-run``'s dataset, 2 threads, the mean of the last 20."""
    import torch

    from eagle3nb.params import load_params
    from eagle3nb.rundir import RunDir
    from eagle3nb.steps.train.step import train_step

    torch.set_num_threads(2)
    out = {}
    for shape in sorted({_shape(tr) for _, tr in RUNS}):
        w, b, t = shape
        kw = dict(BASE, device="cpu", outputs_dir=a.cpu_outputs, run_name=a.cpu_run)
        src = RunDir(load_params(a.params, **kw)).root
        name = f"cpu_step_{_shape_key(shape)}"
        p = load_params(a.params, **dict(kw, run_name=name), max_steps=23, log_every=1,
            draft_intermediate_size=w, batch_size=b, ttt_steps=t)  # fmt: skip
        shutil.rmtree(RunDir(p).root, ignore_errors=True)
        shutil.copytree(src, RunDir(p).root, ignore=shutil.ignore_patterns("train", "drafter"))
        with contextlib.redirect_stdout(sys.stderr):  # progress lines: stdout keeps the JSON
            train_step(p, progress=False)
        secs = json.loads((RunDir(p).train / "step_times.json").read_text())["seconds"][3:]
        out[_shape_key(shape)] = round(sum(secs) / len(secs), 4)
        shutil.rmtree(RunDir(p).root, ignore_errors=True)
    return out


def merge(sweeps: list[Path], cpu: Path, out: Path) -> dict:
    """One reference JSON from device sweep JSONs or earlier references (later ones win on a
    name) and a ``--cpu-step-seconds`` JSON: each run gets ``cpu_step_s`` (its shape's measured
    CPU seconds per step) and ``cpu_seconds_est`` = steps x that (an estimate of 03's training
    time on this CPU)."""
    steps = json.loads(cpu.read_text())
    for f in sweeps:  # an earlier reference: its step times stand where this CPU JSON has none
        steps = {**json.loads(f.read_text()).get("cpu_step_seconds", {}), **steps}
    res = {"runs": {}, "data": {}, "cpu_step_seconds": steps, "sweeps": []}
    res["cpu_seconds_est_is"] = (
        "steps x cpu_step_s: the run's step shape (MLP width, batch, TTT steps) timed by "
        "--cpu-step-seconds on 2 idle cores of this machine kind; an estimate, not a CPU run"
    )
    for f in sweeps:
        r = json.loads(f.read_text())
        if "sweeps" in r:  # an earlier merged reference: keep its sweeps' records as they are
            res["sweeps"] += r["sweeps"]
        else:
            res["sweeps"].append({k: v for k, v in r.items() if k not in ("runs", "data")})
        res["data"].update(r["data"])
        res["runs"].update(r["runs"])
    for v in res["runs"].values():
        v["cpu_step_s"] = steps[_shape_key(_shape(v["train"]))]
        v["cpu_seconds_est"] = round(v["steps"] * v["cpu_step_s"])
    out.write_text(json.dumps(res, indent=1))
    return res


def figure(ref: Path, out_dir: Path) -> Path:
    """tau against estimated CPU training seconds, one trace per data setting and recipe, from a
    sweep JSON (``bench/reference_quality_sweep.json``): a point per training budget at the mean
    tau over the seeds that ran it, its bar spanning their min to max (seed noise is ~0.1 here);
    writes ``quality_sweep.html`` (plotly, standalone)."""
    import plotly.graph_objects as go

    r = json.loads(ref.read_text())
    fig = go.Figure()
    by_recipe: dict[str, dict] = {}  # label -> (cpu s, steps) -> [tau per seed]
    for name, v in r["runs"].items():  # one line per recipe, its points = training budgets
        n = r["data"][v["data"]]["sampled_continuations"]
        rest = {k: x for k, x in v["train"].items() if k not in ("max_steps", "seed")}
        label = (f"+{n} sampled/prompt" if n else "greedy") + "".join(
            f", {k.replace('_size', '').replace('_steps', '')} {x}" for k, x in sorted(rest.items())
        )
        pts = by_recipe.setdefault(label, {})
        pts.setdefault((v["cpu_seconds_est"], v["steps"]), []).append(v["tau"])
    for label, pts in sorted(by_recipe.items()):
        keys = sorted(pts)
        mean = [sum(pts[k]) / len(pts[k]) for k in keys]
        fig.add_trace(go.Scatter(x=[x for x, _ in keys], y=mean, mode="lines+markers", name=label,
            error_y=dict(type="data", symmetric=False,
                array=[max(pts[k]) - m for k, m in zip(keys, mean)],
                arrayminus=[m - min(pts[k]) for k, m in zip(keys, mean)]),
            text=[f"{st} steps, {len(pts[(x, st)])} seed(s)" for x, st in keys],
            hovertemplate="%{x} s: mean tau %{y:.4f}, %{text}<extra>" + label + "</extra>"))  # fmt: skip
    fig.add_hline(
        y=3.9,
        line_dash="dot",
        annotation_text="issue-16 target 3.9",
        annotation_position="top left",
    )
    fig.update_layout(
        title="Default job: held-out tau (k=5) vs 03 training time on 2 CPU cores "
        "(estimated: steps x measured seconds per step of that shape)",
        xaxis_title="03 training seconds on 2 idle CPU cores (estimated); legend: changes from "
        "batch 16, TTT 7, MLP 688; bars: min-max over seeds",
        yaxis_title="tau (simulator, held-out prompts)",
        width=1100, height=980, margin=dict(b=70),
        legend=dict(orientation="h", yanchor="top", y=-0.12, font=dict(size=10)),
    )  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    f = out_dir / "quality_sweep.html"
    fig.write_html(f, include_plotlyjs=True)
    return f


def _value(v: str):
    """A ``--runs`` value: int, float, or the strings true/false."""
    if v in ("true", "false"):
        return v == "true"
    return float(v) if "." in v or "e" in v else int(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--params", default=str(ROOT / "params" / "default.yaml"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results" / "quality_sweep"))
    ap.add_argument("--budget", type=float, default=480.0, help="seconds; no new run after it")
    ap.add_argument("--max-runs", type=int, default=0)
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time, one process each")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per run (0: the budget)")
    ap.add_argument("--cpu-step-seconds", action="store_true")
    ap.add_argument("--cpu-outputs", default=str(ROOT / "outputs"))
    ap.add_argument("--cpu-run", default="default", help="run whose dataset the CPU timing reads")
    ap.add_argument("--tiny", action="store_true", help="plumbing check: few prompts and steps")
    ap.add_argument("--figure", nargs=2, metavar=("SWEEP_JSON", "OUT_DIR"), help="plot a sweep")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
        help="OUT CPU_STEPS_JSON SWEEP_JSON...: one reference JSON with CPU-second estimates")  # fmt: skip
    ap.add_argument(
        "--runs", default="", help="instead of RUNS, e.g. '0:max_steps=3000;6:max_steps=3000'"
    )
    a = ap.parse_args()
    if a.runs:
        global RUNS
        RUNS = []
        for part in a.runs.split(";"):
            d, _, kv = part.partition(":")
            tr = {k: _value(v) for k, v in (x.split("=") for x in kv.split(","))}
            RUNS.append((int(d), tr))
    a.extra = {}
    if a.tiny:
        a.extra = dict(max_train_prompts=6, max_new_tokens=8, eval_max_new_tokens=8)
        a.extra["max_eval_prompts"] = 2
        RUNS = RUNS if a.runs else [(0, {"max_steps": 3}), (1, {"max_steps": 3})]
    if a.merge:
        merge([Path(x) for x in a.merge[2:]], Path(a.merge[1]), Path(a.merge[0]))
        return
    if a.figure:
        print(figure(Path(a.figure[0]), Path(a.figure[1])))
        return
    if a.cpu_step_seconds:
        r = cpu_step_seconds(a)
        print(json.dumps(r, indent=1))
        return
    r = sweep(a)
    print(json.dumps({k: v for k, v in r.items() if k != "runs"}, indent=1, default=str))


if __name__ == "__main__":
    main()
