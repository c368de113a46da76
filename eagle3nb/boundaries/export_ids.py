"""The layer ids an export writes for each engine: by that engine version's rule for the target's
class (:mod:`eagle3nb.boundaries.rules`), or by the engine's generic convention where the class is
unknown, the table lacks it, the engine refuses it, or ``export_layer_ids: convention`` asks for the
hand-written form. Used by :mod:`eagle3nb.drafter.export` and, to predict what an engine will read,
by :func:`eagle3nb.boundaries.engine_read.rule_readings`.
"""

from __future__ import annotations

from eagle3nb.boundaries.conventions import get_convention
from eagle3nb.boundaries.rules import engine_rule, known_versions

__all__ = ["engine_ids"]


def engine_ids(
    engine: str,
    boundaries: list[int],
    n_layers: int,
    arch: str | None,
    version: str | None = None,
    by_rule: bool = True,
) -> tuple[list[int], dict]:
    """The ids that make ``engine`` capture ``boundaries`` of a ``n_layers`` target of class ``arch``,
    by that engine version's rule (:func:`eagle3nb.boundaries.rules.engine_rule`; ``version``
    None = the newest version the table holds). ``by_rule=False`` writes the engine's generic
    convention instead (what hand-written configs and other trainers write; ``export_layer_ids:
    convention`` reproduces the per-class mismatch), the record still naming the rule the engine
    applies when it reads them (``ids_written_by: convention``).

    Returns:
        ``(ids, record)``; ``record`` names the version, rule kind, source and ``known_by``
        (``"read from source"`` or ``"measured"``, then with the measured rule's whole record
        ``rule_record``: engine, version, torch, device, dtype, class, model file sha256, commit,
        date, matrix), or why the plain
        convention of :mod:`eagle3nb.boundaries.conventions` was used (no class, no rule, refused).

    Raises:
        ValueError: boundaries the rule (or convention) cannot name for this engine.
    """
    conv = get_convention(engine).boundaries_to_ids
    if not arch:
        return conv(boundaries, n_layers), {"convention": engine, "why": "target class unknown"}
    v = version or known_versions(engine)[-1]
    try:
        rule = engine_rule(engine, v, arch)
    except ValueError as e:  # version or class the table lacks
        return conv(boundaries, n_layers), {"version": v, "convention": engine, "why": str(e)}
    rec = {"version": v, "rule": rule.kind, "source": rule.source, "known_by": rule.known_by}
    if rule.measured is not None:  # the whole rule: a later reader needs no per-user store
        rec["rule_record"] = rule.as_record()
    if rule.refused:
        rec.update(convention=engine, refused=rule.refused)
        return conv(boundaries, n_layers), rec
    if not by_rule:
        rec["ids_written_by"] = "convention"
        return conv(boundaries, n_layers), rec
    return rule.boundaries_to_ids(boundaries, n_layers), rec
