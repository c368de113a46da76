"""An engine refused in a drafter's config.json (issue 43 item 5): written so that the engine cannot
load the folder by mistake, with why and the boundary set it can capture instead. The one mechanism
behind 03's export (:mod:`eagle3nb.drafter.export`) and the audit's corrected copy
(:mod:`eagle3nb.audit.patch`).

Without its ids an engine does not stop: it serves its default ids (SGLang 0.5.23
``srt/models/llama.py:929-941``; a 5-layer target's [2, 2, 2] is one state, served unfused at tau 1.24
where the drafter as published reaches 2.21). So a refused SGLang gets :data:`REFUSED_MARK` in its
ids key instead, as ``[1, "<mark>: <why>"]``: every SGLang 0.5.x ``set_eagle3_layers_to_capture``,
which its scheduler calls at start with the drafter config's ids, then fails with a TypeError:

- ``[val + 1 for val in layer_ids]`` (Llama, Qwen, GLM-4 MoE, ...: ``models/llama.py:941``) on the
  string;
- gpt-oss's ``max(layer_ids) == num_layers`` (``models/gpt_oss.py:1349``) compares it with 1;
- DeepSeek/Kimi/GLM-lite add 1 only when the first id is 1 (``models/deepseek_v2.py:3470-3473``),
  else keep the list as it is (a string alone would pass there and capture nothing): the leading 1
  sends them to the addition too.

Measured by running each class's own method in SGLang 0.5.23's venv (tests/drafter/
test_export_refusal.py). A refused vLLM gets the same mark at its top-level key: vLLM 0.32 takes a
non-empty list there as its ids (``v1/worker/gpu_model_runner.py:5251-5285``) and fails in
``tuple(sorted(set(layers)))`` (``model_executor/models/interfaces.py:1577-1578``) when it loads the
target; without that key it would read SGLang's nested ids (boundary - 1) as its own.

``num_aux_hidden_states`` is written so that neither engine sizes ``fc`` from the marked list (vLLM
``llama_eagle3.py:209-216``, SGLang ``llama_eagle3.py:157-161``).
"""

from __future__ import annotations

import itertools

from eagle3nb.boundaries.config_ids import IDS_PATH, mark_ids
from eagle3nb.boundaries.export_ids import engine_ids

__all__ = [
    "REFUSED_MARK",
    "refuse_engine",
    "retrain_set",
    "best_capturable",
    "nearest_capturable",
    "refusal_notice",
]

REFUSED_MARK = "refused by eagle3nb, do not serve with this engine"


def refuse_engine(cfg: dict, engine: str, why: str, n_aux: int, retrain: dict | None) -> None:
    """Mark ``engine`` refused in the drafter config ``cfg``, in place: the engine's own ids key
    (:data:`eagle3nb.boundaries.config_ids.IDS_PATH`) holds ``[1, f"{REFUSED_MARK}: {why}"]``, on
    which it stops when it loads (module docstring); ``num_aux_hidden_states`` = ``n_aux``;
    ``eagle3nb.refused_engines[engine] = why`` and, where given, ``eagle3nb.retrain[engine] =
    retrain`` (:func:`retrain_set`), which 04, the model card and serve_commands.md read.

    Raises:
        ValueError: unknown engine.
    """
    mark_ids(cfg, engine, f"{REFUSED_MARK}: {why}")
    cfg["num_aux_hidden_states"] = int(n_aux)
    meta = cfg.setdefault("eagle3nb", {})
    meta.setdefault("refused_engines", {})[engine] = why
    if retrain is not None:
        meta.setdefault("retrain", {})[engine] = retrain


_NO_RULE = object()  # _capture_ids: no rule holds the class, so no set is capturable


def _capture_ids(engine: str, bs: list[int], n_layers: int, arch: str | None, version: str):
    """``engine``'s ids for boundaries ``bs`` (:func:`eagle3nb.boundaries.export_ids.engine_ids`);
    None where it cannot capture this set (ValueError: try another); :data:`_NO_RULE` where the
    answer is no rule for the class (refused, or only a convention): no set will do, never
    assumed."""
    try:
        ids, rec = engine_ids(engine, bs, n_layers, arch, version)
    except ValueError:
        return None
    if rec.get("refused") or "convention" in rec:
        return _NO_RULE
    return ids


def best_capturable(rows: list[dict], engine: str, version: str, arch: str | None, n_layers: int):
    """The row of highest tau among measured ``rows`` (``{"boundaries", "tau"}``, best first: the
    audit's candidate table) whose boundaries ``engine`` at ``version`` can be given ids for on
    ``arch`` (:func:`eagle3nb.boundaries.export_ids.engine_ids`), or None (no such row, or no rule
    for the class: never assumed).

    Returns:
        ``{"boundaries", "tau", "ids"}`` (``ids``: that engine's).
    """
    for row in rows:
        bs = list(row["boundaries"])
        if any(a >= b for a, b in zip(bs, bs[1:])):
            continue
        ids = _capture_ids(engine, bs, n_layers, arch, version)
        if ids is _NO_RULE:
            return None
        if ids is not None:
            return {"boundaries": bs, "tau": row["tau"], "ids": ids}
    return None


def nearest_capturable(
    boundaries: list[int], engine: str, version: str, arch: str | None, n_layers: int
):
    """The set of as many boundaries as ``boundaries`` that ``engine`` at ``version`` can capture on
    ``arch`` nearest to it: least total shift sum |b_i - c_i|, then least largest shift, then the
    lower set. None where no rule holds the class (never assumed) or no set is capturable.

    Returns:
        ``{"boundaries", "ids", "shift"}`` (``ids``: that engine's; ``shift``: the total).
    """
    k, n = len(boundaries), n_layers
    r = 1
    while True:  # every set within total shift r lies in the per-position windows of radius r
        windows = [range(max(0, b - r), min(n, b + r) + 1) for b in boundaries]
        found = []
        for c in itertools.product(*windows):
            d = [abs(a - b) for a, b in zip(c, boundaries)]
            if sum(d) <= r and all(a < b for a, b in zip(c, c[1:])):
                found.append((sum(d), max(d), list(c)))
        for shift, _, c in sorted(found):
            ids = _capture_ids(engine, c, n, arch, version)
            if ids is _NO_RULE:
                return None
            if ids is not None:
                return {"boundaries": c, "ids": ids, "shift": shift}
        if r >= n * k:
            return None
        r = min(2 * r, n * k)


def retrain_set(
    boundaries: list[int],
    engine: str,
    version: str,
    arch: str | None,
    n_layers: int,
    rows: list[dict] | None = None,
    table: str | None = None,
):
    """The boundary set to retrain or fine-tune at so that ``engine`` serves the drafter: the best
    of the measured ``rows`` it can capture (:func:`best_capturable`; ``table`` names where they
    come from), else the set nearest to ``boundaries`` it can capture (:func:`nearest_capturable`).

    Returns:
        ``{"boundaries", "ids", "tau" (None when not measured), "chosen_by"}`` or None.
    """
    best = best_capturable(rows or [], engine, version, arch, n_layers)
    if best is not None:
        by = f"highest tau among the sets {engine} {version} captures in {table or 'the tau table'}"
        return {**best, "chosen_by": by}
    near = nearest_capturable(list(boundaries), engine, version, arch, n_layers)
    if near is None:
        return None
    why = "no tau table measured for this drafter" if not rows else "no set of the tau table fits"
    return {
        "boundaries": near["boundaries"],
        "ids": near["ids"],
        "tau": None,
        "chosen_by": f"the set nearest to {list(boundaries)} that {engine} {version} captures "
        f"(total shift {near['shift']}; {why})",
    }


def refusal_notice(engine: str, why: str, retrain: dict | None, how: str = "") -> list[str]:
    """The lines that say an export refused ``engine``: why, that its config cannot be loaded by
    that engine by mistake, and the set to retrain or fine-tune at (:func:`retrain_set`; ``how``:
    the caller's words for doing so, appended in parentheses)."""
    stops = {
        "sglang": "SGLang stops at start (set_eagle3_layers_to_capture raises TypeError)",
        "vllm": "vLLM stops when it loads the target (sorted ids raise TypeError)",
    }[engine]
    lines = [
        f"{engine}: NOT servable ({why})",
        f"{engine} cannot serve this config.json by mistake: its ids key {IDS_PATH[engine]} holds "
        f"eagle3nb's refusal mark, on which {stops} instead of serving its default ids",
    ]
    if retrain is None:
        lines.append(
            f"to serve with {engine}: no boundary set it captures is known (no rule for "
            "the target's class)"
        )
        return lines
    tau = f", measured tau {retrain['tau']:.3f}" if retrain.get("tau") is not None else ""
    lines.append(
        f"to serve with {engine}: retrain or fine-tune at boundaries {retrain['boundaries']} "
        f"({engine} ids {retrain['ids']}{tau}), {retrain['chosen_by']}"
        + (f" ({how})" if how else "")
    )
    return lines
