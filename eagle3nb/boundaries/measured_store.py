"""Measured layer-id rules kept per user (:mod:`eagle3nb.boundaries.measured`), as JSON records
(:meth:`eagle3nb.boundaries.rules.EngineRule.as_record`), one file per (engine, version, class).

Location: ``$EAGLE3NB_MEASURED_RULES`` when set (``off``, ``0`` or empty: none kept, none read),
else ``$EAGLE3NB_CACHE/measured_rules`` (default ``~/.cache/eagle3nb/measured_rules``), beside the
twin proofs (:mod:`eagle3nb.engines.twin_cache`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Optional

__all__ = ["MEASURED", "measured_dir", "store_record", "load_record"]

MEASURED = "measured"  # a measured EngineRule's source starts with it
_OFF = ("", "0", "off", "false", "no")


def measured_dir() -> Optional[Path]:
    """The folder of measured rules, or None when ``$EAGLE3NB_MEASURED_RULES`` turns it off."""
    env = os.environ.get("EAGLE3NB_MEASURED_RULES")
    if env is not None:
        return None if env.strip().lower() in _OFF else Path(env).expanduser()
    root = Path(os.environ.get("EAGLE3NB_CACHE", "~/.cache/eagle3nb")).expanduser()
    return root / "measured_rules"


def _file(folder: Path, engine: str, version: str, arch: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{engine}-{version}-{arch}")
    return Path(folder) / f"{safe}.json"


def store_record(record: dict, folder: Optional[Path] = None) -> Optional[Path]:
    """Write a measured rule's ``record`` (keys engine, version, arch, source "measured ...")
    under ``folder`` (default :func:`measured_dir`), temp file then rename; the file, or None
    where none is kept.

    Raises:
        ValueError: not a measured rule's record. OSError: the folder cannot be written.
    """
    if not str(record.get("source", "")).startswith(MEASURED):
        raise ValueError(f"source={record.get('source')!r}: only measured rules are kept")
    folder = measured_dir() if folder is None else Path(folder)
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = _file(folder, record["engine"], record["version"], record["arch"])
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_record(engine: str, version: str, arch: str, folder: Optional[Path] = None):
    """The kept record of this key, or None (none kept, unreadable, or another key inside)."""
    folder = measured_dir() if folder is None else Path(folder)
    if folder is None:
        return None
    try:
        d = json.loads(_file(folder, engine, version, arch).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or (d.get("engine"), d.get("version"), d.get("arch")) != (
        engine,
        version,
        arch,
    ):
        return None
    if not str(d.get("source", "")).startswith(MEASURED):
        return None
    return d
