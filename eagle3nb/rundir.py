"""One run's folder ``outputs/<run_name>/``: the paths of its artefacts (the only state passed
between notebooks) and ``metrics.json`` I/O. Relative paths resolve against the repository root,
so notebooks, the command line and tests agree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3nb.repo_paths import resolve_path

if TYPE_CHECKING:  # a type only: params imports this module
    from eagle3nb.params import RunParams


class RunDir:
    """Paths of one run's artefacts under ``outputs_dir/run_name`` (the only state between notebooks)."""

    def __init__(self, p: RunParams):
        self.root = resolve_path(p.outputs_dir) / p.run_name
        self.generated = self.root / "data" / "generated.jsonl"
        self.generation_manifest = self.root / "data" / "generation_manifest.json"
        self.dataset = self.root / "dataset"
        self.dataset_vllm = self.root / "dataset_vllm"  # 02a: captured by vLLM itself
        self.train = self.root / "train"
        self.online_cache = self.root / "online_cache"  # 03 online, online_cache_gib > 0 only
        self.drafter = self.root / "drafter"
        self.figures = self.root / "figures"
        self.metrics = self.root / "metrics.json"
        self.notebooks = self.root / "notebooks"

    def make(self) -> "RunDir":
        """Create the run folder and its data/figures subfolders; returns self."""
        for d in (self.root, self.generated.parent, self.figures):
            d.mkdir(parents=True, exist_ok=True)
        return self


def read_metrics(path: str | os.PathLike) -> dict:
    """metrics.json as a dict ({} when the run has none yet)."""
    from eagle3nb.manifest import read_json

    path = Path(path)
    return read_json(path, "metrics") if path.exists() else {}


def update_metrics(path: str | os.PathLike, section: str, values: dict) -> dict:
    """Merge ``values`` into ``metrics.json[section]`` (atomic rewrite). Returns the whole file."""
    from eagle3nb.manifest import atomic_write_json

    m = read_metrics(path)
    m.setdefault(section, {}).update(values)
    atomic_write_json(path, m)
    return m
