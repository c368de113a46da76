"""04's served results as a user pastes them: a markdown table and a plotly figure of tau per
benchmark category and engine (the simulator beside the engines) and of the speedup each engine
gives over itself without the drafter, per batch size and k.

A *run* is one measurement, a dict::

    {"engine": "sglang" | "vllm" | "simulator", "engine_version": str | None,
     "drafter": "trained" | "trained, layer offset" | ..., "k": int, "batch_size": int | None,
     "category": str ("all" for the whole set), "tau": float,
     "per_position_acceptance": [float] * k, "cycles": int,
     "tokens_per_s": float | None, "plain_tokens_per_s": float | None, "speedup": float | None,
     "latency_s": float | None, "plain_latency_s": float | None,
     "speed": {"speedup": eagle3nb.timing.Measured.as_dict(), "timed_on": str, ...} (optional)}

``tokens_per_s`` / ``latency_s`` are with the drafter, ``plain_*`` the same engine, prompts and
run without it. Where a run has ``speed`` (04's runs over the whole set: with and without the
drafter timed turn about over rounds, :mod:`eagle3nb.timing`), the table prints its median with
the spread, or "disturbed" with why, and the figure plots only measured medians (with their
min-max); without it, ``speedup`` = tokens_per_s / plain_tokens_per_s, printed as "one pass".
The simulator has no batch size and no speed. Figures are saved with
:func:`eagle3nb.viz.plots.save_html`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from eagle3nb import timing

__all__ = ["ALL", "SIMULATOR", "column_label", "main_setting", "served_table", "served_figure"]

ALL = "all"  # the category of the whole set
SIMULATOR = "simulator"
_NUMBER = (int, float)
_OPTIONAL = (
    "tokens_per_s",
    "plain_tokens_per_s",
    "speedup",
    "latency_s",
    "plain_latency_s",
)


def _check(runs: Sequence[Mapping]) -> None:
    """Raises ValueError naming the run, the key and the fix for a run that is not as documented."""
    if not runs:
        raise ValueError("runs is empty; give at least one served or simulated measurement")
    for i, r in enumerate(runs):
        if not isinstance(r, Mapping):
            raise ValueError(f"runs[{i}] is a {type(r).__name__}, not a dict (module docstring)")
        for key, ok, what in (
            ("engine", lambda v: isinstance(v, str) and v, "a non-empty engine name"),
            ("drafter", lambda v: isinstance(v, str) and v, "a non-empty drafter label"),
            ("category", lambda v: isinstance(v, str) and v, f"a category name or {ALL!r}"),
            ("k", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "int >= 1"),
            ("tau", lambda v: isinstance(v, _NUMBER) and not isinstance(v, bool), "a number"),
            ("batch_size", lambda v: v is None or (type(v) is int and v >= 1), "int >= 1 or None"),
            ("engine_version", lambda v: v is None or isinstance(v, str), "text or None"),
            *((key, lambda v: v is None or isinstance(v, _NUMBER), "a number or None") for key in _OPTIONAL),
        ):  # fmt: skip
            if not ok(r.get(key)):
                raise ValueError(f"runs[{i}][{key!r}] = {r.get(key)!r}: give {what}")


def column_label(run: Mapping) -> str:
    """``"<engine> <version> (<drafter>)"``, e.g. ``"sglang 0.5.23 (trained)"`` (no version: none
    shown, as for the simulator)."""
    ver = f" {run['engine_version']}" if run.get("engine_version") else ""
    return f"{run['engine']}{ver} ({run['drafter']})"


def _engine_label(run: Mapping) -> str:
    ver = f" {run['engine_version']}" if run.get("engine_version") else ""
    return f"{run['engine']}{ver}"


def main_setting(runs: Sequence[Mapping], k: int | None = None, batch_size: int | None = None):
    """``(k, batch_size)`` the per-category comparison is shown at: as given, else the first run's
    k and the smallest batch size served at that k (None where only the simulator ran)."""
    _check(runs)
    k = runs[0]["k"] if k is None else k
    if batch_size is None:
        sizes = [r["batch_size"] for r in runs if r["k"] == k and r["batch_size"] is not None]
        batch_size = min(sizes) if sizes else None
    return k, batch_size


def _columns(runs: Sequence[Mapping]) -> list[str]:
    """Column labels in order of first appearance, the engines' before the simulator's."""
    labels = list(dict.fromkeys(column_label(r) for r in runs if r["engine"] != SIMULATOR))
    return labels + list(dict.fromkeys(column_label(r) for r in runs if r["engine"] == SIMULATOR))


def _tau_grid(runs, k, batch_size) -> tuple[list[str], list[str], dict]:
    """``(categories, columns, {(category, column): tau})`` at ``k`` and ``batch_size`` (the
    simulator, which has no batch size, at ``k``); categories by name, ``all`` last.

    Raises:
        ValueError: two runs for one cell.
    """
    here = [r for r in runs if r["k"] == k and r["batch_size"] in (None, batch_size)]
    cells: dict[tuple[str, str], float] = {}
    for r in here:
        key = (r["category"], column_label(r))
        if key in cells:
            raise ValueError(
                f"two runs of {key[1]} for category {key[0]!r} at k={k}, batch size {batch_size}; "
                "give one run per engine, drafter, category, k and batch size"
            )
        cells[key] = float(r["tau"])
    cats = sorted({c for c, _ in cells} - {ALL}) + (
        [ALL] if any(c == ALL for c, _ in cells) else []
    )
    return cats, _columns(here), cells


def _measured(r: Mapping) -> dict:
    """The run's speedup as :meth:`eagle3nb.timing.Measured.as_dict`: its ``speed`` block, else
    one pass of ``speedup`` (or tokens_per_s / plain_tokens_per_s): a number, not a measurement."""
    sp = (r.get("speed") or {}).get("speedup")
    if sp:
        return sp
    one = r.get("speedup")
    if one is None and r.get("tokens_per_s") is not None and r.get("plain_tokens_per_s"):
        one = r["tokens_per_s"] / r["plain_tokens_per_s"]
    return timing.summarize([] if one is None else [one], "speedup").as_dict()


def _speedup(r: Mapping) -> float | None:
    """The speedup to show as a result: the median when measured, else None."""
    m = _measured(r)
    return m["median"] if m["verdict"] == timing.MEASURED else None


def _speed_rows(runs: Sequence[Mapping]) -> list[Mapping]:
    """Runs over the whole set that measured speed, by engine and drafter (first appearance), k
    and batch size. Raises ValueError for two runs of one engine, drafter, k and batch size."""
    rows = [
        r
        for r in runs
        if r["category"] == ALL
        and r["engine"] != SIMULATOR
        and (r.get("tokens_per_s") is not None or r.get("speed") or r.get("speedup") is not None)
    ]
    seen = set()
    for r in rows:
        key = (column_label(r), r["k"], r["batch_size"])
        if key in seen:
            raise ValueError(
                f"two runs of {key[0]} over the whole set at k={key[1]}, batch size {key[2]}; "
                "give one run per engine, drafter, category, k and batch size"
            )
        seen.add(key)
    order = {lab: i for i, lab in enumerate(dict.fromkeys(column_label(r) for r in rows))}
    return sorted(rows, key=lambda r: (order[column_label(r)], r["k"], r["batch_size"] or 0))


def _bars(rs: Sequence[Mapping]) -> dict:
    """Error bars from each measured median to the min and max of its rounds."""
    ms = [_measured(r) if _speedup(r) is not None else None for r in rs]
    up = [m["high"] - m["median"] if m else None for m in ms]
    down = [m["median"] - m["low"] if m else None for m in ms]
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down}


def _f(v, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _md(header: list[str], align: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    return out + ["| " + " | ".join(row) + " |" for row in rows]


def served_table(
    runs: Sequence[Mapping], k: int | None = None, batch_size: int | None = None
) -> str:
    """Markdown to paste: (a) tau per category (rows, ``all`` last) per engine and drafter
    (columns, the simulator's after the engines') at one k and batch size (:func:`main_setting`),
    4 decimals, ``-`` where not measured; (b) per engine, drafter, k and batch size over the whole
    set: tokens/s without and with the drafter (1 decimal, medians of the rounds), the speedup
    as :meth:`eagle3nb.timing.Measured.text` prints it ("1.043x (1.010-1.071 over 5 rounds)",
    "disturbed: <why>" or "one pass: ..."), its bound, what was timed, and the latencies
    (seconds, 3 decimals).

    Args:
        runs: the measurements (module docstring); k, batch_size: the setting of part (a).

    Raises:
        ValueError: a run not as documented (its index and key named), or two runs for one cell.
    """
    k, batch_size = main_setting(runs, k, batch_size)
    cats, cols, cells = _tau_grid(runs, k, batch_size)
    bs = "" if batch_size is None else f", batch size {batch_size}"
    out = [
        f"**tau per category** (k = {k}{bs}; tau = tokens emitted per draft-verify cycle, at "
        f"most k + 1)",
        "",
        *_md(
            ["category", *cols],
            ["---", *["---:"] * len(cols)],
            [[c, *(_f(cells.get((c, col)), 4) for col in cols)] for c in cats],
        ),
        "",
        f"**speedup** (category {ALL}; each engine against itself without the drafter, same "
        "prompts, same run, timed turn about; median (min-max over the rounds), or disturbed with "
        "why: a speedup is never above its bound tau, nor k + 1)",
        "",
    ]
    rows = _speed_rows(runs)
    if not rows:
        return "\n".join(
            out + ["no served speed measured (the simulator measures acceptance only)"]
        )
    head = ["engine", "drafter", "k", "batch size", "tokens/s without drafter"]
    head += ["tokens/s with drafter", "speedup", "bound", "timed on"]
    head += ["latency without drafter (s)", "latency with drafter (s)"]
    body = [
        [
            _engine_label(r),
            r["drafter"],
            str(r["k"]),
            _f(r["batch_size"], 0),
            _f(r.get("plain_tokens_per_s"), 1),
            _f(r.get("tokens_per_s"), 1),
            _measured(r)["text"],
            _f(_measured(r)["bound"], 3),
            (r.get("speed") or {}).get("timed_on", "one pass each"),
            _f(r.get("plain_latency_s"), 3),
            _f(r.get("latency_s"), 3),
        ]
        for r in rows
    ]
    notes = {m["note"] for m in map(_measured, rows) if m.get("note")}
    tail = ["", *(f"({n})" for n in sorted(notes))] if notes else []
    align = ["---", "---", "---:", "---:", "---:", "---:", "---", "---:", "---", "---:", "---:"]
    return "\n".join(out + _md(head, align, body) + tail)


def served_figure(
    runs: Sequence[Mapping], k: int | None = None, batch_size: int | None = None
) -> go.Figure:
    """Left: tau per category, one bar trace per engine and drafter (named by
    :func:`column_label`, the simulator's too) at :func:`main_setting`'s k and batch size. Right:
    speedup against batch size over the whole set, one line per engine, drafter and k (named
    ``"<column label> k=<k>"``), medians with their min-max over the rounds, with a dotted line
    at 1 (no speedup); a disturbed or one-pass figure is not plotted but listed under the figure
    with why. One colour per engine and
    drafter in both panels.

    Raises:
        ValueError: as :func:`served_table`.
    """
    k, batch_size = main_setting(runs, k, batch_size)
    cats, cols, cells = _tau_grid(runs, k, batch_size)
    rows = _speed_rows(runs)
    labels = list(dict.fromkeys([*cols, *(column_label(r) for r in rows)]))
    palette = plotly.colors.qualitative.Plotly
    colour = {lab: palette[i % len(palette)] for i, lab in enumerate(labels)}
    bs = "" if batch_size is None else f", batch size {batch_size}"
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(f"tau per category (k = {k}{bs})", f"speedup per batch size ({ALL})"),
    )
    for col in cols:
        fig.add_trace(
            go.Bar(
                x=cats,
                y=[cells.get((c, col)) for c in cats],
                name=col,
                legendgroup=col,
                marker_color=colour[col],
            ),
            1,
            1,
        )
    lines: dict[tuple[str, int], list[Mapping]] = {}
    for r in rows:
        lines.setdefault((column_label(r), r["k"]), []).append(r)
    dashes = {kk: d for kk, d in zip(sorted({kk for _, kk in lines}), ("solid", "dash", "dot"))}
    for (lab, kk), rs in lines.items():
        fig.add_trace(
            go.Scatter(
                x=[r["batch_size"] for r in rs],
                y=[_speedup(r) for r in rs],  # None (a gap) where disturbed or one pass
                error_y=_bars(rs),
                mode="lines+markers",
                name=f"{lab} k={kk}",
                legendgroup=lab,
                line={"color": colour[lab], "dash": dashes.get(kk, "dashdot")},
            ),
            1,
            2,
        )
    if rows:
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=2)
    gone = [f"{column_label(r)} k={r['k']} batch size {r['batch_size']}: {_measured(r)['text']}"
            for r in rows if _speedup(r) is None]  # fmt: skip
    if gone:  # never plotted as a speedup: said why under the figure
        fig.add_annotation(text="not plotted:<br>" + "<br>".join(gone), showarrow=False,
                           xref="paper", yref="paper", x=0, y=-0.25, align="left",
                           font={"size": 10})  # fmt: skip
        fig.update_layout(margin={"b": 80 + 14 * len(gone)})
    fig.update_layout(
        barmode="group",
        title="Served acceptance and speedup (the same engine with and without the drafter)",
        template="plotly_white",
    )
    fig.update_xaxes(title_text="category", row=1, col=1)
    fig.update_yaxes(title_text="tau (tokens per cycle)", row=1, col=1)
    fig.update_xaxes(title_text="batch size", row=1, col=2)
    fig.update_yaxes(title_text="tokens/s with / without drafter", row=1, col=2)
    return fig
