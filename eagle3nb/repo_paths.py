"""The repository root, and paths resolved against it (a leaf: standard library only, so that
params, rundir, manifest, the target and the engine client import it without an import circle)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def resolve_path(p: str | os.PathLike) -> Path:
    """Relative paths are relative to the repository root (so notebooks and CLI agree)."""
    p = Path(p).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p
