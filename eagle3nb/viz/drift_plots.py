"""05_drift's figures: drift per source and boundary (relative error, cosine, the channels that
carry the error, logits), and the train x serve acceptance matrix (tau and a_1 with seed noise)."""

from __future__ import annotations

from typing import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["drift_summary_figure", "acceptance_matrix_figure"]


def drift_summary_figure(drift: Mapping[str, dict], labels: Mapping[str, str]) -> go.Figure:
    """Each source against the float32 HF reference on the same tokens, per boundary.

    Args:
        drift: ``{source key: drift_stats dict}`` (:func:`eagle3nb.steps.drift.sources.drift_stats`:
            ``boundaries`` {b: relative_error, cosine, top_channels}, ``logits``).
        labels: ``{source key: label}`` (the engine that ran, dtype, quantization).

    Panels: median relative error (log axis), 1 - mean cosine (log axis), logits relative error
    per source, and the top channel's share of the squared error (hover: the top 5 channels).
    """
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=(
            "median |x - ref| / |ref| per boundary",
            "1 - mean cosine per boundary",
            "logits: |l - ref| / |ref| (final norm + lm_head on boundary N)",
            "share of the squared error in the top channel (hover: top 5)",
        ),
        vertical_spacing=0.14,
    )
    for key, d in drift.items():
        lab = labels.get(key, key)
        bs = list(d["boundaries"])
        rel = [max(d["boundaries"][b]["relative_error"], 1e-9) for b in bs]
        cos = [max(1 - d["boundaries"][b]["cosine"], 1e-12) for b in bs]
        top = [d["boundaries"][b]["top_channels"] for b in bs]
        kw = dict(x=[f"b={b}" for b in bs], name=lab, legendgroup=lab)
        fig.add_trace(go.Scatter(y=rel, mode="lines+markers", **kw), row=1, col=1)
        fig.add_trace(go.Scatter(y=cos, mode="lines+markers", showlegend=False, **kw), row=1, col=2)
        fig.add_trace(
            go.Bar(
                y=[t[0][1] if t else 0 for t in top],
                showlegend=False,
                hovertext=[", ".join(f"ch {c}: {s:.1%}" for c, s in t) for t in top],
                **kw,
            ),
            row=2,
            col=2,
        )
    fig.add_trace(
        go.Bar(
            x=[labels.get(k, k) for k in drift],
            y=[d["logits"]["relative_error"] for d in drift.values()],
            text=[f"top-1 agree {d['logits']['top1_agreement']:.1%}" for d in drift.values()],
            showlegend=False,
            marker_color="#888",
        ),
        row=2,
        col=1,
    )
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(
        height=720, title="Drift from hf-transformers float32, same tokens and boundaries"
    )
    return fig


def acceptance_matrix_figure(m: dict, labels: Mapping[str, str]) -> go.Figure:
    """Heatmaps of tau and a_1, rows = the source the drafter was trained on (last row: the layer
    offset), columns = the source it is served on; each cell's text: mean +- half the seed range.

    Args:
        m: ``metrics.json["drift_matrix"]["matrix"]`` (:func:`eagle3nb.steps.drift.report.matrix_block`).
        labels: ``{source key: label}``.
    """
    rows = [labels.get(r, r) for r in m["rows"]]
    cols = [labels.get(c, c) for c in m["cols"]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tau (acceptance length)", "a_1"))
    for i, (val, sp) in enumerate((("tau", "tau_spread"), ("a1", "a1_spread")), start=1):
        z, s = m[val], m[sp]
        text = [
            [("" if v is None else f"{v:.3f} +- {e:.3f}") for v, e in zip(zr, sr)]
            for zr, sr in zip(z, s)
        ]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=cols,
                y=rows,
                text=text,
                texttemplate="%{text}",
                colorscale="Viridis",
                showscale=False,
            ),
            row=1,
            col=i,
        )
    fig.update_yaxes(autorange="reversed", title_text="trained on", row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_xaxes(title_text="served on")
    fig.update_layout(height=180 + 70 * len(rows), title="train source x serve source")
    return fig
