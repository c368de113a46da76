"""The run's serving files: ``outputs/<run>/serve_commands.md`` and the drafter's model card
(``outputs/<run>/drafter/README.md``), written by 04 (with its acceptance) from the exported
config, the drafter's manifest and the run's manifests."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3nb.drafter.card import model_card, serve_commands, serve_commands_markdown
from eagle3nb.manifest import read_json
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir

__all__ = ["write_serving_files"]


def write_serving_files(p: RunParams, rd: RunDir, evaluation: dict | None = None) -> dict:
    """Write serve_commands.md (run folder) and README.md (drafter folder) for run ``p``.

    Args:
        evaluation: the trained drafter's acceptance for the card (``model_card``'s keys), or None.

    Returns:
        ``{"commands": serve_commands' dict, "serve_commands": its markdown, "paths": [...]}``.
    """
    cfg = json.loads((rd.drafter / "config.json").read_text())
    dman = read_json(rd.drafter / "manifest.json", "drafter manifest")
    target = dman.get("target", {})
    tpath = str(Path(target.get("path") or p.model).resolve())
    dpath = str(Path(rd.drafter).resolve())
    cmds = serve_commands(tpath, dpath, p.k)
    md = serve_commands_markdown(p.run_name, cfg, tpath, dpath, p.k)
    gm = read_json(rd.generation_manifest)
    tc = dman.get("train_config", {})
    secs = read_json(rd.metrics).get("train", {}).get("seconds", "?")
    data = (
        f"{gm['n_train']} train prompts x <= {gm['decoding']['max_new_tokens']} greedy tokens "
        f"of the target ({gm['generated_tokens']} generated tokens); aux states captured by "
        f"{_name(dman.get('dataset_engine'))}"
    )
    budget = (
        f"{tc.get('max_steps')} steps of batch {tc.get('batch_size')}, TTT {tc.get('ttt_steps')}, "
        f"lr {tc.get('lr')} ({secs} s of training)"
    )
    card = model_card(cfg, target, data, budget, cmds, evaluation)
    (rd.root / "serve_commands.md").write_text(md)
    (rd.drafter / "README.md").write_text(card)
    return {
        "commands": cmds,
        "serve_commands": md,
        "paths": [str(rd.root / "serve_commands.md"), str(rd.drafter / "README.md")],
    }


def _name(engine) -> str:
    """An engine as a manifest records it (a name, or a dict with one)."""
    if isinstance(engine, dict):
        return str(engine.get("name") or engine.get("engine_name") or engine)
    return str(engine or "?")
