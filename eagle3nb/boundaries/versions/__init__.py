"""One file per engine version holding everything known about it (its id rule per architecture
class, its CPU limits, the drafter variant flags it reads, the source lines each was read from):
a :class:`eagle3nb.boundaries.version_file.VersionFile` named ``VERSION`` in a module
``<engine>_<major>_<minor>_<patch>.py`` here. Every module of this folder is loaded, so adding a
version by hand is adding its file; a version with no file is measured on the spot
(:mod:`eagle3nb.boundaries.measured`).
"""

from __future__ import annotations

import importlib
import pkgutil

from eagle3nb.boundaries.version_file import VersionFile

__all__ = ["VERSIONS"]


def _load() -> dict[tuple[str, str], VersionFile]:
    out: dict[tuple[str, str], VersionFile] = {}
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if m.name.startswith("_"):
            continue
        vf = getattr(importlib.import_module(f"{__name__}.{m.name}"), "VERSION", None)
        if not isinstance(vf, VersionFile):
            raise TypeError(f"{__name__}.{m.name} defines no VERSION = VersionFile(...)")
        expected = f"{vf.engine}_{vf.version.replace('.', '_')}"
        if m.name != expected or (vf.engine, vf.version) in out:
            raise ValueError(
                f"{__name__}.{m.name} holds {vf.engine} {vf.version}: name it {expected}"
            )
        out[(vf.engine, vf.version)] = vf
    return out


# (engine, version) -> what is known about it, read from source
VERSIONS: dict[tuple[str, str], VersionFile] = _load()
