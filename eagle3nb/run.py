"""Run the ordered notebooks headless with papermill: ``python -m eagle3nb.run params/default.yaml``
(``--set key=value``, repeatable, changes one parameter without copying the file).

Validates the whole params file first (unknown keys, types, ranges) and checks it against the
model's config.json (:func:`eagle3nb.preflight.check_against_model`) and 01's input (the prompts
file or chat dataset, and its held-out split: :func:`eagle3nb.preflight.check_inputs`), then executes each notebook
with the parameters it declares, writes the executed copies to ``outputs/<run>/notebooks/`` and
records each notebook's wall time in ``metrics.json``. Its output is one line per notebook, and
while 03 trains its progress lines (loss, held-out tau, ETA) as ``train/train.log`` receives them.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Optional

import typer
import yaml

from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.preflight import check_against_model, check_inputs
from eagle3nb.params import NOTEBOOKS, load_params, parse_sets
from eagle3nb.training.progress import KERNEL_ARGS, LogFollower

__all__ = ["NOTEBOOKS", "run_notebooks", "main"]

# NOTEBOOKS (their run order) lives in params, which names the parameters each declares
# notebooks a run can switch off (the others always run)
ENABLED_BY = {
    "02a_extract_vllm": "vllm_extract",
    "05_drift": "drift_matrix",
    "06_audit": "audit_drafter",  # null by default: the main job and smoke run skip the audit
}
NB_DIR = REPO_ROOT / "notebooks"
# set for the kernels of a headless run: no progress bars of transformers or huggingface_hub (such
# as "Loading weights"), which an executed notebook would keep as a frozen 0% widget
HEADLESS_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}

app = typer.Typer(add_completion=False, help=__doc__)


def run_notebooks(
    params_file: str | Path,
    only: Optional[list[str]] = None,
    overrides: Optional[dict] = None,
    log_output: bool = False,
) -> Path:
    """Execute the notebooks in order for one params file; returns the run directory.

    Raises:
        ValueError: invalid params, params that do not fit the model's config.json, or 01's input
            refused (:func:`eagle3nb.preflight.check_inputs`), before anything runs; unknown
            notebook name in ``only``.
        FileNotFoundError: the params file or the model is not found (before anything runs).
        papermill.PapermillExecutionError: a notebook failed (its executed copy shows where).
    """
    import papermill as pm

    p = load_params(params_file, **(overrides or {}))
    check_against_model(p)  # model, vocab, layer ids, heads: fail before any notebook runs
    check_inputs(p)  # empty or bad prompts / dataset, a split with no held-out item: same
    names = only or NOTEBOOKS
    unknown = [n for n in names if n not in NOTEBOOKS]
    if unknown:
        raise ValueError(f"only={unknown}: unknown notebooks; choose from {NOTEBOOKS}")
    if (
        p.training_mode == "online" and only is None
    ):  # 03 captures each batch itself: no dataset to extract
        names = [n for n in names if not n.startswith("02")]
        print(
            f"[eagle3nb] training_mode=online: skipping {[n for n in NOTEBOOKS if n.startswith('02')]} (03 captures with online_engine={p.online_engine})",
            flush=True,
        )
    rd = RunDir(p).make()
    rd.notebooks.mkdir(parents=True, exist_ok=True)
    all_params = dict(
        p.model_dump(), interactive=False
    )  # headless: no widgets or progress bars; figures go to HTML
    (rd.root / "params.yaml").write_text(yaml.safe_dump(all_params, sort_keys=False))
    times = {}
    t_all = time.time()
    with _environ(kernel_env()):  # inherited by each kernel
        for name in names:
            if name in ENABLED_BY and not getattr(p, ENABLED_BY[name]):
                off = "null" if getattr(p, ENABLED_BY[name]) is None else "false"
                print(f"[eagle3nb] {name}: skipped ({ENABLED_BY[name]}: {off})", flush=True)
                continue
            src = NB_DIR / f"{name}.ipynb"
            declared = pm.inspect_notebook(str(src)).keys()
            params = {k: all_params[k] for k in declared if k in all_params}
            t0 = time.time()
            print(f"[eagle3nb] {name}: running -> {rd.notebooks / (name + '.ipynb')}", flush=True)
            with _live_lines(rd, name, log_output):
                start = _log_size(rd, name)  # 03's log grows across runs: count this run's lines
                pm.execute_notebook(
                    str(src),
                    str(rd.notebooks / f"{name}.ipynb"),
                    parameters=params,
                    cwd=str(NB_DIR),
                    kernel_name="python3",
                    progress_bar=False,
                    log_output=log_output,
                    extra_arguments=KERNEL_ARGS,  # no plaintext-TCP warning: see progress.py
                )
            times[name] = round(time.time() - t0, 2)
            print(
                f"[eagle3nb] {name}: done in {times[name]:.1f} s{_notices(rd, name, start)}",
                flush=True,
            )
            update_metrics(rd.metrics, "timing", {"notebook_seconds": dict(times)})
    if only is None:
        update_metrics(
            rd.metrics,
            "timing",
            {
                "notebook_seconds": times,
                "total_seconds": round(time.time() - t_all, 2),
                "training_mode": p.training_mode,
            },
        )
    return rd.root


# the log each notebook's step appends its progress lines to, echoed while it runs
LIVE_LOGS = {"03_train": ("train", "train.log"), "04_eval_acceptance": ("eval.log",)}


def _live_lines(rd: RunDir, name: str, log_output: bool):
    """While 03 trains, its progress lines (step, loss, held-out tau when evaluated, ETA) as
    ``train/train.log`` receives them, and while 04 evaluates, ``eval.log``'s (what was refused
    or left out, engine starts, engine, drafter, k, batch size, prompts served, ETA), echoed here:
    the runner's own output shows them live without streaming every cell (``--log-output``
    streams them already: nothing is added)."""
    if name == "04_eval_acceptance":  # rewritten by 04 (a recorded result writes none)
        rd.root.joinpath(*LIVE_LOGS[name]).unlink(missing_ok=True)
    if name not in LIVE_LOGS or log_output:
        return nullcontext()
    return LogFollower(rd.root.joinpath(*LIVE_LOGS[name]), lambda line: print(line, flush=True))


def _log_size(rd: RunDir, name: str) -> int:
    f = rd.root.joinpath(*LIVE_LOGS.get(name, ("-",)))
    return f.stat().st_size if f.is_file() else 0


def _notices(rd: RunDir, name: str, start: int = 0) -> str:
    """``", N notices above (refused or left out)"`` for a notebook whose log holds notices past
    byte ``start`` (:data:`eagle3nb.steps.evaluate.progress.NOTICE`: 03's export refusals, 04's
    refused records and engines left out), else ``""``."""
    from eagle3nb.steps.evaluate.progress import NOTICE, PREFIX

    prefix = {"03_train": "[03] ", "04_eval_acceptance": PREFIX}.get(name)
    f = rd.root.joinpath(*LIVE_LOGS.get(name, ("-",)))
    if prefix is None or not f.is_file():
        return ""
    text = f.read_bytes()[start:].decode("utf-8", "replace")
    n = sum(line.startswith(prefix + NOTICE) for line in text.splitlines())
    return f", {n} notice{'s' * (n != 1)} above (refused or left out)" if n else ""


def kernel_env() -> dict[str, str]:
    """What each notebook kernel of a headless run gets beside the runner's environment:
    :data:`HEADLESS_ENV`, and ``PYTHONPATH`` led by this checkout's root (``REPO_ROOT``), the
    runner's own entries after it made absolute (against the runner's working directory). Why: the
    kernels run in ``notebooks/``, where a relative entry (``PYTHONPATH=.``) names another folder;
    the venv's editable install of another checkout was then the eagle3nb they imported (seen: a
    second worktree's job ran the first checkout's code and wrote into its ``outputs/``)."""
    parts = [str(REPO_ROOT)]
    for x in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if x and str(Path(x).resolve()) not in parts:
            parts.append(str(Path(x).resolve()))
    return {**HEADLESS_ENV, "PYTHONPATH": os.pathsep.join(parts)}


@contextmanager
def _environ(extra: dict[str, str]):
    """``os.environ`` with ``extra`` set (kernels started inside inherit it), restored after."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@app.command()
def main(
    params_file: Path = typer.Argument(..., help="params YAML, e.g. params/default.yaml"),
    only: Optional[list[str]] = typer.Option(None, help="run only these notebooks (repeatable)"),
    log_output: bool = typer.Option(False, help="stream notebook output to the terminal"),
    set_: Optional[list[str]] = typer.Option(
        None, "--set", help="override a parameter, key=value (repeatable), e.g. --set max_steps=200"
    ),
):
    """Run the workbook's notebooks on one params file."""
    try:  # --set is parsed as 03's entry point parses it, validated with the file's own messages
        over = parse_sets(set_)
        root = run_notebooks(params_file, only=only, overrides=over, log_output=log_output)
    except (ValueError, FileNotFoundError) as e:  # bad input: the message says what and how to fix
        typer.echo(f"eagle3nb: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"run finished: {root} (metrics.json, figures/*.html, notebooks/*.ipynb)")


if __name__ == "__main__":
    app()
