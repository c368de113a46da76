"""Each engine's layer-id rule, keyed by (engine, engine version, target architecture class).

The same id names different boundaries in different engines, in different versions of one engine,
and (SGLang) in different model files of one version. This table holds, per key, how ids map to
boundaries (boundary b = the residual stream entering decoder layer b, HF ``hidden_states[b]``;
boundary N = the last layer's output before the final norm), which boundaries the engine can capture
or be served, and refusals with their reason. A key the table lacks is never assumed: it is refused
with a message saying how to measure the rule (:func:`engine_rule`).

Each engine version's rows, with the source lines they were read at, live in its own file in
:mod:`eagle3nb.boundaries.versions` (``sglang_0_5_23.py``, ``vllm_0_32_0.py``, ``vllm_0_26_0.py``;
``vllm_0_31_0.py`` and ``sglang_0_5_22.py``, measured on twins by ``bench/engine_versions.py``);
:data:`RULES` gathers them. Measured on tiny random-weight models too
(``../shared/reference/architectures.md``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

from eagle3nb.boundaries.cpu_limits import (  # re-exported: the CPU refusals preflight reads
    CPU_CONFIG_LIMITS,
    CPU_LIMITS,
    cpu_config_limit,
    cpu_limit,
)
from eagle3nb.boundaries.measured_store import MEASURED, load_record, store_record
from eagle3nb.boundaries.versions import VERSIONS

__all__ = [
    "EngineRule",
    "RULES",
    "CPU_LIMITS",
    "cpu_limit",
    "cpu_config_limit",
    "CPU_CONFIG_LIMITS",
    "engine_rule",
    "known_versions",
    "MEASURE_HOWTO",
    "READ_FROM_SOURCE",
    "register_measured",
    "check_against",
    "hidden_keys",
    "table_rule",
    "rule_known",
    "register_recorded",
]

READ_FROM_SOURCE = "read from source"

MEASURE_HOWTO = (
    "measure it: build a tiny random-weight model of this class from its config (as "
    "tests/target/tiny_archs.py does), capture it through that engine version at a few ids (e.g. "
    "eagle3nb.engines.<engine>_backend Backend.capture), name every slot by the HF boundary it "
    "equals (eagle3nb.boundaries.alignment; adjacent boundaries differ by >= 0.45 relative), read the "
    "model file's set_eagle3_layers_to_capture in the installed engine, then add its file to "
    "eagle3nb/boundaries/versions/ (one VersionFile per engine version)"
)


@dataclass(frozen=True)
class EngineRule:
    """How one engine version names the boundaries of one architecture class.

    Attributes:
        engine, version, arch: the key (``"sglang"`` / ``"vllm"``, the package version, the HF class).
        kind: ``"plus1"`` (id L = boundary L+1), ``"same"`` (id L = boundary L), ``"first_id_1"``
            (SGLang DeepSeek: +1 only when the first id is 1, else id = boundary), ``"unless_n"``
            (SGLang gpt-oss: id = boundary when the ids include N, else +1), or ``"refused"``.
        lo, hi_below_n: lowest boundary, and how far below N the highest lies (0: N itself).
        refused: why this combination is refused (None where it is supported).
        source: the installed engine's file and lines the rule was read from, or for a rule
            measured on the running engine ``"measured on a <n>-layer twin (<device>, <dtype>)"``
            (:mod:`eagle3nb.boundaries.measured`).
        limit: why the capturable range stops where it does.
        measured: a measured rule's record (engine, version, torch, device, dtype, arch,
            model_file and its sha256, eagle3nb commit, date, the probes and their matrix); None
            for a rule read from source.
    """

    engine: str
    version: str
    arch: str
    kind: str
    lo: int
    hi_below_n: int
    source: str
    refused: Optional[str] = None
    limit: str = ""  # why the range stops where it does (named in range errors)
    measured: Optional[dict] = field(default=None, compare=False, repr=False)

    @property
    def known_by(self) -> str:
        """``"measured"`` or ``"read from source"``: how this rule is known (manifests name it)."""
        return MEASURED if self.measured is not None else READ_FROM_SOURCE

    def same_rule(self, other: "EngineRule") -> bool:
        """Whether ``other`` names the same boundaries: kind, range, refused or not."""
        a = (self.kind, self.lo, self.hi_below_n, bool(self.refused))
        b = (other.kind, other.lo, other.hi_below_n, bool(other.refused))
        return a == b if self.kind != "refused" else self.kind == other.kind

    def summary(self) -> str:
        """``kind, boundaries lo..N-k`` (or ``refused``), one phrase for messages and matrices."""
        if self.refused:
            return "refused"
        return f"{self.kind}, boundaries {self.lo}..N" + (
            f"-{self.hi_below_n}" if self.hi_below_n else ""
        )

    def as_record(self) -> dict:
        """JSON form for manifests and the measured-rule store (:meth:`from_record` reads it)."""
        keys = ("engine", "version", "arch", "kind", "lo", "hi_below_n", "source", "refused")
        out = {k: getattr(self, k) for k in keys}
        out.update(limit=self.limit, known_by=self.known_by)
        if self.measured is not None:
            out["measured"] = self.measured
        return out

    @classmethod
    def from_record(cls, d: dict) -> "EngineRule":
        """The rule of a record written by :meth:`as_record`.

        Raises:
            ValueError: a record without the rule's keys (names the missing ones).
        """
        keys = ("engine", "version", "arch", "kind", "lo", "hi_below_n", "source")
        miss = [k for k in keys if k not in (d or {})]
        if miss:
            raise ValueError(f"rule record lacks {miss}: not written by EngineRule.as_record")
        return cls(
            **{k: d[k] for k in keys},
            refused=d.get("refused"),
            limit=d.get("limit", ""),
            measured=d.get("measured"),
        )

    def _name(self) -> str:
        return f"{self.engine} {self.version} on {self.arch}"

    def _check(self, n_layers: int) -> None:
        if self.refused:
            raise ValueError(f"{self._name()} is refused: {self.refused} ({self.source})")
        if not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(
                f"n_layers={n_layers!r}: must be the target's num_hidden_layers (>= 1)"
            )

    def _in_range(self, bs: Sequence[int], n: int, what: str) -> list[int]:
        lo, hi = self.lo, n - self.hi_below_n
        bad = [b for b in bs if not lo <= b <= hi]
        if bad:
            raise ValueError(
                f"{what}: {self._name()} captures boundaries {lo}..{hi} of a {n}-layer target, not "
                f"{bad} ({self.limit or 'its capture range'}; {self.source}); pick boundaries in "
                "that range"
            )
        return list(bs)

    def ids_to_boundaries(self, ids: Sequence[int], n_layers: int) -> list[int]:
        """Boundaries this engine captures (or feeds a drafter) for explicit ``ids``, in id order.

        Raises:
            ValueError: refused combination, empty or negative ids, or a boundary outside the range
                this engine captures for this class (naming the rule and its source).
        """
        self._check(n_layers)
        ids = [int(i) for i in ids]
        if not ids or min(ids) < 0:
            raise ValueError(f"ids={ids}: {self._name()} needs non-negative layer ids")
        shift = {
            "plus1": 1,
            "same": 0,
            "first_id_1": 1 if ids[0] == 1 else 0,
            "unless_n": 0 if max(ids) == n_layers else 1,
        }[self.kind]
        return self._in_range([i + shift for i in ids], n_layers, f"ids={ids}")

    def boundaries_to_ids(self, boundaries: Sequence[int], n_layers: int) -> list[int]:
        """Ids to give this engine so that it captures ``boundaries`` (increasing, as a run's are).

        Raises:
            ValueError: refused combination, a boundary outside the capturable range, or boundaries
                the rule cannot name (SGLang DeepSeek: a first boundary of 1, since first id 1 means
                boundary 2 and first id 0 boundary 0; SGLang gpt-oss: boundary 0 without N).
        """
        self._check(n_layers)
        bs = self._in_range(
            [int(b) for b in boundaries], n_layers, f"boundaries={list(boundaries)}"
        )
        if self.kind == "same":
            ids = bs
        elif self.kind == "plus1":
            ids = [b - 1 for b in bs]
        elif self.kind == "first_id_1":
            ids = bs  # first id != 1 -> unshifted
            if bs and bs[0] == 1:
                raise ValueError(
                    f"boundaries={bs}: {self._name()} cannot capture a first boundary of 1 (first "
                    f"id 1 is shifted to boundary 2, any other first id is unshifted; "
                    f"{self.source}); start at boundary 0 or >= 2"
                )
        else:  # unless_n: +1 names boundaries 1..N (id N-1 -> N); unshifted only with N included
            ids = [b - 1 for b in bs] if min(bs) >= 1 else bs
            if min(bs) == 0 and n_layers not in bs:
                raise ValueError(
                    f"boundaries={bs}: {self._name()} names boundary 0 only when the ids include "
                    f"N={n_layers} ({self.source}); drop boundary 0 or add boundary {n_layers}"
                )
        assert self.ids_to_boundaries(ids, n_layers) == bs  # the table's own round trip
        return ids

    def default_boundaries(self, n_layers: int) -> list[int]:
        """Boundaries the engine uses when a drafter config names no ids: ``[2, N//2, N-3]``
        stored unshifted in SGLang (``llama.py:934-936``), ``(2, N//2, N-3)`` as vLLM ids
        (``interfaces.py:1712-1733``): boundaries 2, N//2, N-3 in both."""
        self._check(n_layers)
        return [2, n_layers // 2, n_layers - 3]


def _rules() -> dict[tuple[str, str, str], EngineRule]:
    out = {}
    for (engine, version), vf in VERSIONS.items():
        for arch, (kind, lo, hi_below, src, limit) in vf.rules.items():
            why = None
            if kind == "refused":  # a refused row's last field is its reason
                why, limit = limit, ""
            out[(engine, version, arch)] = EngineRule(
                engine, version, arch, kind, lo, hi_below, src, why, limit
            )
    return out


RULES: dict[tuple[str, str, str], EngineRule] = _rules()


# in-process measured rules (engine, version, class) -> rule, beside the per-user store
_MEASURED: dict[tuple[str, str, str], EngineRule] = {}


def hidden_keys() -> list[tuple[str, ...]]:
    """Version-file rows hidden by ``$EAGLE3NB_HIDE_RULES`` (``"vllm 0.32.0"`` hides a version,
    ``"vllm 0.32.0 LlamaForCausalLM"`` one class; entries separated by ``,`` or ``;``): the lookup
    then treats them as unknown and falls back to a measured rule, as for a version no file holds
    (tests and the engine-versions bench check measured rules against rows this way)."""
    out = []
    for part in os.environ.get("EAGLE3NB_HIDE_RULES", "").replace(";", ",").split(","):
        if part.split():
            out.append(tuple(part.split()))
    return out


def _hidden(engine: str, version: str, arch: str) -> bool:
    return any(
        h == (engine, version)[: len(h)] or h == (engine, version, arch) for h in hidden_keys()
    )


def table_rule(engine: str, version: str, arch: str) -> Optional[EngineRule]:
    """The version file's row of this key (read from source), or None (absent or hidden)."""
    v = str(version).split("+")[0]
    return None if _hidden(engine, v, arch) else RULES.get((engine, v, arch))


def check_against(measured: Optional[EngineRule], table: Optional[EngineRule]) -> None:
    """Stop where a measured rule and a version file's row of the same key disagree.

    Raises:
        ValueError: naming both rules, the row's source and the measured matrix.
    """
    if table is None or measured is None or measured.same_rule(table):
        return
    raise ValueError(
        f"{measured.engine} {measured.version} on {measured.arch}: the rule measured on the "
        f"running engine ({measured.summary()}) disagrees with its version file's row "
        f"({table.summary()}, read from source: {table.source}); the engine does not capture what "
        "its file says: re-read the model file in the installed engine and fix "
        f"eagle3nb/boundaries/versions/{measured.engine}_{measured.version.replace('.', '_')}.py\n"
        + str((measured.measured or {}).get("matrix", ""))
    )


def register_measured(rule: EngineRule, keep: bool = True):
    """Use a measured ``rule`` for its key from now on in this process, and (``keep``) in the
    per-user store (:func:`eagle3nb.boundaries.measured_store.store_record`). Returns the stored
    file or None.

    Raises:
        ValueError: not a measured rule, or one that disagrees with the version file's row of
            the same key (:func:`check_against`, hidden rows included: a test hides a row to
            measure it, and the two must agree).
    """
    if rule.measured is None:
        raise ValueError(f"{rule._name()}: source={rule.source!r} is not a measured rule")
    check_against(rule, RULES.get((rule.engine, rule.version, rule.arch)))
    _MEASURED[(rule.engine, rule.version, rule.arch)] = rule
    return store_record(rule.as_record()) if keep else None


def measured_rule(engine: str, version: str, arch: str) -> Optional[EngineRule]:
    """The measured rule of this key: registered in this process, else kept per user; None."""
    v = str(version).split("+")[0]
    rule = _MEASURED.get((engine, v, arch))
    if rule is None:
        rec = load_record(engine, v, arch)
        rule = EngineRule.from_record(rec) if rec else None
    return rule


def known_versions(engine: str) -> list[str]:
    """Versions of ``engine`` the table holds rules for."""
    return sorted({v for e, v, _ in RULES if e == engine})


def engine_rule(engine: str, version: str, arch: str, measured: bool = True) -> EngineRule:
    """The rule of ``engine`` at ``version`` for architecture class ``arch``: the version file's
    row (read from source), else (``measured``) a rule measured on the running engine
    (:func:`measured_rule`: registered in this process or kept per user).

    ``version`` may carry a local suffix (``0.32.0+cpu``), which is ignored. A refused combination is
    returned (its methods raise with the reason), so callers can show it in a support matrix.

    Raises:
        ValueError: an engine, version or class neither a version file nor a measurement holds,
            naming what the files hold and how the rule gets measured (:data:`MEASURE_HOWTO`);
            never assumed from a neighbour. A measured rule that disagrees with the row
            (:func:`check_against`).
    """
    v = str(version).split("+")[0]
    row = table_rule(engine, v, arch)
    got = measured_rule(engine, v, arch) if measured else None
    check_against(got, RULES.get((engine, v, arch)))
    if row is not None or got is not None:
        return row or got
    versions = known_versions(engine)
    archs = sorted({a for e, vv, a in RULES if e == engine and vv == v})
    what = (
        f"engine={engine!r} is unknown (known: sglang, vllm)"
        if engine not in ("sglang", "vllm")
        else f"{engine} {version} is not in the table (known versions: {versions})"
        if not archs or _hidden(engine, v, "")
        else f"{engine} {version} has no rule for {arch} (known classes: {archs})"
    )
    raise ValueError(
        f"{what} and was not measured here; the layer-id rule is never assumed: run preflight or "
        f"02 with the engine installed (twin_check on: it measures the rule on the running engine "
        f"and keeps it), or {MEASURE_HOWTO}"
    )


def rule_known(engine: str, version, arch) -> dict:
    """``{"rule_known_by": "read from source" | "measured", "rule_source"}`` of this key's rule
    (:func:`engine_rule`), for reports (04's served rows); ``{}`` where none is known."""
    try:
        rule = engine_rule(engine, str(version), arch) if arch and version else None
    except ValueError:
        return {}
    return {"rule_known_by": rule.known_by, "rule_source": rule.source} if rule else {}


def register_recorded(manifest: dict) -> list[EngineRule]:
    """Register (in this process, not kept) the measured rule a dataset manifest recorded in its
    twin check (``manifest["twin_check"]["engine_rule"]``, written by 02), so later steps (03's
    export, 04) read the rule the capture used even without the per-user store. Returns the rules
    registered.

    Raises:
        ValueError: a recorded rule that disagrees with the version file's row (:func:`check_against`).
    """
    rec = ((manifest or {}).get("twin_check") or {}).get("engine_rule") or {}
    if not rec.get("measured"):
        return []
    rule = EngineRule.from_record(rec)
    register_measured(rule, keep=False)
    return [rule]
