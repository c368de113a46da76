"""docs/results.md, generated: the current numbers of the main job and of every bench reference.

The page is a pure function of committed inputs, so it cannot go stale unnoticed
(``tests/test_docs.py`` renders it again and compares):

- ``bench/reference_default_run.json``: the subset of one main-job run's ``metrics.json`` (and its
  params and drafter manifest) that the page shows, written by :func:`reference_from_run`;
- every other ``bench/reference_*.json``: one section each (an unknown file is listed by name and
  its ``what``, so a new reference shows up until it gets a renderer).

    python -m eagle3nb.report results                              # render from the committed inputs
    python -m eagle3nb.report results --run outputs/default        # take a new run's numbers first
    python -m eagle3nb.report results --check                      # exit 1 if docs/results.md differs
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from eagle3nb.repo_paths import REPO_ROOT

__all__ = ["REFERENCE", "PAGE", "reference_from_run", "render", "render_from_files"]

BENCH = REPO_ROOT / "bench"
REFERENCE = BENCH / "reference_default_run.json"
PAGE = REPO_ROOT / "docs" / "results.md"
COMMAND = "python -m eagle3nb.report results"
# the run parameters the page states (the recipe and the evaluation set-up)
PARAM_KEYS = (
    "model dtype device threads max_train_prompts max_new_tokens sampled_continuations "
    "sampled_prefix_tokens extract_engine training_mode draft_vocab_size draft_intermediate_size "
    "ttt_steps batch_size max_steps lr k eval_max_new_tokens max_eval_prompts eval_engines "
    "eval_dataset eval_batch_sizes"
).split()
EVAL_KEYS = (
    "k n_prompts max_new_tokens tau per_position_acceptance draft_acceptance_rate cycles "
    "greedy_mismatches trained_boundaries served_boundaries boundaries_fed"
).split()


def reference_from_run(run_dir: str | Path) -> dict:
    """The part of a finished run that docs/results.md shows, with where and when it was made.

    Reads ``metrics.json``, ``params.yaml`` and ``drafter/manifest.json`` of ``run_dir`` (an
    ``outputs/<run>`` folder of the main job). ``measured`` is the UTC time ``metrics.json`` was
    last written.

    Raises:
        FileNotFoundError: ``run_dir/metrics.json`` is missing (run the job first).
        KeyError: the run has no 04 evaluation (``metrics.json["eval"]``).
    """
    import yaml

    run = Path(run_dir)
    metrics_path = run / "metrics.json"
    if not metrics_path.is_file():
        raise FileNotFoundError(
            f"{metrics_path} is missing: run the job first "
            "(python -m eagle3nb.run params/default.yaml), then pass its folder as --run"
        )
    m = json.loads(metrics_path.read_text())
    params = (
        yaml.safe_load((run / "params.yaml").read_text()) if (run / "params.yaml").is_file() else {}
    )
    man_path = run / "drafter" / "manifest.json"
    manifest = json.loads(man_path.read_text()) if man_path.is_file() else {}
    ev = m["eval"]
    served = ev.get("served", {})
    mtime = dt.datetime.fromtimestamp(metrics_path.stat().st_mtime, dt.timezone.utc)
    return {
        "what": "the main job's numbers shown on docs/results.md (a subset of its metrics.json), "
        f"written by `{COMMAND} --run outputs/{run.name}`",
        "run": run.name,
        "measured": mtime.strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": manifest.get("git_commit"),
        "eagle3nb_version": manifest.get("eagle3nb_version"),
        "params": {k: params[k] for k in PARAM_KEYS if k in params},
        "timing": m.get("timing", {}),
        "threads": {k: m.get("threads", {}).get(k) for k in ("available", "budget")},
        "generate": {
            k: m.get("generate", {}).get(k)
            for k in ("engine", "engine_version", "n_train_prompts", "n_heldout_prompts")
            + ("generated_tokens", "tokens_per_s")
        },
        "train": {
            k: m.get("train", {}).get(k)
            for k in (
                "steps",
                "seconds",
                "loss_token_steps_per_s",
                "n_train_samples",
                "global_batch",
            )
        },
        "eval": {k: ev[k] for k in EVAL_KEYS if k in ev}
        | {
            "k_sweep": {
                k: ev.get("k_sweep", {}).get(k) for k in ("k", "tau", "draft_acceptance_rate")
            }
        }
        | {"served_table": served.get("table", "")},
    }


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4f}".rstrip("0").rstrip(".") if abs(x) < 100 else f"{x:,.1f}"
    if isinstance(x, list):
        return " ".join(_fmt(v) for v in x)
    return str(x)


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]


def _main_job(ref: dict) -> list[str]:
    ev, p = ref["eval"], ref["params"]
    gen, tr, tm = ref["generate"], ref["train"], ref["timing"]
    out = [
        "## The main job (`params/default.yaml`)",
        "",
        f"Run `{ref['run']}`, measured {ref['measured']} at commit `{_fmt(ref['git_commit'])[:12]}` "
        f"({gen['engine']} {gen['engine_version']} generating; {p.get('device')}, "
        f"{ref['threads'].get('budget')} threads). Recipe: {gen['n_train_prompts']} train prompts, "
        f"{p.get('sampled_continuations')} sampled-prefix continuations each "
        f"({p.get('sampled_prefix_tokens')} sampled tokens), {gen['generated_tokens']} generated "
        f"tokens; {tr['steps']} steps of batch {p.get('batch_size')}, TTT {p.get('ttt_steps')}, "
        f"drafter MLP {p.get('draft_intermediate_size')}, draft vocab {p.get('draft_vocab_size')}.",
        "",
        f"Acceptance on {ev['n_prompts']} held-out prompts x <= {ev['max_new_tokens']} tokens, "
        f"k = {ev['k']}, greedy (definitions: [Concepts](concepts.md#acceptance-definitions)); "
        f"greedy mismatches: {ev.get('greedy_mismatches')}:",
        "",
    ]
    rows = [
        [
            f"`{name}`",
            ev["tau"][name],
            ev["per_position_acceptance"][name],
            ev["draft_acceptance_rate"][name],
            ev["cycles"][name],
        ]
        for name in ev["tau"]
    ]
    out += _table(
        ["drafter, measured by", "tau", "a_1 .. a_k", "draft acceptance rate", "verify passes"],
        rows,
    )
    ks = ev["k_sweep"]
    out += [
        "",
        f"Boundaries trained {ev.get('trained_boundaries')}, fed as served "
        f"{ev.get('served_boundaries')}; the layer offset is fed "
        f"{ev.get('boundaries_fed', {}).get('trained, layer offset')}.",
        "",
        "k sweep (the trained drafter at every draft length k' <= k):",
        "",
    ]
    out += _table(
        ["k'", *map(str, ks["k"])],
        [["tau", *ks["tau"]], ["draft acceptance rate", *ks["draft_acceptance_rate"]]],
    )
    if ev.get("served_table"):
        out += [
            "",
            "Served by the engines, per category of `eval_dataset` "
            f"(`{p.get('eval_dataset')}`; [Serving](serving.md#served-acceptance-measured-by-the-engine-that-serves)):",
            "",
            ev["served_table"].strip(),
        ]
    out += [
        "",
        "Time per notebook (s): "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in tm.get("notebook_seconds", {}).items())
        + f"; total {_fmt(tm.get('total_seconds'))} s. Generation {_fmt(gen['tokens_per_s'])} tokens/s; "
        f"training {_fmt(tr['seconds'])} s, {_fmt(tr['loss_token_steps_per_s'])} loss-token-steps/s.",
    ]
    return out


def _dated(d: dict) -> str:
    return str(d.get("date") or d.get("measured") or "undated")


def _sec(name: str, d: dict, body: list[str]) -> list[str]:
    what = d.get("what")
    head = [f"### `bench/{name}` ({_dated(d)})", ""]
    return head + ([str(what), ""] if what else []) + body + [""]


def _h200_train(d):
    rows = [
        [k, r.get("tokens_per_s"), r.get("step_s_median"), r.get("mfu"), r.get("max_mem_gib")]
        for k, r in d["runs"].items()
        if isinstance(r, dict)
    ]
    return _table(["run", "tokens/s", "step s", "MFU", "peak GiB"], rows)


def _h200_online(d):
    rows = [
        [
            "online",
            d["online"].get("tokens_per_s"),
            d["online"].get("step_s_median"),
            d["online"].get("wait_share"),
        ]
    ]
    rows += [
        [f"offline, {k}", r.get("tokens_per_s"), r.get("step_s_median"), r.get("wait_share")]
        for k, r in d["offline"].items()
        if k.startswith("loader_workers")
    ]
    return _table(["mode", "tokens/s", "step s", "batch wait share"], rows)


def _h200_mfu(d):
    rows = [
        [
            r["variant"],
            r.get("tokens_per_s"),
            r.get("step_s_median"),
            r.get("mfu"),
            r.get("max_mem_gib"),
        ]
        for r in d["runs"]
    ]
    out = _table(["variant", "tokens/s", "step s", "MFU", "peak GiB"], rows)
    two = d.get("two_gpus", {}).get("drafter_8b_offline_flex")
    if two:
        out += [
            "",
            f"Two GPUs (DDP): {_fmt(two['1_gpu']['tokens_per_s'])} -> "
            f"{_fmt(two['2_gpus_ddp']['tokens_per_s'])} tokens/s (x{_fmt(two['speedup'])}).",
        ]
    return out


def _quality_sweep(d):
    groups: dict[str, list[float]] = {}
    for key, r in d["runs"].items():
        groups.setdefault(key.split("_seed")[0], []).append(r["tau"])
    best = sorted(groups.items(), key=lambda kv: -sum(kv[1]) / len(kv[1]))[:12]
    rows = [[f"`{k}`", len(v), sum(v) / len(v), min(v), max(v)] for k, v in best]
    return [f"{len(d['runs'])} runs; the 12 recipes of highest mean held-out tau:", ""] + _table(
        ["recipe", "seeds", "mean tau", "min", "max"], rows
    )


def _engines_cpu(d):
    rows = [
        [
            name,
            eng,
            e.get("capture_overhead_ratio"),
            e.get("extract_tokens_per_s"),
            e.get("prefill_tokens_per_s_without_capture"),
        ]
        for name, run in d["runs"].items()
        for eng, e in run.get("engines", {}).items()
    ]
    return _table(["run", "engine", "capture overhead", "extract tok/s", "prefill tok/s"], rows)


def _eval_speed(d):
    return [
        f"04's path {_fmt(d['seconds']['shared'])} s against the literal simulator "
        f"{_fmt(d['seconds']['literal'])} s on `{d['run']}` ({d['n_prompts']} prompts); tau "
        f"{_fmt(d['tau']['shared'])} both; counters equal: {d['counters_equal']}."
    ]


def _rerun(d):
    rows = [[k, r["measured_again_s"], r["read_back_s"]] for k, r in d["notebooks"].items()]
    return _table(["notebook", "measured again s", "read back s"], rows)


def _served_speed(d):
    rows = [[f"{r['engine']} ({r['drafter']})", r["batch_size"], r["speedup"]["text"]]
            for r in d["rows"]]  # fmt: skip
    return _table(["engine (drafter)", "batch size", "speedup"], rows)


def _sglang_builds(d):
    med = d["median_seconds"]
    return _table(
        ["start", *med], [[k, *(med[w][k] for w in med)] for k in next(iter(med.values()))]
    )


def _engine_versions(d):
    """Per version and class: the source rule, the measured one, and the default job's served tau
    (``default_job``, trained drafter; the job's class only, the embedded Llama target)."""
    rows, jobs = [], (d.get("default_job") or {}).get("engines", {})
    for v in d["versions"]:
        job = jobs.get(f"{v['engine']} {v['version']}") or {}
        tau = {k: t for k, t in (job.get("served_tau") or {}).items() if "offset" not in k}
        served = ", ".join(f"{t:.4f}" for t in tau.values())
        if not served and job.get("left_out_of_04"):
            served = "not served (04 left it out: see the JSON)"
        for c in v.get("classes", []):
            k = (c.get("derived") or {}).get("kind")
            got = k if c.get("agrees") is not None else "not measured"
            job_class = c["class"] == "LlamaForCausalLM"
            rows.append([f"{v['engine']} {v['version']}", c["class"], c.get("source_rule"), got,
                         c.get("agrees"), (served or "-") if job_class else "-"])  # fmt: skip
    return _table(["version", "class", "source rule", "measured", "agrees", "served tau"], rows)


def _contention(d):
    return [f"Ratio loaded / idle: {json.dumps(d['ratio_loaded_over_idle'])} ({d['ratio_is']})."]


def _merged_sweep(d):
    return [f"Merged into `reference_quality_sweep.json` ({len(d.get('sweeps', []))} sweeps)."]


def _writer(d):
    sh = d["shape"]
    return [
        f"write_dataset {_fmt(d['writer_bytes_per_s'] / 1e6)} MB/s against the disk's "
        f"{_fmt(d['disk_bytes_per_s'] / 1e6)} MB/s ({_fmt(d['writer_over_disk'])} of it), "
        f"H {sh['hidden']}, {sh['n_aux']} aux slots, {sh['samples']} x {sh['sample_len']} tokens, "
        f"shards of {sh['shard_size']}, {d['dtype']}, {d['machine']['cpus']} CPUs."
        + (f" Before: {d['note']}." if d.get("note") else "")
    ]


RENDERERS = {
    "reference_writer.json": _writer,
    "reference_h200_train.json": _h200_train,
    "reference_h200_online.json": _h200_online,
    "reference_h200.json": _h200_mfu,
    "reference_quality_sweep.json": _quality_sweep,
    "reference_engines_cpu.json": _engines_cpu,
    "reference_eval_speed.json": _eval_speed,
    "reference_rerun.json": _rerun,
    "reference_sglang_builds_cpu.json": _sglang_builds,
    "reference_served_speed.json": _served_speed,
    "reference_engine_versions.json": _engine_versions,
}


def render(ref: dict, bench: dict[str, dict]) -> str:
    """docs/results.md from the main job's reference (:func:`reference_from_run`) and the bench
    references by file name; deterministic (sorted by file name)."""
    out = [
        "# Results",
        "",
        f"Generated by `{COMMAND}` from `bench/reference_default_run.json` and the other "
        "`bench/reference_*.json` files: do not edit by hand (`tests/test_docs.py` fails while "
        "this page differs from what the command writes). Current numbers only; dated "
        "measurements of earlier code are in the [Measurement log](history.md), the methods in "
        "[Performance](performance.md).",
        "",
        *_main_job(ref),
        "",
        "## Bench references (the latest of each)",
        "",
    ]
    for name in sorted(bench):
        d = bench[name]
        fn = RENDERERS.get(name)
        if fn is None and name.startswith("reference_contention"):
            fn = _contention
        if fn is None and name.startswith("reference_quality_sweep_"):
            fn = _merged_sweep
        out += _sec(name, d, fn(d) if fn else ["(no summary renderer: see the file)"])
    return "\n".join(out).rstrip() + "\n"


def render_from_files(reference: Path = REFERENCE) -> str:
    """:func:`render` over the committed inputs: ``reference`` and bench/reference_*.json."""
    bench = {
        p.name: json.loads(p.read_text())
        for p in sorted(BENCH.glob("reference_*.json"))
        if p.resolve() != Path(reference).resolve()
    }
    return render(json.loads(Path(reference).read_text()), bench)
