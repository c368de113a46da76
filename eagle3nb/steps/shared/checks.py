"""What the step modules share: run-folder inputs, checks written once (generation manifest,
measured boundaries) and metrics.json helpers.

Each step validates its inputs (and the previous step's manifest) before long work starts, writes
its artefacts atomically, and merges its numbers into metrics.json.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from eagle3nb import threads
from eagle3nb.manifest import check_compatible, read_json
from eagle3nb.params import RunParams, resolve_device
from eagle3nb.rundir import RunDir, read_metrics, update_metrics
from eagle3nb.repo_paths import resolve_path
from eagle3nb.boundaries import conventions
from eagle3nb.target import models
from eagle3nb.boundaries.alignment import alignment_matrix, alignment_verdict
from eagle3nb.target.capture import reference_states
from eagle3nb.target.capture import n_layers_of
from eagle3nb.text import chat


def progress_bar():
    """tqdm's notebook-aware bar class (imported only when a step shows progress)."""
    from tqdm.auto import tqdm

    return tqdm


def target_info(path, model, cache_dir=None) -> dict:
    """Manifest block describing the target model (its sha256 cached in ``cache_dir``, the run
    folder)."""
    c = model.config.get_text_config()  # wrappers: the text model's widths
    return {
        "name": path.name,
        "path": str(path),
        "sha256": models.model_hash(path, cache_dir),
        "architecture": (model.config.architectures or [type(model).__name__])[0],
        "n_layers": n_layers_of(model),
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
    }


def template_of(p: RunParams, tok) -> str:
    """The chat template text this run renders with (``p.chat_template`` or the tokenizer's)."""
    text = resolve_path(p.chat_template).read_text() if p.chat_template else None
    return chat.template_text(tok, text, p.mode)


def resolve_aux(p: RunParams, n_layers: int) -> tuple[list[int], list[int]]:
    """``(layer_ids in p.convention, boundaries)`` of this run (see
    :func:`eagle3nb.boundaries.conventions.aux_ids_and_boundaries`)."""
    return conventions.aux_ids_and_boundaries(p.convention, p.layer_ids, n_layers)


def use_thread_budget(p: RunParams, rd: RunDir | None = None, processes: int = 0):
    """Apply the run's thread budget in this process (:mod:`eagle3nb.threads`) at the start of a
    step: torch's pools here, and the share each engine worker started from here gets, lowered to
    the cores other processes leave idle at the start (:class:`eagle3nb.threads.Rebalancer`,
    ``threads: 0`` only); recorded in
    ``metrics.json["threads"]`` (by rank 0 only under torchrun). ``threads: -1`` applies nothing
    (torch and engine defaults, as before the budget existed) and records what torch runs with.

    Args:
        processes: processes sharing the budget; 0 = ``$LOCAL_WORLD_SIZE`` (torchrun) or 1.

    Returns:
        The :class:`eagle3nb.threads.Budget`, or None for ``threads: -1``.

    Raises:
        ValueError: ``threads`` above the cores this process may use (names the value and fix).
    """
    processes = processes or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if p.threads < 0:
        threads.clear()
        block = {
            "requested": -1,
            "budget": None,
            "kernel": {"torch_threads": torch.get_num_threads()},
        }
        budget = None
    else:
        budget = threads.apply(threads.plan(p.threads, processes=processes))
        start = threads.Rebalancer()  # other work on the cores now: start on the idle ones
        start.tick(0)
        first = start.changes[0] if start.changes else {}
        if first:  # engine workers started by this step get the same share
            budget.worker = first["threads"]
            budget.kernel["torch_threads"] = torch.get_num_threads()
        block = dict(budget.as_metrics(), others_running_at_start=first.get("others"))
    if rd is not None and os.environ.get("RANK", "0") == "0" and rd.root.is_dir():
        update_metrics(rd.metrics, "threads", block)
    return budget


def record_engine_threads(rd: RunDir, client) -> None:
    """Add what an engine worker reported it runs with (torch threads, pool variables) to
    ``metrics.json["threads"]["engine_workers"][engine]``."""
    if client.threads is None:  # in-process engine: the kernel's budget applies
        return
    cur = dict(read_metrics(rd.metrics).get("threads", {}).get("engine_workers", {}))
    cur[client.engine] = client.threads
    update_metrics(rd.metrics, "threads", {"engine_workers": cur})


def speed_entry(name: str, version: str, n_tokens: int, secs: float, same_ids) -> dict:
    """One engine's row of 01's ``speed_by_engine``: tokens/s over ``n_tokens`` generated in
    ``secs`` seconds (engine start excluded) and ``same_ids``, the fraction of prompts or
    conversations whose ids equal the run's (None where not comparable)."""
    return {
        "engine": name,
        "version": version,
        "tokens_per_s": round(n_tokens / secs, 1) if secs else None,
        "seconds": round(secs, 3),
        "generated_tokens": n_tokens,
        "same_ids_as_run": same_ids,
    }


def record_checks(rd: RunDir, step: str, checks: list[str]) -> None:
    """List, in metrics.json["checks"][step], the checks that ran on this run's data."""
    update_metrics(rd.metrics, "checks", {step: checks})


def merge_engine_metrics(rd: RunDir, engine: str, values: dict) -> None:
    """Merge ``values`` into ``metrics.json["engines"][engine]`` (01, 02a, 02b and 04 each add
    theirs)."""
    cur = dict(read_metrics(rd.metrics).get("engines", {}).get(engine, {}))
    cur.update(values)
    update_metrics(rd.metrics, "engines", {engine: cur})


def read_generation_manifest(rd: RunDir) -> dict:
    """01's ``generation_manifest.json``.

    Raises:
        FileNotFoundError: 01_generate has not run in this run folder.
    """
    return read_json(rd.generation_manifest, "generation manifest (from 01_generate)")


def checked_generation(
    p: RunParams, rd: RunDir, model, tok, path, gman: dict | None = None
) -> tuple[dict, dict]:
    """01's generation manifest (``gman`` when already read), checked against this run's target and
    template (02a, 02b and online 03 all start from 01's output).

    Returns:
        ``(generation manifest, target block)`` (the block as :func:`target_info` gives it).

    Raises:
        FileNotFoundError: 01_generate has not run in this run folder.
        ManifestMismatch: 01 ran with another target (sha256) or template.
    """
    if gman is None:
        gman = read_generation_manifest(rd)
    tinfo = target_info(path, model, rd.root)
    template = {"mode": p.mode, "sha256": chat.template_hash(template_of(p, tok))}
    check_compatible(
        gman,
        {"target": tinfo, "template": template},
        ["target.sha256", "template"],
        "generation output",
        "(delete the run folder)",
    )
    return gman, tinfo


def extraction_inputs(p: RunParams):
    """What 02a and 02b both start from: the run folder, 01's manifest (checked against this target
    and template), the target in ``p.dtype`` on its device, its manifest block, and the run's aux
    ids and boundaries. Returns ``(rd, gman, device, model, tok, path, tinfo, ids, bnds)``."""
    rd = RunDir(p)
    use_thread_budget(p, rd)
    gman = read_generation_manifest(rd)  # a missing 01 fails before the target loads
    device = resolve_device(p)
    model, tok, path = models.load_target(p.model, p.dtype, device)
    gman, tinfo = checked_generation(p, rd, model, tok, path, gman)
    ids, bnds = resolve_aux(p, tinfo["n_layers"])
    return rd, gman, device, model, tok, path, tinfo, ids, bnds


def check_engine_boundaries(label: str, engine, engine_ids: Sequence[int], bnds: list[int]) -> None:
    """Refuse an engine whose ids (its own convention) name other boundaries than the run's.

    Raises:
        ValueError: ``engine.boundaries(engine_ids) != bnds``.
    """
    got = engine.boundaries(engine_ids)
    if got != bnds:
        raise ValueError(f"{label} ids {engine_ids} name boundaries {got}, the run declares {bnds}")


def check_alignment(
    p: RunParams,
    name: str,
    convention: str,
    engine_ids: Sequence[int],
    bnds: list[int],
    captured: torch.Tensor,
    model,
    probe: Sequence[int],
    device: str = "cpu",
) -> tuple[dict, torch.Tensor, list[int]]:
    """Measure which boundaries an engine really captured on one probe sample, before anything is
    written or trained: every captured slot against the HF reference (``model``) at every boundary
    0..N (see :mod:`eagle3nb.boundaries.alignment`).

    Args:
        name, convention: the engine's name and id convention (for the error message).
        engine_ids: the ids the engine was asked for; ``bnds``: the boundaries they declare.
        captured: ``[T, n_aux*H]`` aux states of ``probe`` (``T`` tokens) from the engine.
        model: HF target, in the capture dtype, giving the reference states.
        device: where the engine computed ``captured`` (its ``info()["device"]``): an engine on
            CUDA is judged at :data:`eagle3nb.boundaries.alignment.TOLERANCE_CUDA` (TF32 kernels).

    Returns:
        ``(verdict, err, reference_boundaries)``: :func:`alignment_verdict`'s dict, the error
        matrix ``[n_aux, N+1]`` float64 and its column boundaries.

    Raises:
        ValueError: a measured boundary differs from the declared one (unless
            ``p.allow_boundary_mismatch``), or the capture has other rows/widths than the reference.
    """
    err, ref_b = alignment_matrix(captured.float(), reference_states(model, probe), len(bnds))
    align = alignment_verdict(err, ref_b, bnds, p.dtype, device)
    if not align["ok"] and not p.allow_boundary_mismatch:
        verdicts = [
            f"{s['verdict']}: error {s['error']:.3g}, next boundary {s['next_error']:.3g}"
            for s in align["slots"]
        ]
        raise ValueError(
            f"{name} captured boundaries {align['measured']} for {convention} ids "
            f"{list(engine_ids)}, declared {bnds} ({verdicts}; tolerance {align['tolerance']:g} "
            f"in {p.dtype} on {device}); fix convention/layer_ids, or set "
            "allow_boundary_mismatch=True to continue"
        )
    return align, err, ref_b


def record_alignment(rd: RunDir, name: str, align: dict, **extra) -> None:
    """Merge one engine's alignment verdict (and ``extra`` keys) into
    ``metrics.json["alignment"][name]``."""
    entry = {
        "declared": align["declared"],
        "measured": align["measured"],
        "verdicts": [x["verdict"] for x in align["slots"]],
        "max_error": max(x["error"] for x in align["slots"]),
        "tolerance": align["tolerance"],
    }
    update_metrics(rd.metrics, "alignment", {name: dict(entry, **extra)})


def extraction_check_lines(
    gman: dict, ids_line: str, align: dict, disk: dict, m: dict
) -> list[str]:
    """The metrics.json["checks"] lines 02a and 02b both record: 01's manifest, the ids
    (``ids_line``), the alignment verdict, the disk plan, the written dataset (manifest ``m``)."""
    state = "match" if align["ok"] else "MISMATCH, allowed by allow_boundary_mismatch"
    sk = m["skipped"]
    sha = gman["target"]["sha256"][:12]
    return [
        f"target sha256 and template match the generation manifest ({sha})",
        ids_line,
        (
            f"alignment on a probe sample: measured boundaries {align['measured']} ({state}; "
            f"tolerance {align['tolerance']})"
        ),
        (
            f"disk need {disk['total_bytes']} B (shards exact: {disk['shard_bytes']} B) "
            f"<= free {disk['free_bytes']} B"
        ),
        f"engine row count == token count for all {m['n_samples']} samples",
        (
            f"finite states: {len(sk['nonfinite'])} samples skipped, "
            f"{len(sk['empty_loss_mask'])} with empty loss mask skipped"
        ),
        f"{len(m['shards'])} shards written atomically with sha256",
    ]


def engine_versions(p: RunParams) -> dict:
    """``{engine: version}`` of SGLang and vLLM as installed for this run's pythons (read without
    starting them, :func:`eagle3nb.engines.versions.installed_engine_version`); an engine not
    installed is left out (the export then uses the newest version its rule table holds, and says
    so in the drafter's config)."""
    import subprocess

    from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
    from eagle3nb.engines.versions import installed_engine_version
    from eagle3nb.engines.vllm_helpers import vllm_python

    pys = {
        "sglang": DEFAULT_ENGINE_PYTHONS["sglang"] if p.sglang_python is None else p.sglang_python,
        "vllm": vllm_python(p),
    }
    out = {}
    for engine, py in pys.items():
        try:
            out[engine] = installed_engine_version(engine, py)
        except (RuntimeError, OSError, subprocess.SubprocessError):  # not installed: left out
            continue
    return out


def export_rule_check(
    p: RunParams, rd: RunDir, arch: str, n: int, trained: list[int], served: list[int]
) -> dict:
    """Before training: what each installed engine version captures, by its rule for the target's
    class, for the ids the export will write (:func:`eagle3nb.boundaries.engine_read.rule_readings`;
    SGLang 0.5.23 reads DeepSeek/Kimi ids unshifted unless the first is 1). Recorded in
    ``metrics.json["export_rules"]``; a reading other than ``trained`` is flagged (a warning).

    Raises:
        ValueError: an engine reads other boundaries than ``trained`` (names class, engine,
            version, ids and both boundary lists), unless ``allow_manifest_mismatch``.
    """
    import warnings

    from eagle3nb.boundaries.engine_read import rule_readings

    by_rule = p.export_layer_ids != "convention"
    got = rule_readings(trained, served, n, arch, engine_versions(p), by_rule)
    update_metrics(rd.metrics, "export_rules", {"trained": list(trained), "engines": got})
    for engine, r in got.items():
        if r["matches"] is False:
            msg = (
                f"{engine} {r['version']} reads the exported {engine} ids {r['ids']} of this "
                f"{arch} target as boundaries {r['reads']}, the drafter is trained on {trained} "
                "(eagle3nb.boundaries.rules)"
            )
            if not p.allow_manifest_mismatch:
                raise ValueError(
                    f"{msg}; pick boundaries whose ids it reads as meant (SGLang DeepSeek/Kimi: a "
                    "first boundary of 2), or set allow_manifest_mismatch=True to reproduce it"
                )
            warnings.warn(f"FLAGGED before training: {msg}", stacklevel=2)
    return got
