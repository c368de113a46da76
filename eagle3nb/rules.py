"""``python -m eagle3nb.rules``: the support matrix of the engines installed here, class x engine
version: how each rule is known (``read from source``: a file of
:mod:`eagle3nb.boundaries.versions`; ``measured``: kept from a run on that engine,
:mod:`eagle3nb.boundaries.measured_store`; ``not measured``: preflight measures it on the first
run), the rule, and the boundaries the engine would read from a drafter exported for a
``--layers``-layer target at ``--boundaries`` (default ``2, N//2, N-3``).

Engines: every venv under ``$EAGLE3NB_ENGINES`` (``~/.cache/eagle3nb/engines/<name>/bin/python``,
the engine from the name's start) and each ``--python ENGINE=PATH``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["installed_engines", "support_matrix", "main"]


def installed_engines(extra: dict | None = None) -> list[tuple[str, str, str]]:
    """``[(engine, version, python)]`` for each engine venv found (see the module docstring),
    sorted; a venv whose version cannot be read is left out."""
    from eagle3nb.engines.client import ENGINES_HOME
    from eagle3nb.engines.versions import installed_engine_version

    found = {}
    pys = [(d.name, d / "bin" / "python") for d in sorted(Path(ENGINES_HOME).glob("*"))]
    for name, py in pys + [(e, Path(p)) for e, p in (extra or {}).items()]:
        engine = next((e for e in ("vllm", "sglang") if name.startswith(e)), None)
        if engine is None or not py.exists():
            continue
        try:
            version = installed_engine_version(engine, str(py)).split("+")[0]
        except (RuntimeError, OSError):
            continue
        found.setdefault((engine, version), str(py))
    return sorted((e, v, p) for (e, v), p in found.items())


def support_matrix(engines, n_layers: int, boundaries: list[int]) -> list[dict]:
    """One row per (class, engine, version): ``{"arch", "engine", "version", "known_by", "rule",
    "source", "ids", "reads"}``; ``rule`` ``"refused"``/``"-"`` and ``reads`` the reason where
    none is read."""
    from eagle3nb.boundaries.export_ids import engine_ids
    from eagle3nb.boundaries.rules import engine_rule
    from eagle3nb.target.models import SUPPORTED_ARCHS

    rows = []
    for arch in sorted(SUPPORTED_ARCHS):
        for engine, version, _ in engines:
            row = {"arch": arch, "engine": engine, "version": version}
            try:
                rule = engine_rule(engine, version, arch)
            except ValueError:
                rows.append(dict(row, known_by="not measured", rule="-", source="-", ids=None))
                rows[-1]["reads"] = "preflight measures it on the first run"
                continue
            row.update(known_by=rule.known_by, rule=rule.kind, source=rule.source, ids=None)
            try:
                ids = engine_ids(engine, boundaries, n_layers, arch, version)[0]
                row.update(ids=ids, reads=rule.ids_to_boundaries(ids, n_layers))
            except ValueError as e:
                row["reads"] = str(e).split(";")[0][:120]
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle3nb.rules", description=__doc__)
    ap.add_argument("--layers", type=int, default=32, help="target layers N (default 32)")
    ap.add_argument("--boundaries", type=int, nargs="+", help="default: 2 N//2 N-3")
    ap.add_argument("--python", action="append", default=[], metavar="ENGINE=PATH")
    a = ap.parse_args(argv)
    extra = dict(s.split("=", 1) for s in a.python)
    n = a.layers
    b = a.boundaries or [2, n // 2, n - 3]
    engines = installed_engines(extra)
    if not engines:
        print("no engine venv found (bash .ci/setup_engines.sh, or --python vllm=PATH)")
        return 1
    print(f"engines: {', '.join(f'{e} {v} ({p})' for e, v, p in engines)}")
    print(f"a drafter exported for a {n}-layer target at boundaries {b}:")
    for r in support_matrix(engines, n, b):
        reads = r["reads"]
        print(
            f"{r['arch']:34s} {r['engine']} {r['version']:8s} {r['known_by']:16s} "
            f"{r['rule']:10s} ids {r['ids']} -> {reads}  [{r['source']}]"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
