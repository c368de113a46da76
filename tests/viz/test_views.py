"""The interactive views build and react to their controls (no browser: widget models only)."""

import torch

from eagle3nb.viz.views import acceptance_explorer, hidden_state_explorer, token_acceptance_view


def test_hidden_state_explorer_overlays_selected_sources():
    src = {
        "hf-transformers": {1: torch.ones(10, 4), 2: torch.zeros(10, 4)},
        "run-b": {1: torch.full((8, 4), 2.0)},
    }
    box = hidden_state_explorer(src)
    pick, ctrl = box.children[0].children
    fig = box.children[1]
    assert len(fig.data) == 2 and set(fig.data[0].x) == {1.0}
    ctrl.children[0].value = 2  # boundary 2: only one source has it
    assert len(fig.data) == 1 and set(fig.data[0].x) == {0.0}
    ctrl.children[1].value = (0, 3)
    assert len(fig.data[0].x) == 3 * 4


def test_acceptance_explorer_and_token_view(target):
    _, tok, _ = target
    res = {
        "trained": {"per_position_acceptance": [0.8, 0.5], "tau": 2.3},
        "untrained": {"per_position_acceptance": [0.1, 0.0], "tau": 1.1},
    }
    box = acceptance_explorer(res)
    assert [d.y for d in box.children[1].data] == [(0.8, 0.5), (0.1, 0.0)]
    box.children[0].value = ("untrained",)
    assert len(box.children[1].data) == 1
    ids = tok("Once upon a time").input_ids
    traces = [{"prompt_ids": ids, "cycles": [(-1, [261]), (2, [262, 263, 264]), (0, [265])]}]
    v = token_acceptance_view(tok, traces, k=2)
    html = v.children[1].value
    assert (
        html.count("accepted 2 of 2") == 1
        and html.count("accepted 0 of 2") == 1
        and "prefill" in html
    )
