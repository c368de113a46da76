"""Interactive JupyterLab views (ipywidgets + plotly FigureWidget, which needs ``anywidget``).

Each function returns a widget to ``display``; the notebooks show them only when their
``interactive`` parameter is True (headless papermill runs pass False and write the same figures as
standalone HTML instead). Widget state is never stored in the committed notebooks.
"""

from __future__ import annotations

import html
from typing import Mapping

import ipywidgets as W
import plotly.graph_objects as go
import torch

__all__ = ["hidden_state_explorer", "acceptance_explorer", "token_acceptance_view"]


def hidden_state_explorer(
    sources: Mapping[str, Mapping[int, torch.Tensor]], max_values: int = 20000
) -> W.VBox:
    """Overlay hidden-state value distributions of several sources (engines or runs).

    Args:
        sources: ``{label: {boundary: [N_tokens, H]}}``; label names the engine/run that produced it.

    Controls: sources (multi-select), boundary, token range (rows of each source).
    """
    labels = list(sources)
    bnds = sorted({b for s in sources.values() for b in s})
    n_max = max(t.shape[0] for s in sources.values() for t in s.values())
    pick = W.SelectMultiple(options=labels, value=tuple(labels[:2]), description="sources")
    bsel = W.Dropdown(options=bnds, value=bnds[0], description="boundary")
    rng = W.IntRangeSlider(value=(0, n_max), min=0, max=n_max, step=1, description="tokens")
    fig = go.FigureWidget(
        layout={
            "barmode": "overlay",
            "template": "plotly_white",
            "xaxis_title": "value",
            "yaxis_title": "density",
        }
    )

    def redraw(*_):
        with fig.batch_update():
            fig.data = []
            for lab in pick.value:
                x = sources[lab].get(bsel.value)
                if x is None:
                    continue
                v = x[rng.value[0] : rng.value[1]].float().flatten()[:max_values]
                fig.add_histogram(
                    x=v.tolist(),
                    name=f"{lab} b={bsel.value}",
                    opacity=0.6,
                    nbinsx=80,
                    histnorm="probability density",
                )
            fig.layout.title = f"boundary {bsel.value}, tokens {rng.value[0]}..{rng.value[1]}"

    for w in (pick, bsel, rng):
        w.observe(redraw, names="value")
    redraw()
    return W.VBox([W.HBox([pick, W.VBox([bsel, rng])]), fig])


def acceptance_explorer(results: Mapping[str, dict]) -> W.VBox:
    """Per-position acceptance of several drafters side by side (matched, mismatched, epochs...).

    Args:
        results: ``{label: summary}`` with ``per_position_acceptance`` and ``tau``.
    """
    labels = list(results)
    pick = W.SelectMultiple(options=labels, value=tuple(labels), description="drafters")
    fig = go.FigureWidget(
        layout={
            "barmode": "group",
            "template": "plotly_white",
            "yaxis_range": [0, 1],
            "yaxis_title": "fraction of cycles accepted",
        }
    )

    def redraw(*_):
        with fig.batch_update():
            fig.data = []
            for lab in pick.value:
                a = results[lab]["per_position_acceptance"]
                fig.add_bar(
                    x=[f"a{i + 1}" for i in range(len(a))],
                    y=a,
                    name=f"{lab} (tau={results[lab]['tau']:.2f})",
                )

    pick.observe(redraw, names="value")
    redraw()
    return W.VBox([pick, fig])


def _colour(accepted: int, k: int) -> str:
    if accepted < 0:
        return "#dddddd"  # prefill token
    f = accepted / max(k, 1)  # red (nothing accepted) -> green (all k accepted)
    return f"rgb({int(230 * (1 - f) + 40 * f)},{int(80 * (1 - f) + 180 * f)},{int(80 * (1 - f) + 90 * f)})"


def token_acceptance_view(tokenizer, traces: list[dict], k: int) -> W.VBox:
    """A held-out sample's generated tokens, each cycle's tokens coloured by how many of its k
    drafts were accepted (red 0 .. green k; grey: the prefill token). Hover shows the count.

    Args:
        traces: from :func:`eagle3nb.drafter.acceptance.evaluate_acceptance` (``traces`` key).
    """
    pick = W.Dropdown(options=list(range(len(traces))), value=0, description="sample")
    out = W.HTML()

    def render(*_):
        t = traces[pick.value]
        parts = [
            f"<span style='color:#666'>{html.escape(tokenizer.decode(t['prompt_ids'], skip_special_tokens=True))}</span>"
        ]
        for m, toks in t["cycles"]:
            text = html.escape(tokenizer.decode(toks, skip_special_tokens=False))
            tip = "prefill token (the target's own)" if m < 0 else f"accepted {m} of {k}"
            parts.append(
                f"<span title='{tip}' style='background:{_colour(m, k)};padding:1px;margin:1px;border-radius:3px'>{text}</span>"
            )
        legend = " ".join(
            f"<span style='background:{_colour(a, k)};padding:1px 4px'>{a}</span>"
            for a in range(k + 1)
        )
        out.value = f"<div style='font-family:monospace;line-height:1.8'>{''.join(parts)}</div><div>accepted drafts per cycle: {legend}</div>"

    pick.observe(render, names="value")
    render()
    return W.VBox([pick, out])
