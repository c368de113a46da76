"""Plotly figures of the workbook, returned as ``go.Figure`` objects (tests inspect their data).

Figures are written as HTML files that load one ``plotly.min.js`` from their own folder (written
there once from the installed plotly package, so no network is needed to open them) and with fixed
div ids, so the same data gives the same file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import plotly.colors
import plotly.graph_objects as go
import plotly.offline
import torch
from plotly.subplots import make_subplots

__all__ = [
    "engine_drift_figure",
    "hidden_state_figure",
    "acceptance_figure",
    "training_figure",
    "save_html",
    "write_plotlyjs",
]


def _bars(
    groups: Mapping[str, torch.Tensor], nbins: int, density: bool
) -> dict[str, tuple[list[float], list[float], float]]:
    """Histograms of every value of each group over one shared set of ``nbins`` equal bins.

    Binned here, not in the browser: a figure stores ``nbins`` numbers per trace instead of every
    value (an 8B target's [tokens, 4096] states would not fit an HTML file; sampling them hid the
    tails), and all groups share edges so overlaid bars line up.

    Returns:
        ``{label: (bin centres, heights, bin width)}``; heights are probability densities
        (integrate to 1) with ``density``, else counts. All values equal (to 1e-5 relative, i.e.
        float32 rounding): one bin of width 1 centred on them.
    """
    vals = {k: v.detach().float().flatten() for k, v in groups.items()}
    vals = {k: v[torch.isfinite(v)] for k, v in vals.items() if v.numel()}
    if not vals:
        return {}
    lo = min(float(v.min()) for v in vals.values() if v.numel())
    hi = max(float(v.max()) for v in vals.values() if v.numel())
    if hi - lo <= 1e-5 * max(1.0, abs(lo), abs(hi)):  # equal up to float32 rounding
        mid = (lo + hi) / 2
        lo, hi, nbins = mid - 0.5, mid + 0.5, 1
    w = (hi - lo) / nbins
    centres = [float(f"{lo + (i + 0.5) * w:.5g}") for i in range(nbins)]
    out = {}
    for k, v in vals.items():
        h = torch.histc(v, bins=nbins, min=lo, max=hi).double()
        if density:
            h = h / max(v.numel(), 1) / w
        out[k] = (centres, [float(f"{y:.4g}") for y in h.tolist()], w)
    return out


def hidden_state_figure(
    states: Mapping[int, torch.Tensor],
    engine: str | Mapping[int, str],
    nbins: int = 80,
) -> go.Figure:
    """Distribution per boundary: histogram of values (left) and of per-token L2 norms (right),
    binned over every value (:func:`_bars`), as probability densities.

    Args:
        states: ``{boundary: [N_tokens, H]}`` float tensors.
        engine: the engine that really produced them, one name for all boundaries or
            ``{boundary: name}`` (e.g. SGLang's aux boundaries and HF's boundary N, as
            ``eagle3nb.dataset.read.boundary_engines`` reads them from a manifest); shown in the
            title and in each boundary's legend entry.
        nbins: bins of the value panel (the norm panel uses 3/4 as many).

    Raises:
        ValueError: ``engine`` is a mapping that names no engine for one of the boundaries.
    """
    engines = {b: engine for b in states} if isinstance(engine, str) else dict(engine)
    if missing := sorted(set(states) - set(engines)):
        raise ValueError(f"no engine named for boundaries {missing}")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("values", "per-token L2 norm"))
    palette = plotly.colors.qualitative.Plotly  # one colour per boundary in both panels
    bnds = sorted(states)
    vals = _bars({b: states[b] for b in bnds}, nbins, density=True)
    norms = _bars({b: states[b].float().norm(dim=-1) for b in bnds}, max(nbins * 3 // 4, 1), True)
    for i, b in enumerate(bnds):
        color = palette[i % len(palette)]
        name = f"{engines[b]} b={b}"
        for col, (x, y, w) in ((1, vals[b]), (2, norms[b])):
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=y,
                    width=w,
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    marker_color=color,
                    opacity=0.6,
                ),
                1,
                col,
            )
    by_engine: dict[str, list[int]] = {}
    for b in bnds:
        by_engine.setdefault(engines[b], []).append(b)
    who = "; ".join(f"{e}: b={','.join(map(str, bs))}" for e, bs in by_engine.items())
    fig.update_layout(
        barmode="overlay",
        bargap=0,
        title=f"Hidden states per boundary ({who})",
        template="plotly_white",
    )
    return fig


def engine_drift_figure(
    sources: Mapping[str, Mapping[int, torch.Tensor]],
    reference: str,
    nbins: int = 80,
) -> go.Figure:
    """Hidden states of several engines/dtypes at the *same* boundaries and tokens, per boundary:
    value distributions (left, probability density over every value) and a count of tokens by
    relative deviation from the reference (right, log10 of ||x - x_ref|| / ||x_ref||). Comparing
    at equal boundaries takes layer-id offsets out, so what remains is numerical drift (kernels,
    dtype): ~1e-7 for float32 kernels, ~1e-2 for bf16; an offset by one layer would show as
    ~1e-1..1e0. Binned here (:func:`_bars`), so the file size does not grow with the tokens.

    Args:
        sources: ``{label: {boundary: [n_tokens, H]}}``, the same tokens in the same order in each
            (labels name the engine that really produced them and its dtype).
        reference: the label of the reference source (HF float32).
        nbins: bins of the value panels (the deviation panels use 3/4 as many).

    Raises:
        ValueError: ``reference`` missing, or a source's rows differ from the reference's.
    """
    if reference not in sources:
        raise ValueError(f"reference={reference!r} is not among the sources {list(sources)}")
    bnds = sorted(sources[reference])
    fig = make_subplots(
        rows=len(bnds),
        cols=2,
        subplot_titles=[
            t
            for b in bnds
            for t in (
                f"b={b}: values",
                f"b={b}: tokens by log10 relative deviation from {reference}",
            )
        ],
        vertical_spacing=0.08,
    )
    palette = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692"]
    colour = {lab: palette[i % len(palette)] for i, lab in enumerate(sources)}
    for r, b in enumerate(bnds, start=1):
        ref = sources[reference][b].float()
        here = {lab: st[b].float() for lab, st in sources.items() if b in st}
        for lab, x in here.items():
            if x.shape != ref.shape:
                raise ValueError(
                    f"source {lab!r} has {tuple(x.shape)} at b={b}, the reference {tuple(ref.shape)}: not the same tokens"
                )
        devs = {
            lab: ((x - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12))
            .clamp_min(1e-12)
            .log10()
            for lab, x in here.items()
            if lab != reference
        }
        for col, bars in (
            (1, _bars(here, nbins, True)),
            (2, _bars(devs, max(nbins * 3 // 4, 1), False)),
        ):
            for lab, (x, y, w) in bars.items():
                fig.add_trace(
                    go.Bar(
                        x=x,
                        y=y,
                        width=w,
                        name=lab,
                        legendgroup=lab,
                        showlegend=(r == 1 and col == 1),
                        marker_color=colour[lab],
                        opacity=0.5 if col == 1 else 0.6,
                    ),
                    r,
                    col,
                )
    fig.update_layout(
        barmode="overlay",
        bargap=0,
        title="Hidden-state drift across engines and dtypes, per boundary (same tokens, same boundaries)",
        template="plotly_white",
        height=320 * len(bnds),
    )
    return fig


def acceptance_figure(results: Mapping[str, dict]) -> go.Figure:
    """Per-position acceptance a_i as grouped bars, one group per drafter; tau in the legend.

    Args:
        results: ``{label: summary}`` with ``per_position_acceptance`` (list, fractions) and ``tau``.
    """
    fig = go.Figure()
    for label, r in results.items():
        a = r["per_position_acceptance"]
        fig.add_trace(
            go.Bar(
                x=[f"a{i + 1}" for i in range(len(a))], y=a, name=f"{label} (tau={r['tau']:.2f})"
            )
        )
    fig.update_layout(
        barmode="group",
        title="Per-position acceptance on held-out prompts",
        yaxis_title="fraction of cycles accepted",
        yaxis_range=[0, 1],
        template="plotly_white",
    )
    return fig


def k_sweep_figure(sweep: Mapping[int, dict], engine: str = "eagle3nb simulator") -> go.Figure:
    """tau (left axis) and draft acceptance rate (right axis) against k' drafts per cycle.

    Args:
        sweep: ``{k': summary}`` (``eagle3nb.drafter.ksweep.sweep_from_positions``, as 04
            computes it, or ``ksweep.k_sweep``); engine: who produced it (trace labels).
    """
    from plotly.subplots import make_subplots

    ks = sorted(sweep)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(x=ks, y=[sweep[k]["tau"] for k in ks], mode="lines+markers",
                   name=f"tau ({engine})"),
        secondary_y=False,
    )  # fmt: skip
    fig.add_trace(
        go.Scatter(x=ks, y=[sweep[k]["draft_acceptance_rate"] for k in ks], mode="lines+markers",
                   name=f"draft acceptance rate ({engine})", line={"dash": "dot"}),
        secondary_y=True,
    )  # fmt: skip
    fig.update_layout(
        title="Trained drafter: acceptance length and rate vs draft tokens per cycle (k')",
        xaxis_title="k' (draft tokens per cycle)",
        template="plotly_white",
    )
    fig.update_yaxes(title_text="tau (tokens per cycle)", secondary_y=False)
    fig.update_yaxes(title_text="accepted / drafted", range=[0, 1], secondary_y=True)
    return fig


def training_figure(history: Sequence[dict]) -> go.Figure:
    """Training loss (left) and accuracy per TTT step (right) against optimizer step."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("loss (weighted sum over TTT steps)", "accuracy per TTT step"),
    )
    steps = [h["step"] for h in history]
    fig.add_trace(
        go.Scatter(x=steps, y=[h["loss"] for h in history], name="loss", mode="lines"), 1, 1
    )
    k = len(history[0]["step_acc"]) if history else 0
    for j in range(k):
        fig.add_trace(
            go.Scatter(
                x=steps, y=[h["step_acc"][j] for h in history], name=f"TTT step {j}", mode="lines"
            ),
            1,
            2,
        )
    fig.update_layout(
        title="Drafter training", template="plotly_white", xaxis_title="step", xaxis2_title="step"
    )
    return fig


def trained_fraction_figure(fractions: Sequence[float], mode: str) -> go.Figure:
    """Histogram of the share of loss-bearing tokens per train sample (``fractions`` in [0, 1])."""
    fig = go.Figure(go.Histogram(x=list(fractions), xbins={"start": 0, "end": 1, "size": 0.02}))
    fig.update_layout(
        title=f"Trained fraction per sample ({mode} mode: tokens with loss mask 1 / all tokens)",
        xaxis_title="trained fraction",
        yaxis_title="samples",
        xaxis_range=[0, 1],
        template="plotly_white",
    )
    return fig


PLOTLY_JS = "plotly.min.js"  # written once per figures folder, next to the HTML files


def write_plotlyjs(folder: str | os.PathLike) -> Path:
    """Write the installed plotly package's ``plotly.min.js`` into ``folder`` (atomically, only when
    absent or different), for the figures there to load offline."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dst = folder / PLOTLY_JS
    js = plotly.offline.get_plotlyjs().encode()
    if not dst.is_file() or dst.stat().st_size != len(js) or dst.read_bytes() != js:
        tmp = dst.with_suffix(".js.tmp")
        tmp.write_bytes(js)
        os.replace(tmp, dst)
    return dst


def save_html(fig: go.Figure, path: str | os.PathLike) -> Path:
    """Write ``fig`` as HTML (deterministic div id), atomically. plotly.js is not inlined: the file
    loads ``plotly.min.js`` from its own folder (written there once by :func:`write_plotlyjs`), so
    a run's figures share one copy and still open offline."""
    path = Path(path)
    write_plotlyjs(path.parent)
    tmp = path.with_suffix(".html.tmp")
    fig.write_html(str(tmp), include_plotlyjs=PLOTLY_JS, full_html=True, div_id=path.stem)
    os.replace(tmp, path)
    return path


def alignment_figure(
    err: torch.Tensor,
    boundaries: list[int],
    declared: Sequence[int],
    engine: str,
    twin: dict | None = None,
    served: Mapping[str, Sequence[int]] | None = None,
) -> go.Figure:
    """Heatmap of log10 relative error, slots (rows) x reference boundaries (columns); with
    ``twin`` (:func:`eagle3nb.engines.twin_check.twin_proof`'s record) a second panel: the same
    engine's slots on the target's tiny twin against the twin's HF boundaries, titled with the
    measured rule and the verdict against engine_rules (and, for a proof read from the twin-proof
    cache, when and at which eagle3nb commit it was measured). ``served`` (``{label:
    boundaries}``, one per slot) marks on the target panel the boundary each engine version reads from the exported
    ids (a marker off the trained diagonal is the mismatch the drafter would be served)."""
    from plotly.subplots import make_subplots

    def heat(e, bnds, labels, show):
        return go.Heatmap(
            z=torch.log10(torch.as_tensor(e).clamp_min(1e-12)).tolist(),
            x=[f"b={b}" for b in bnds],
            y=labels,
            colorscale="Viridis_r",
            zmin=-8,
            zmax=0.5,
            showscale=show,
            colorbar={"title": "log10 rel. error"},
        )

    rows = [f"slot {i} (declared b={d})" for i, d in enumerate(declared)]
    title = f"Which boundary did {engine} capture? (relative error vs HF reference)"
    marks = [
        go.Scatter(
            x=[f"b={b}" for b in bs],
            y=rows[: len(bs)],
            mode="markers",
            marker={"symbol": ["x", "circle-open", "diamond-open"][i % 3], "size": 14},
            name=label,
        )
        for i, (label, bs) in enumerate((served or {}).items())
    ]
    if twin is None:
        fig = go.Figure([heat(err, boundaries, rows, True), *marks])
        fig.update_layout(title=title, template="plotly_white", xaxis_title="HF reference boundary")
        return fig
    verdict = twin["verdict"].split(":")[0]
    sub = (
        f"twin ({twin['twin']['n_layers']} layers, random weights): ids {twin['twin_ids']} -> "
        f"measured {twin['measured']}, engine_rules {twin['table']}: {verdict}"
    )
    if (c := twin.get("cache")) and c.get("hit"):  # the proof was read, not measured, this run
        when, commit = c["measured_at"], c["measured_commit"][:12]
        sub += f"<br>(cached proof, measured {when} at eagle3nb {commit})"
    fig = make_subplots(rows=2, cols=1, subplot_titles=("target (direct check)", sub))
    fig.add_trace(heat(err, boundaries, rows, True), row=1, col=1)
    for m in marks:
        fig.add_trace(m, row=1, col=1)
    trows = [
        f"twin id {s['id']} (table b={t})"
        for s, t in zip(twin["slots"], twin["table"] or [None] * len(twin["slots"]))
    ]
    fig.add_trace(
        heat(twin["error_matrix"], twin["reference_boundaries"], trows, False), row=2, col=1
    )
    fig.update_layout(title=title, template="plotly_white", height=620)
    fig.update_xaxes(title_text="HF reference boundary", row=2, col=1)
    return fig
