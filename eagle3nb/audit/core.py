"""run_audit: read a drafter folder, refuse it when it cannot belong to the target, say which
boundaries each engine feeds it, measure acceptance over candidate boundary sets with the
simulator, and write the corrected folder, the serving commands, audit.json and the figure."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

from eagle3nb.audit.flavour import flavour_reading
from eagle3nb.audit.formats import check_belongs, loadable_copy, read_drafter_folder
from eagle3nb.audit.measure import candidate_sets, engine_readings, measure_candidates, verdict
from eagle3nb.audit.patch import commands, write_patched
from eagle3nb.audit.servable import annotate_readings, unfused_drafter
from eagle3nb.boundaries.refusal import refusal_notice
from eagle3nb.text.prompts import DEFAULT_PROMPTS, load_prompts, split_prompts

__all__ = ["installed_versions", "heldout_prompt_ids", "check_drafter", "run_audit"]


def installed_versions(pythons: dict | None = None) -> dict:
    """``{engine: installed version or None}`` for the engines' venvs (``pythons``: ``{engine:
    python}``, default the venvs of ``.ci/setup_engines.sh``), read without starting them."""
    from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
    from eagle3nb.engines.versions import installed_engine_version

    out = {}
    for engine in ("sglang", "vllm"):
        py = (pythons or {}).get(engine, DEFAULT_ENGINE_PYTHONS[engine])
        try:
            out[engine] = installed_engine_version(engine, py) if Path(py).is_file() else None
        except RuntimeError:
            out[engine] = None
    return out


def heldout_prompt_ids(tok, prompts_file=DEFAULT_PROMPTS, fraction: float = 0.15, n: int = 12):
    """The first ``n`` held-out prompts of ``prompts_file`` (the deterministic split of
    :func:`eagle3nb.text.prompts.split_prompts`, which training never sees), tokenized."""
    _, held = split_prompts(load_prompts(prompts_file), fraction)
    if not held:
        raise ValueError(
            f"prompts_file={str(prompts_file)!r} holds no held-out prompt at heldout_fraction={fraction}"
        )
    return [tok(p).input_ids for p in held[:n]]


def check_drafter(drafter: str | os.PathLike, model: str | os.PathLike):
    """The drafter folder read and refused when it cannot belong to the target, from the target's
    config and tokenizer only (no weights): what :func:`run_audit` checks first, for a caller that
    loads the target before calling it.

    Raises:
        FileNotFoundError, ValueError: as :func:`eagle3nb.audit.formats.read_drafter_folder` and
            :func:`eagle3nb.audit.formats.check_belongs` (the field named).
    """
    from eagle3nb.target import models

    path = models.resolve_model(model)
    cfg = models.read_model_config(path)
    tcfg = models.text_config(cfg)
    folder = read_drafter_folder(drafter, int(tcfg["num_hidden_layers"]), models.target_arch(cfg))
    check_belongs(folder, tcfg, len(models.load_tokenizer(path)))
    return folder


def run_audit(
    drafter: str | os.PathLike,
    model: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    engine: str | None = None,
    prompts_ids: Sequence[Sequence[int]] | Mapping[str, Sequence[Sequence[int]]] | None = None,
    k: int = 4,
    max_new_tokens: int = 48,
    radius: int = 1,
    versions: dict | None = None,
    target=None,
    progress: Callable | None = None,
) -> dict:
    """The audit of ``drafter`` (a folder in any format of :mod:`eagle3nb.audit.formats`) for the
    target ``model`` (folder or name, :func:`eagle3nb.target.models.resolve_model`).

    Args:
        out_dir: where ``drafter/`` (the corrected copy), ``audit.json`` and ``serve_commands.json``
            go (None: measure and report only). engine: ``sglang`` or ``vllm`` to name one engine
            in the summary (both are always read). prompts_ids: held-out prompts (default:
            :func:`heldout_prompt_ids`), or ``{set name: prompts}`` (e.g. ``heldout`` and a
            benchmark's turns, :func:`eagle3nb.steps.audit.prompts.audit_prompts`): the verdict reads all
            of them, each row's ``by_set`` says tau per set. radius: candidate boundaries within this of the declared
            ones. versions: ``{engine: version or None}`` (default: the installed venvs).
            target: ``(model, tokenizer, path)`` already loaded (float32).

    Returns:
        ``{"drafter", "format", "declared", "declared_how", "readings", "candidates": rows best
        first, "verdict", "engine", "prompts" (count), "prompt_sets" ({set: count}), "patched"
        (None without out_dir), "commands", "notes"}``.

    Raises:
        ValueError: ``engine`` unknown; a drafter that cannot belong to the target (the field
            named, :func:`eagle3nb.audit.formats.check_belongs`), before the target's weights load.
    """
    from eagle3nb.drafter.export import load_drafter
    from eagle3nb.target import models

    if engine not in (None, "sglang", "vllm"):
        raise ValueError(f"engine={engine!r}: use sglang or vllm (or leave it out for both)")
    path = models.resolve_model(model) if target is None else Path(target[2])
    tcfg = models.text_config(models.read_model_config(path))
    arch = models.target_arch(models.read_model_config(path))
    n = int(tcfg["num_hidden_layers"])
    folder = read_drafter_folder(drafter, n, arch)  # SGLang's ids by its rule for this class
    tok = target[1] if target is not None else models.load_tokenizer(path)
    check_belongs(folder, tcfg, len(tok))
    readings = engine_readings(folder.config, n, arch, versions or installed_versions())
    with tempfile.TemporaryDirectory(prefix="eagle3nb-audit-") as tmp:
        loadable = loadable_copy(folder, Path(tmp) / "drafter")
        m = target[0] if target is not None else models.load_target(path, "float32")[0]
        emb = m.get_input_embeddings().weight.detach().float().cpu()
        d, _ = load_drafter(loadable, emb)
        d.to(next(m.parameters()).device)
        width_ok = int(tcfg["hidden_size"]) == d.config.hidden_size
        annotate_readings(readings, folder, d.config.n_aux, width_ok, arch, tcfg)
        fed = [r["boundaries"] for r in readings.values() if "boundaries" in r and not r["unfused"]]
        extra = [bs for bs in fed + [[2, n // 2, n - 3]] if _increasing(bs)]
        cands = candidate_sets(folder.declared, extra, n, d.config.n_aux, radius)
        sets = _prompt_sets(prompts_ids if prompts_ids is not None else heldout_prompt_ids(tok))
        ids = [q for qs in sets.values() for q in qs]
        groups = [name for name, qs in sets.items() for _ in qs] if len(sets) > 1 else None
        eos = models.stop_token_ids(m, tok)  # as 04 and the engines' serve_acceptance stop
        rows = measure_candidates(m, d, cands, ids, k, max_new_tokens, eos, progress, groups)
        v = verdict(rows, folder.declared)
        flav = flavour_reading(m, d, v["recommended"], ids, k, max_new_tokens, eos)
        for r in readings.values():
            if r.get("unfused"):  # SGLang's one state without fc: measured as it serves it
                one = measure_candidates(
                    m, unfused_drafter(d), [r["boundaries"]], ids, k, max_new_tokens, eos
                )[0]
                r.update({x: one[x] for x in ("tau", "cycles", "accepted_per_pos")})
                continue
            r["tau"] = next(
                (x["tau"] for x in rows if x["boundaries"] == r.get("boundaries")), None
            )
            r["feeds_recommended"] = r.get("boundaries") == v["recommended"]
        result = {
            "drafter": str(folder.path),
            "target": str(path),
            "target_architecture": arch,
            "format": folder.format,
            "declared": folder.declared,
            "declared_how": folder.declared_how,
            "readings": readings,
            "candidates": rows,
            "verdict": v,
            "flavour": flav,
            "engine": engine,
            "k": k,
            "prompts": len(ids),
            "prompt_sets": {name: len(qs) for name, qs in sets.items()},
            "max_new_tokens": max_new_tokens,
            "patched": None,
            "commands": None,
            "notes": folder.notes,
        }
        if out_dir is not None:
            _write(result, loadable, Path(out_dir), n, arch, str(path), k)
    return result


def _increasing(bs) -> bool:
    return all(a < b for a, b in zip(bs, bs[1:]))


def _prompt_sets(prompts) -> dict:
    """``{set name: prompt id lists}`` from a mapping, or one list named ``heldout``; empty sets
    are dropped (at least one prompt must remain: :func:`measure_candidates` refuses none)."""
    sets = dict(prompts) if isinstance(prompts, Mapping) else {"heldout": prompts}
    return {name: [list(q) for q in qs] for name, qs in sets.items() if len(qs)}


def _write(result: dict, loadable: Path, out: Path, n: int, arch: str, target: str, k: int):
    """The corrected copy, commands and audit.json into ``out`` (filled into ``result``)."""
    if out.resolve() == Path(result["drafter"]).resolve():
        raise ValueError(
            f"out={str(out)!r} is the drafter folder; the original is never overwritten"
        )
    out.mkdir(parents=True, exist_ok=True)
    v = result["verdict"]
    record = {"source": result["drafter"], "format": result["format"], "declared": v["declared"]}
    record.update(recommended=v["recommended"], why=v["why"], trained_on=v["trained_on"])
    record.update(nll_margin=v["nll_margin"], tau=v["trained_tau"])
    record.update(declared_tau=v["declared_tau"], best_tau_set=v["best"], best_tau=v["best_tau"])
    dst = out / "drafter"
    served = write_patched(
        loadable, dst, v["recommended"], n, arch, result["readings"], record, result["candidates"]
    )
    result["patched"] = {"folder": str(dst), "engines": served}
    result["commands"] = commands(target, str(dst), k, served)
    (out / "serve_commands.json").write_text(json.dumps(result["commands"], indent=2) + "\n")
    (out / "audit.json").write_text(json.dumps(result, indent=2) + "\n")


def summary_lines(result: dict) -> list[str]:
    """The audit in a few lines for a terminal or a notebook cell."""
    v = result["verdict"]
    out = [
        f"drafter {result['drafter']} ({result['format']} format), target "
        f"{result['target_architecture']}",
        f"declared boundaries: {v['declared']} ({result['declared_how']}), tau "
        f"{_f(v['declared_tau'])}",
        f"trained on: {v['trained_on']} (lowest first-draft NLL {_f(v['trained_nll'])} nats/token;"
        f" next {v['nll_next_set']} {_f(v['nll_next'])}, margin {_f(v['nll_margin'])}), tau "
        f"{_f(v['trained_tau'])}",
        f"highest tau: {v['best']} tau {_f(v['best_tau'])}; next {v['next_best']} tau "
        f"{_f(v['next_tau'])} (margin {_f(v['margin'])}) over {result['prompts']} prompts "
        f"({_sets(result)}), k={result['k']}",
        f"recommended: {v['recommended']} ({v['why']})",
    ]
    fl = result.get("flavour") or {}
    if fl.get("swapped"):
        sw = fl["swapped"]
        out.append(f"flavour {fl['flavour']}; read as {sw['flavour']}: tau {_f(sw['tau'])}")
    elif fl:
        out.append(f"flavour {fl['flavour']}")
    rec = next((r for r in result["candidates"] if r["boundaries"] == v["recommended"]), {})
    for name, x in (rec.get("by_set") or {}).items():
        out.append(f"  recommended set on {name}: tau {_f(x['tau'])} over {x['cycles']} cycles")
    for e, r in result["readings"].items():
        if result["engine"] and e != result["engine"]:
            continue
        got = r.get("refused") or (
            f"feeds {r['boundaries']} ({r['ids_source']}"
            + (", one state without fc" if r.get("unfused") else "")
            + f") tau {_f(r['tau'])}"
        )
        inst = "" if r["installed"] else " (not installed: table rule)"
        out.append(f"  {e} {r['version']}{inst}: {got}" + _cpu(r))
    if result["patched"]:
        out.append(f"corrected copy: {result['patched']['folder']}")
        for e, r in result["patched"]["engines"].items():
            if "refused" not in r:
                out.append(f"  {e}: ids {r['ids']} -> {r['reads']}" + _cpu(r))
                continue
            how = "fine-tune: init_from: this drafter, init_boundaries: params"
            out += [f"  {x}" for x in refusal_notice(e, r["refused"], r.get("retrain"), how)]
    return out + [f"note: {x}" for x in result["notes"]]


def _cpu(r: dict) -> str:
    return f"; on CPU refused: {r['cpu_refused']}" if r.get("cpu_refused") else ""


def _sets(result: dict) -> str:
    sets = result.get("prompt_sets") or {"heldout": result["prompts"]}
    return ", ".join(f"{n} {c}" for n, c in sets.items())


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"
