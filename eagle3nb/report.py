"""Run browser: list runs under ``outputs/`` with their key metrics and figures, compare two runs.

python -m eagle3nb.report                      # table of runs
python -m eagle3nb.report --compare default smoke
python -m eagle3nb.report results [--run outputs/default] [--check]   # docs/results.md
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from eagle3nb.repo_paths import resolve_path

__all__ = ["list_runs", "compare_runs", "KEY_METRICS"]

# (label, key path in metrics.json)
KEY_METRICS = [
    ("tau trained", ("eval", "tau", "trained")),
    ("tau untrained", ("eval", "tau", "untrained")),
    ("tau layer offset", ("eval", "tau", "trained, layer offset")),
    ("a_1..a_k trained", ("eval", "per_position_acceptance", "trained")),
    ("k", ("eval", "k")),
    ("greedy mismatches", ("eval", "greedy_mismatches")),
    ("train samples", ("train", "n_train_samples")),
    ("train steps", ("train", "steps")),
    ("train s", ("train", "seconds")),
    ("train loss-token-steps/s", ("train", "loss_token_steps_per_s")),
    ("extract tok/s", ("extract", "tokens_per_s")),
    ("boundaries", ("extract", "aux_boundaries")),
    ("engine", ("extract", "engine")),
    ("total s", ("timing", "total_seconds")),
]


def _get(d, path: tuple):
    for k in path:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def list_runs(outputs_dir: str | Path = "outputs") -> list[dict]:
    """One row per run folder holding a ``metrics.json``: run name, key metrics, figure paths."""
    root = resolve_path(outputs_dir)
    rows = []
    for m in sorted(root.glob("*/metrics.json")):
        metrics = json.loads(m.read_text())
        row = {"run": m.parent.name, "path": str(m.parent)}
        row.update({label: _get(metrics, path) for label, path in KEY_METRICS})
        row["figures"] = sorted(str(f) for f in (m.parent / "figures").glob("*.html"))
        rows.append(row)
    return rows


def compare_runs(a: str, b: str, outputs_dir: str | Path = "outputs") -> list[dict]:
    """Key metrics of two runs side by side, with the difference where both are numbers.

    Raises:
        FileNotFoundError: a run has no metrics.json (names the run and where it looked).
    """
    root = resolve_path(outputs_dir)
    ms = []
    for r in (a, b):
        f = root / r / "metrics.json"
        if not f.is_file():
            raise FileNotFoundError(
                f"run {r!r} has no metrics.json at {f}; list runs with `python -m eagle3nb.report`"
            )
        ms.append(json.loads(f.read_text()))
    out = []
    for label, path in KEY_METRICS:
        va, vb = _get(ms[0], path), _get(ms[1], path)
        num = (
            isinstance(va, (int, float))
            and isinstance(vb, (int, float))
            and not isinstance(va, bool)
        )
        out.append(
            {"metric": label, a: va, b: vb, f"{b} - {a}": round(vb - va, 4) if num else None}
        )
    return out


def _table(rows: list[dict], cols: list[str]) -> str:
    w = {c: max(len(c), *(len(str(r.get(c))) for r in rows)) for c in cols}
    line = "  ".join(c.ljust(w[c]) for c in cols)
    return "\n".join(
        [line, "  ".join("-" * w[c] for c in cols)]
        + ["  ".join(str(r.get(c)).ljust(w[c]) for c in cols) for r in rows]
    )


app = typer.Typer(add_completion=False, help=__doc__)


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    outputs_dir: str = typer.Option("outputs", help="folder holding runs"),
    compare: Optional[list[str]] = typer.Option(
        None, help="two run names to compare (repeat the option)"
    ),
):
    """List runs, or compare two."""
    if ctx.invoked_subcommand:
        return
    if compare:
        if len(compare) != 2:
            raise typer.BadParameter(f"--compare takes two run names, got {compare}")
        rows = compare_runs(compare[0], compare[1], outputs_dir)
        typer.echo(_table(rows, ["metric", compare[0], compare[1], f"{compare[1]} - {compare[0]}"]))
    else:
        rows = list_runs(outputs_dir)
        for r in rows:
            r["figures (open in a browser)"] = " ".join(
                Path(f).relative_to(resolve_path(outputs_dir)).as_posix() for f in r["figures"]
            )
        typer.echo(
            _table(
                rows,
                [
                    "run",
                    "tau trained",
                    "tau untrained",
                    "tau layer offset",
                    "train steps",
                    "total s",
                    "figures (open in a browser)",
                ],
            )
            if rows
            else f"no runs under {resolve_path(outputs_dir)}"
        )


@app.command("results")
def results_cmd(
    run: Optional[str] = typer.Option(
        None,
        help="a finished main-job run folder: its numbers replace bench/reference_default_run.json",
    ),
    out: str = typer.Option("docs/results.md", help="page to write (relative to the repo root)"),
    check: bool = typer.Option(False, "--check", help="write nothing; exit 1 if the page differs"),
):
    """Write docs/results.md from bench/reference_default_run.json and bench/reference_*.json."""
    from eagle3nb import results_page

    if run:
        ref = results_page.reference_from_run(resolve_path(run))
        results_page.REFERENCE.write_text(json.dumps(ref, indent=1) + "\n")
        typer.echo(f"wrote {results_page.REFERENCE}")
    page, text = resolve_path(out), results_page.render_from_files()
    if check:
        if not page.is_file() or page.read_text() != text:
            typer.echo(
                f"{page} differs from what `{results_page.COMMAND}` writes; run it", err=True
            )
            raise typer.Exit(1)
        typer.echo(f"in step: {page}")
        return
    page.write_text(text)
    typer.echo(f"wrote {page}")


if __name__ == "__main__":
    app()
