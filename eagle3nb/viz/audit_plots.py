"""06's figure: tau of one drafter fed each candidate boundary set, the declared set and the
measured best marked (what :func:`eagle3nb.audit.core.run_audit` returns, read as a dict)."""

from __future__ import annotations

import plotly.graph_objects as go

__all__ = ["audit_figure"]


def audit_figure(result: dict) -> go.Figure:
    """Bars of tau (tokens per cycle) per candidate boundary set, highest first; the declared set,
    the measured one (``verdict["trained_on"]``: lowest first-draft NLL) and the highest-tau set
    where it differs coloured and named in the legend, each engine's reading named on its bar.

    Args:
        result: ``{"candidates": [{"boundaries", "label", "tau"}] best first, "verdict": {"trained_on",
            "best", "declared"}, "readings": {engine: {"boundaries"?, "version"}}, "k", "prompts"}``.

    Raises:
        ValueError: no candidate in ``result``.
    """
    rows = result.get("candidates") or []
    if not rows:
        raise ValueError("result has no measured candidate boundary set")
    v = result["verdict"]
    feeds = {}
    for e, r in (result.get("readings") or {}).items():
        if "boundaries" in r:
            feeds.setdefault(str(r["boundaries"]), []).append(f"{e} {r['version']}")
    kinds = []
    for r in rows:
        b, dec = r["boundaries"], v.get("declared")
        kinds.append(
            "declared = measured"
            if b == v["trained_on"] and b == dec
            else "measured (trained on)"
            if b == v["trained_on"]
            else "declared"
            if b == dec
            else "highest tau"
            if b == v["best"]
            else "other candidates"
        )
    colours = {
        "measured (trained on)": "#2ca02c",
        "declared": "#d62728",
        "declared = measured": "#1f77b4",
        "highest tau": "#ff7f0e",
        "other candidates": "#bbbbbb",
    }
    fig = go.Figure()
    for kind, colour in colours.items():
        idx = [i for i, x in enumerate(kinds) if x == kind]
        if not idx:
            continue
        fig.add_bar(
            x=[rows[i]["label"] for i in idx],
            y=[rows[i]["tau"] for i in idx],
            name=kind,
            marker_color=colour,
            text=[", ".join(feeds.get(str(rows[i]["boundaries"]), [])) for i in idx],
            customdata=[rows[i].get("nll") for i in idx],
            textposition="outside",
            hovertemplate="boundaries %{x}<br>tau %{y:.3f}<br>first-draft NLL %{customdata:.4f}"
            "<br>%{text}<extra></extra>",
        )
    fig.update_layout(
        title=f"tau per candidate boundary set (k={result.get('k')}, {result.get('prompts')} "
        "held-out prompts; bars name the engines that feed that set)",
        xaxis={
            "title": "boundaries fed to the drafter",
            "categoryorder": "array",
            "categoryarray": [r["label"] for r in rows],
        },
        yaxis={"title": "tau (tokens per cycle)"},
        barmode="overlay",
        template="plotly_white",
    )
    return fig
