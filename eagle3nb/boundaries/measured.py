"""Layer-id rules measured on the spot, for an (engine, version, class) no version file holds.

The running engine captures a tiny random twin of the target at a few id sets (:func:`probe_plan`:
ids 0, 1, a middle id, N-2, N-1 and N, in sets that tell the rule kinds apart, plus the run's own
ids); every captured slot is named by the HF boundary it equals (``engines/twin_measure.py``). From
that matrix :func:`derive_rule` builds an :class:`~eagle3nb.boundaries.rules.EngineRule` whose
``source`` starts with ``"measured"`` and whose ``measured`` holds the record (engine, version,
torch, device, dtype, class, the sha256 of the engine's model file for the class, eagle3nb commit,
date, the matrix). A slot no boundary matches, or id sets whose slots are not one shift per set, are
refused with the matrix, never guessed.

Measured rules are kept per user (:mod:`eagle3nb.boundaries.measured_store`, one JSON file per key)
and read back by :func:`eagle3nb.boundaries.rules.engine_rule` when no version file holds the key;
a measured rule that disagrees with a version file's row for the same key stops the run
(:func:`eagle3nb.boundaries.rules.check_against`).
"""

from __future__ import annotations

from typing import Sequence

from eagle3nb.boundaries.measured_store import MEASURED
from eagle3nb.boundaries.rules import EngineRule

__all__ = ["MEASURED", "probe_plan", "derive_rule", "matrix_text"]

# kinds tried in this order: the first that explains every probe wins (a later kind differs from an
# earlier one only on id sets the engine refused, so both say the same about what it accepts)
_KINDS = ("same", "plus1", "first_id_1", "unless_n")


def probe_plan(n: int, run_ids: Sequence[int] = ()) -> list[list[int]]:
    """Id sets to capture on an ``n``-layer twin to tell every known rule kind apart: ``[0, mid,
    n-2]`` (first id 0, no N), ``[1, mid, n-2]`` (first id 1), ``[0, mid, n]`` (0 with N: SGLang
    gpt-oss names boundary 0 only so), ``[n-1, n]`` (the top without 0), then ``run_ids`` (the
    run's own, on the twin) when not one of them. ``mid = n // 2``; ``n >= 4`` (twins have at
    least 4 layers). Each set is one engine build of the twin.

    Raises:
        ValueError: ``n < 4``.
    """
    if n < 4:
        raise ValueError(f"n={n}: a twin has at least 4 layers")
    mid = n // 2
    plan = [sorted({0, mid, n - 2}), sorted({1, mid, n - 2}), [0, mid, n], [n - 1, n]]
    run = [int(i) for i in run_ids]
    if run and run not in plan:
        plan.append(run)
    return plan


def matrix_text(n: int, probes: Sequence[dict]) -> str:
    """The measured matrix, one line per id set: ``ids [0, 3, 4] -> boundaries [1, 4, 5]`` or
    ``-> refused: <error, first line>``; unnamed slots show as ``?``."""
    lines = [f"{n}-layer twin:"]
    for p in probes:
        if p.get("error"):
            err = str(p["error"]).strip().splitlines()
            lines.append(f"  ids {p['ids']} -> refused: {(err[-1] if err else '')[:200]}")
        else:
            b = ["?" if x is None else x for x in p["boundaries"]]
            lines.append(f"  ids {p['ids']} -> boundaries {b}".replace("'", ""))
    return "\n".join(lines)


def _shift(kind: str, ids: list[int], n: int) -> int:
    return {
        "plus1": 1,
        "same": 0,
        "first_id_1": 1 if ids[0] == 1 else 0,
        "unless_n": 0 if max(ids) == n else 1,
    }[kind]


def derive_rule(engine: str, version: str, arch: str, n: int, probes: Sequence[dict], record: dict):
    """The rule that explains every probe of an ``n``-layer twin.

    Args:
        probes: ``[{"ids": [...], "boundaries": [b or None per slot]} | {"ids", "error": str}]``:
            each id set the engine captured, with the boundary each slot equals (None: no boundary
            within tolerance), or why the engine refused the set.
        record: what the measurement ran on (engine, version, torch, device, dtype, class, model
            file sha256, eagle3nb commit, date); stored on the rule with the probes.

    Returns:
        :class:`~eagle3nb.boundaries.rules.EngineRule` with ``source`` ``"measured ..."``: kind the
        first of ``same, plus1, first_id_1, unless_n`` whose shift explains every captured set; lo
        and hi the lowest and highest boundary captured; every refused set must be refused by the
        rule too. All sets refused -> kind ``"refused"`` with the engine's errors.

    Raises:
        ValueError: a slot no boundary matches, a set whose slots are not one shift, no kind that
            explains every set, or a refused set the rule would accept; the matrix is in the message.
    """
    name = f"{engine} {version} on {arch}"
    mat = matrix_text(n, probes)
    probes = [dict(p, ids=[int(i) for i in p["ids"]]) for p in probes]
    ok = [p for p in probes if not p.get("error")]
    rec = dict(record, probes=probes, twin_layers=n, matrix=mat)
    src = (
        f"{MEASURED} on a {n}-layer twin ({record.get('device', '?')}, {record.get('dtype', '?')})"
    )
    if not ok:
        why = f"{MEASURED}: every id set was refused by the engine ({mat})"
        return EngineRule(engine, version, arch, "refused", 0, 0, src, why, "", rec)
    for p in ok:
        if any(b is None for b in p["boundaries"]) or len(p["boundaries"]) != len(p["ids"]):
            raise ValueError(
                f"{name}: the twin's slots cannot all be named by a boundary (no HF boundary "
                f"within tolerance, or another slot count than ids), so the rule is not measured "
                f"and never guessed:\n{mat}\nCheck the engine's capture of this class, or set "
                "extract_engine: hf"
            )
        if len({b - i for b, i in zip(p["boundaries"], p["ids"])}) != 1:
            raise ValueError(
                f"{name}: ids {p['ids']} came back as boundaries {p['boundaries']}, not one offset "
                f"for the set: no id rule eagle3nb knows (plus1, same, first_id_1, unless_n) "
                f"describes it, so it is refused:\n{mat}"
            )
    kind = next(
        (
            k
            for k in _KINDS
            if all(p["boundaries"][0] - p["ids"][0] == _shift(k, p["ids"], n) for p in ok)
        ),
        None,
    )
    if kind is None:
        raise ValueError(
            f"{name}: no one rule (plus1, same, first_id_1, unless_n) explains every id set, so "
            f"it is refused:\n{mat}"
        )
    lo = min(min(p["boundaries"]) for p in ok)
    hi = max(max(p["boundaries"]) for p in ok)
    limit = f"{MEASURED}: boundaries {lo}..N-{n - hi} came back, other ids were refused"
    rule = EngineRule(engine, version, arch, kind, lo, n - hi, src, None, limit, rec)
    for p in probes:
        if p.get("error"):
            try:
                rule.ids_to_boundaries(p["ids"], n)
            except ValueError:
                continue
            raise ValueError(
                f"{name}: the engine refused ids {p['ids']} that the measured rule {kind!r} "
                f"(boundaries {lo}..{hi}) would accept, so the refusal is not one of capture "
                f"range:\n{mat}"
            )
    return rule
