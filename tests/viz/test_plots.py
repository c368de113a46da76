"""Figures label every trace with the engine that produced it, and a run's figures share one
offline plotly.min.js (small HTML files)."""

import re

import plotly.offline
import pytest
import torch

from eagle3nb.dataset.read import boundary_engines
from eagle3nb.steps.extract.engine_drift import DRIFT_REFERENCE, split_aux
from eagle3nb.viz import plots

# as 02b writes it: SGLang captured the aux boundaries, HF boundary N (SGLang cannot return it)
SGLANG_MANIFEST = {
    "engine": {"name": "sglang", "version": "0.5.23"},
    "final_state": {"engine": "hf-transformers", "boundary": 5},
    "aux_boundaries": [1, 2, 4],
    "final_boundary": 5,
}
# as 02a writes it: vLLM gives the aux boundaries and boundary N
VLLM_MANIFEST = {
    "engine": {"name": "vllm", "version": "0.32.0"},
    "final_state": {"engine": "vllm", "boundary": 5},
    "aux_boundaries": [1, 2, 4],
    "final_boundary": 5,
}


def _trace_engines(fig) -> set[tuple[str, int]]:
    """``(engine, boundary)`` of every trace, read from the figure data's trace names."""
    out = set()
    for t in fig.data:
        m = re.fullmatch(r"(.+) b=(\d+)", t.name)
        assert m, t.name
        out.add((m.group(1), int(m.group(2))))
    return out


@pytest.mark.parametrize("manifest", [SGLANG_MANIFEST, VLLM_MANIFEST])
def test_hidden_state_traces_name_the_engine_that_produced_them(manifest):
    producers = boundary_engines(manifest)
    states = {b: torch.randn(6, 4) for b in producers}
    fig = plots.hidden_state_figure(states, engine=boundary_engines(manifest))
    assert _trace_engines(fig) == set((e, b) for b, e in producers.items())
    assert len(fig.data) == 2 * len(states)  # values and norms per boundary
    if manifest is SGLANG_MANIFEST:
        names = {t.name for t in fig.data}
        assert "hf-transformers b=5" in names and "sglang b=5" not in names
        assert "sglang: b=1,2,4; hf-transformers: b=5" in fig.layout.title.text


def test_hidden_state_panels_share_one_colour_per_boundary():
    """The norm panel has no legend of its own: its traces must take the colour the legend shows
    for the same boundary (plotly's automatic colours moved on, mislabelling every norm)."""
    states = {b: torch.randn(6, 4) for b in (1, 2, 4, 5)}
    fig = plots.hidden_state_figure(states, "sglang")
    by_name: dict[str, set] = {}
    for t in fig.data:
        by_name.setdefault(t.name, set()).add(t.marker.color)
    assert all(len(c) == 1 and None not in c for c in by_name.values()), by_name
    assert len({next(iter(c)) for c in by_name.values()}) == len(states)


def test_hidden_state_figure_one_engine_and_missing_boundary():
    states = {1: torch.randn(3, 4), 5: torch.randn(3, 4)}
    assert _trace_engines(plots.hidden_state_figure(states, "hf-transformers")) == {
        ("hf-transformers", 1),
        ("hf-transformers", 5),
    }
    with pytest.raises(ValueError, match=r"no engine named for boundaries \[5\]"):
        plots.hidden_state_figure(states, {1: "sglang"})


def test_drift_traces_only_at_boundaries_their_source_has():
    """Each drift trace's name is a source label and sits in a row of a boundary that source
    produced (SGLang's source has no boundary N)."""
    bnds = [1, 2, 4]
    ref = {b: torch.randn(5, 4) for b in bnds}
    sources = {
        DRIFT_REFERENCE: ref,
        "sglang float32": split_aux([torch.cat([ref[b] for b in bnds], dim=1)], bnds),
        "vllm float32 (dataset_vllm)": {1: ref[1] + 0.01, 2: ref[2]},  # no b=4
    }
    fig = plots.engine_drift_figure(sources, DRIFT_REFERENCE)
    for t in fig.data:
        row = (int(t.yaxis[1:] or 1) + 1) // 2  # axes y, y2 | y3, y4 | ...: two per boundary row
        assert t.name in sources and bnds[row - 1] in sources[t.name], (t.name, row)
    assert {t.name for t in fig.data if t.yaxis in ("y5", "y6")} == {
        DRIFT_REFERENCE,
        "sglang float32",
    }


def test_figures_share_one_offline_plotlyjs(tmp_path):
    figs = tmp_path / "figures"
    states = {1: torch.randn(50, 8), 5: torch.randn(50, 8)}
    plots.save_html(plots.hidden_state_figure(states, "hf-transformers"), figs / "a.html")
    res = {"trained": {"per_position_acceptance": [0.5, 0.2], "tau": 1.7}}
    plots.save_html(plots.acceptance_figure(res), figs / "b.html")
    js = figs / "plotly.min.js"
    assert js.read_text() == plotly.offline.get_plotlyjs()
    mtime = js.stat().st_mtime_ns
    plots.save_html(plots.acceptance_figure(res), figs / "c.html")  # not rewritten when equal
    assert js.stat().st_mtime_ns == mtime
    assert sorted(f.name for f in figs.iterdir()) == ["a.html", "b.html", "c.html", "plotly.min.js"]
    for f in ("a.html", "b.html", "c.html"):
        html = (figs / f).read_text()
        assert '<script charset="utf-8" src="plotly.min.js"></script>' in html
        assert len(html) < 200_000  # plotly.js (4.8 MB) not inlined
        assert f'id="{f[0]}"' in html  # deterministic div id
    total = sum(f.stat().st_size for f in figs.iterdir())
    assert total < js.stat().st_size + 600_000


def test_value_bars_are_numpy_histograms_of_every_value():
    """The figure is binned in Python over all values (not sampled, not binned by plotly.js), so
    a run's HTML does not grow with its tokens; checked against numpy.histogram on shared edges."""
    import numpy as np

    g = torch.Generator().manual_seed(1)
    states = {1: torch.randn(3000, 16, generator=g), 2: 3 * torch.randn(3000, 16, generator=g)}
    fig = plots.hidden_state_figure(states, "hf-transformers", nbins=40)
    allv = torch.cat([x.flatten() for x in states.values()]).numpy()
    edges = np.linspace(allv.min(), allv.max(), 41)
    for b, x in states.items():
        t = next(t for t in fig.data if t.name == f"hf-transformers b={b}" and t.xaxis == "x")
        want, _ = np.histogram(x.numpy().ravel(), bins=edges, density=True)
        assert len(t.y) == 40 and np.allclose(t.y, want, rtol=2e-3, atol=1e-6)
        assert np.allclose(t.x, (edges[:-1] + edges[1:]) / 2, rtol=1e-4, atol=1e-4)
    small = plots.hidden_state_figure({1: states[1][:5]}, "hf-transformers", nbins=40)
    assert len(small.data[0].y) == len(fig.data[0].y)  # size independent of the token count
