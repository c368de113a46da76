"""One function per notebook: the work of 01/02b/03/04, reading and writing only the run directory.

Notebooks call these and plot; each step validates its inputs (and the previous step's manifest)
before long work starts, writes its artefacts atomically, and merges its numbers into metrics.json.
"""

from __future__ import annotations



from eagle3nb.text import chat
from eagle3nb.target import conventions, models
from eagle3nb.target.capture import n_layers_of
from eagle3nb.manifest import check_compatible, read_json
from eagle3nb.rundir import RunDir, resolve_path, update_metrics
from eagle3nb.params import RunParams, resolve_device


def progress_bar():
    from tqdm.auto import tqdm

    return tqdm


def target_info(path, model, cache_dir=None) -> dict:
    """Manifest block describing the target model (its sha256 cached in ``cache_dir``, the run folder)."""
    c = model.config
    return {"name": path.name, "path": str(path), "sha256": models.model_hash(path, cache_dir), "architecture": (c.architectures or ["?"])[0], "n_layers": n_layers_of(model), "hidden_size": c.hidden_size, "vocab_size": c.vocab_size}


def template_of(p: RunParams, tok) -> str:
    text = resolve_path(p.chat_template).read_text() if p.chat_template else None
    return chat.template_text(tok, text, p.mode)


def resolve_aux(p: RunParams, n_layers: int) -> tuple[list[int], list[int]]:
    """``(layer_ids in p.convention, boundaries)`` of this run (see
    :func:`eagle3nb.target.conventions.aux_ids_and_boundaries`)."""
    return conventions.aux_ids_and_boundaries(p.convention, p.layer_ids, n_layers)


def record_checks(rd: RunDir, step: str, checks: list[str]) -> None:
    """List, in metrics.json["checks"][step], the checks that ran on this run's data."""
    update_metrics(rd.metrics, "checks", {step: checks})


def merge_engine_metrics(rd: RunDir, engine: str, values: dict) -> None:
    """Merge ``values`` into ``metrics.json["engines"][engine]`` (01, 02a and 04 each add theirs)."""
    from eagle3nb.rundir import read_metrics

    cur = dict(read_metrics(rd.metrics).get("engines", {}).get(engine, {}))
    cur.update(values)
    update_metrics(rd.metrics, "engines", {engine: cur})


def extraction_inputs(p: RunParams):
    """What 02a and 02b both start from: the run folder, 01's manifest (checked against this target
    and template), the target in ``p.dtype`` on its device, its manifest block, and the run's aux
    ids and boundaries. Returns ``(rd, gman, device, model, tok, path, tinfo, ids, bnds)``."""
    rd = RunDir(p)
    gman = read_json(rd.generation_manifest, "generation manifest (from 01_generate)")
    device = resolve_device(p)
    model, tok, path = models.load_target(p.model, p.dtype, device)
    tinfo = target_info(path, model, rd.root)
    check_compatible(gman, {"target": tinfo, "template": {"mode": p.mode, "sha256": chat.template_hash(template_of(p, tok))}}, ["target.sha256", "template"], "generation output", "(delete the run folder)")
    ids, bnds = resolve_aux(p, tinfo["n_layers"])
    return rd, gman, device, model, tok, path, tinfo, ids, bnds
