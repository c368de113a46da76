"""A model folder derived from a local one (the MoE copy, the MLP-padded copy), written once and
atomically: built in a temp folder beside ``dst`` and renamed into place, so a reader never sees a
half-written copy and two writers racing keep the first (the other's copy is removed)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from eagle3nb.manifest import publish_permissions, sha256_file

__all__ = ["COPIED", "publish_derived_copy"]

# the source folder's files a derived copy carries unchanged (those present)
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "generation_config.json", "tokenizer.model", "LICENSE")  # fmt: skip


def publish_derived_copy(
    src: Path, dst: Path, weights: dict[str, torch.Tensor], cfg: dict, info_file: str, info: dict
) -> Path:
    """Write ``weights`` (``model.safetensors``), ``cfg`` (``config.json``), the source's
    :data:`COPIED` files and ``info_file`` (``info`` plus the source folder and the sha256 of its
    weights) to ``dst``, atomically. Returns ``dst``.

    Raises:
        OSError: the rename failed and no other writer's complete copy is at ``dst``.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=dst.name + ".tmp"))
    try:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        for name in COPIED:
            if (src / name).is_file():
                shutil.copyfile(src / name, tmp / name)
        head = {"source": str(src), "source_weights_sha256": sha256_file(src / "model.safetensors")}
        (tmp / info_file).write_text(json.dumps({**head, **info}, indent=2) + "\n")
        for f in tmp.iterdir():
            publish_permissions(f)
        publish_permissions(tmp, directory=True)
        try:
            os.rename(tmp, dst)  # fails if another writer got there first: theirs is kept
        except OSError:
            if not (dst / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst
