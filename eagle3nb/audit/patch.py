"""The corrected drafter folder: a copy whose config.json makes each engine feed the measured
boundaries, checked by reading it back as each engine reads it; and the serving commands."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from eagle3nb.drafter.card import serve_commands
from eagle3nb.boundaries.config_ids import set_ids
from eagle3nb.boundaries.engine_read import read_as_engine
from eagle3nb.boundaries.export_ids import engine_ids
from eagle3nb.boundaries.refusal import REFUSED_MARK, refuse_engine, retrain_set
from eagle3nb.boundaries.rules import engine_rule

__all__ = ["write_patched", "REFUSED_MARK"]


def write_patched(
    loadable: str | os.PathLike,
    out_dir: str | os.PathLike,
    boundaries: list[int],
    n_layers: int,
    arch: str,
    readings: dict,
    audit_record: dict,
    rows: list[dict] | None = None,
) -> dict:
    """Copy ``loadable`` (the drafter in eagle3nb's form, :func:`eagle3nb.audit.formats.loadable_copy`)
    to ``out_dir`` with each engine's ids for ``boundaries``: SGLang's in
    ``eagle_config.eagle_aux_hidden_state_layer_ids``, vLLM's at the top level, each by its
    version's rule for ``arch`` (:func:`eagle3nb.boundaries.export_ids.engine_ids`; versions from
    ``readings``, :func:`eagle3nb.audit.measure.engine_readings`). The ``eagle3nb`` block records
    the boundaries and ``audit_record``.

    Returns:
        ``{engine: {"ids", "reads", "ok", "cpu_refused"}}`` (``reads``: the written file read back
        as that engine reads it, :func:`eagle3nb.boundaries.engine_read.read_as_engine`;
        ``cpu_refused``: why it cannot serve this drafter on CPU, or None, from ``readings``), or
        ``{"refused": why, "retrain": the set to retrain at or None}`` for an engine whose rule
        cannot feed ``boundaries``. A refused engine cannot load the copy by mistake: its ids key
        holds eagle3nb's refusal mark (:func:`eagle3nb.boundaries.refusal.refuse_engine`, the one
        mechanism 03's export uses too: SGLang stops at start, vLLM when it loads; without ids
        SGLang would serve its default ids, e.g. one state unfused). ``retrain``:
        :func:`eagle3nb.boundaries.refusal.retrain_set`, the best of ``rows`` (the audit's table)
        it can feed, else the set nearest to ``boundaries``.

    Raises:
        ValueError: ``out_dir`` is the source folder.
    """
    src, dst = Path(loadable), Path(out_dir)
    if dst.resolve() == src.resolve():
        raise ValueError(f"out_dir={str(dst)!r} is the drafter folder itself; never overwritten")
    cfg = json.loads((src / "config.json").read_text())
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    out = {}
    cfg.setdefault("eagle_config", {"use_aux_hidden_state": True})
    meta = cfg.setdefault("eagle3nb", {})
    for key in ("engine_ids", "refused_engines", "retrain"):  # the source's, if an export's
        meta.pop(key, None)
    for engine in ("sglang", "vllm"):
        v = readings[engine]["version"]
        try:
            rule = engine_rule(engine, v, arch)
            if rule.refused:
                raise ValueError(rule.refused)
            ids, rec = engine_ids(engine, list(boundaries), n_layers, arch, v)
        except ValueError as e:
            why = f"{engine} {v} on {arch}: {e}"
            best = retrain_set(boundaries, engine, v, arch, n_layers, rows, "the audit's table")
            out[engine] = {"refused": why, "retrain": best}
            refuse_engine(cfg, engine, why, len(boundaries), best)
            continue
        set_ids(cfg, engine, ids)
        meta.setdefault("engine_ids", {})[engine] = {"ids": ids, **rec}
        out[engine] = {"ids": ids}
    meta.update(
        aux_boundaries=list(boundaries),
        target_num_hidden_layers=n_layers,
        target_architecture=arch,
        audit=audit_record,
    )
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
    for engine, r in out.items():
        if "ids" in r:
            rule = engine_rule(engine, readings[engine]["version"], arch)
            r["reads"] = read_as_engine(cfg, engine, n_layers, rule)["boundaries"]
            r["ok"] = r["reads"] == list(boundaries)
        r["cpu_refused"] = readings[engine].get("cpu_refused")
    return out


def commands(target: str, drafter: str, k: int, served: dict) -> dict:
    """:func:`eagle3nb.drafter.card.serve_commands` for the engines ``served`` (write_patched's
    result) can feed; an engine it refused maps to why."""
    cmds = serve_commands(target, drafter, k)
    out = {}
    for name, cmd in cmds.items():
        engine = "sglang" if name.startswith("sglang") else "vllm"
        out[name] = (
            cmd if served.get(engine, {}).get("ok") else served.get(engine, {}).get("refused")
        )
    return out
