"""The shape of one engine version's file in :mod:`eagle3nb.boundaries.versions`: everything known
about that version (its id rule per architecture class, its CPU limits, the drafter variant flags it
reads), each with the source lines it was read from. Adding a version by hand is one such file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

__all__ = ["VersionFile", "RuleRow"]

# class -> (kind, lo, hi_below_n, source, limit): ``limit`` says why the capturable range stops
# where it does; for kind "refused" it is the reason for the refusal (as EngineRule.refused)
RuleRow = tuple[str, int, int, str, str]


@dataclass(frozen=True)
class VersionFile:
    """One engine version, as read in its installed sources.

    Attributes:
        engine, version: ``"sglang"`` / ``"vllm"`` and the package version without local suffix.
        read_from: where the sources were read (installed venv, sdist, wheel), one line.
        rules: ``{class: RuleRow}``, see :class:`eagle3nb.boundaries.rules.EngineRule`.
        cpu_limits: ``{class: {use: why it fails on CPU}}``, use ``"capture"``, ``"serve"`` (the
            Llama head) or ``"serve_mla"``, as measured on this machine kind.
        cpu_config_limits: ``{class: [(use, test(cfg) -> why or None)]}``: limits that depend on
            the target's text config (:mod:`eagle3nb.boundaries.cpu_checks`).
        flag_reads: ``{variant flag: where this version reads it}`` (its ``llama_eagle3.py``), or
            None where nobody read them: an export setting a flag then refuses this version.
    """

    engine: str
    version: str
    read_from: str
    rules: dict[str, RuleRow]
    cpu_limits: dict[str, dict[str, str]] = field(default_factory=dict)
    cpu_config_limits: dict[str, list[tuple[str, Callable[[dict], Optional[str]]]]] = field(
        default_factory=dict
    )
    flag_reads: Optional[dict[str, str]] = None

    def __post_init__(self):
        for arch, row in self.rules.items():
            kind = row[0]
            if kind not in ("plus1", "same", "first_id_1", "unless_n", "refused"):
                raise ValueError(f"{self.engine} {self.version} {arch}: unknown rule kind {kind!r}")
            if kind == "refused" and not row[4]:
                raise ValueError(f"{self.engine} {self.version} {arch}: a refused row names why")
