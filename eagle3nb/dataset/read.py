"""The offline aux hidden-state dataset: safetensors shards plus a manifest.

Shard ``shard-00000.safetensors`` packs its samples back to back (S samples, N tokens in all):

    input_ids  [N] int64          loss_mask [N] uint8 (1 = loss-bearing)
    aux        [N, n_aux*H]       aux states at the manifest's boundaries, concatenated in order
    final      [N, H]             boundary N (last layer output before the final norm)
    offsets    [S+1] int64        sample i = rows offsets[i]:offsets[i+1]
    sample_ids [S] int64          index into the generation JSONL

``manifest.json`` records provenance and per-shard sha256. Shards are written to a temp file and
renamed; the manifest is rewritten after every shard, so an interrupted extraction loses nothing
finished and a rerun skips finished shards.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eagle3nb.manifest import read_json, sha256_file
from eagle3nb.dataset.layout import dequantize_aux


DATASET_KIND = "eagle3nb-aux-dataset"


FORMAT_VERSION = 1


def open_manifest(path: Path, verify: bool = True) -> dict:
    """The manifest of a complete dataset folder, after checking that every listed shard exists
    (and, with ``verify``, that its bytes match the recorded sha256).

    Raises:
        FileNotFoundError: no manifest. ValueError: not a dataset manifest, incomplete dataset, a
            listed shard missing, or a shard whose sha256 differs (the file is named).
    """
    man = read_json(path / "manifest.json", "dataset manifest")
    if man.get("kind") != DATASET_KIND:
        raise ValueError(f"{path}/manifest.json is not an eagle3nb dataset manifest (kind={man.get('kind')!r}, expected {DATASET_KIND!r}); point at the dataset folder 02b wrote (outputs/<run_name>/dataset)")
    if not man.get("complete"):
        raise ValueError(f"dataset {path} is incomplete (manifest.json complete={man.get('complete')!r}: extraction interrupted); rerun 02b with the same params to finish it")
    for s in man["shards"]:
        f = path / s["file"]
        if not f.is_file():
            raise ValueError(f"shard {f} is listed in {path}/manifest.json but missing; rerun 02b with the same params to redo it")
        if verify and sha256_file(f) != s["sha256"]:
            raise ValueError(f"shard {f} is corrupt: its sha256 differs from the manifest; rerun 02b after deleting it")
    return man


def fingerprint(manifest: dict) -> str:
    """sha256 over a dataset's recorded shard hashes: changes whenever any stored byte changes."""
    import hashlib

    return hashlib.sha256("".join(s["sha256"] for s in manifest["shards"]).encode()).hexdigest()


class AuxDataset:
    """Samples of a dataset folder, loaded into memory after checking every shard's sha256.

    ``ds[i]`` -> dict ``input_ids [T] int64, loss_mask [T] uint8, aux [T, n_aux*H], final [T, H]``.

    Raises:
        FileNotFoundError: no manifest. ValueError: incomplete dataset, or a shard whose bytes do
            not match its recorded sha256 (the file is named).
    """

    def __init__(self, path: str | os.PathLike, verify: bool = True):
        self.path = Path(path)
        self.manifest = open_manifest(self.path, verify)
        self.items: list[dict] = []
        for s in self.manifest["shards"]:
            t = load_file(str(self.path / s["file"]))
            if "aux_scale" in t:  # int8 storage: dequantised here, so training sees float states
                t["aux"] = dequantize_aux(t["aux"], t.pop("aux_scale"))
            off = t["offsets"].tolist()
            for i in range(len(off) - 1):
                a, b = off[i], off[i + 1]
                self.items.append({k: t[k][a:b] for k in ("input_ids", "loss_mask", "aux", "final")} | {"sample_id": int(t["sample_ids"][i])})

    def fingerprint(self) -> str:
        """sha256 over the shards' recorded hashes: changes whenever any stored byte changes."""
        return fingerprint(self.manifest)

    def token_masks(self):
        """Yield ``(input_ids [T] int64, loss_mask [T] uint8)`` per sample (for the draft vocab)."""
        return ((x["input_ids"], x["loss_mask"]) for x in self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def collate(items: Sequence[dict]) -> dict:
    """Right-pad samples into a batch: ``input_ids, loss_mask, attn_mask [B, T]``, ``aux [B, T, A]``,
    ``final [B, T, H]`` (aux/final cast to float32 for training)."""
    B, T = len(items), max(x["input_ids"].numel() for x in items)
    A, H = items[0]["aux"].shape[1], items[0]["final"].shape[1]
    out = {
        "input_ids": torch.zeros(B, T, dtype=torch.long),
        "loss_mask": torch.zeros(B, T, dtype=torch.long),
        "attn_mask": torch.zeros(B, T, dtype=torch.long),
        "aux": torch.zeros(B, T, A),
        "final": torch.zeros(B, T, H),
    }
    for r, x in enumerate(items):
        L = x["input_ids"].numel()
        out["input_ids"][r, :L] = x["input_ids"]
        out["loss_mask"][r, :L] = x["loss_mask"].long()
        out["attn_mask"][r, :L] = 1
        out["aux"][r, :L] = x["aux"].float()
        out["final"][r, :L] = x["final"].float()
    return out


def states_by_boundary(ds: AuxDataset, max_tokens: int = 4096) -> dict[int, torch.Tensor]:
    """``{boundary: [n, H] float32}`` for the aux boundaries and the final boundary N, from the first
    ``max_tokens`` tokens of the dataset (for distribution plots)."""
    bnds = list(ds.manifest["aux_boundaries"])
    aux = torch.cat([x["aux"] for x in ds.items])[:max_tokens].float()  # [n, n_aux*H]
    fin = torch.cat([x["final"] for x in ds.items])[:max_tokens].float()  # [n, H]
    H = fin.shape[1]
    out = {b: aux[:, i * H : (i + 1) * H] for i, b in enumerate(bnds)}
    out[int(ds.manifest["final_boundary"])] = fin
    return out


_KEYS = ("input_ids", "loss_mask", "aux", "final")


class ShardStore:
    """Samples of a dataset folder, read on demand from memory-mapped shards.

    ``store[i]`` -> dict ``input_ids [T] int64, loss_mask [T] uint8, aux [T, n_aux*H], final [T, H]``
    (stored dtype) and ``sample_id`` (index into the generation JSONL). ``lengths[i]`` = T.

    Args:
        path: the dataset folder (``outputs/<run>/dataset``).
        verify: check every shard's sha256 against the manifest first (reads each file once).

    Raises:
        FileNotFoundError / ValueError: as :func:`eagle3nb.dataset.read.open_manifest` (missing,
            incomplete, corrupt shard named).
    """

    def __init__(self, path: str | os.PathLike, verify: bool = True):
        self.path = Path(path)
        self.manifest = open_manifest(self.path, verify)
        self.files = [str(self.path / s["file"]) for s in self.manifest["shards"]]
        self._index: list[tuple[int, int, int, int]] = []  # (shard, row start, row end, sample_id)
        for si, f in enumerate(self.files):
            with safe_open(f, framework="pt") as h:
                off = h.get_tensor("offsets").tolist()
                sid = h.get_tensor("sample_ids").tolist()
            self._index += [(si, off[i], off[i + 1], int(sid[i])) for i in range(len(off) - 1)]
        self.lengths = [b - a for _, a, b, _ in self._index]
        self.int8 = self.manifest.get("aux_storage") == "int8"
        self._open: dict[int, object] = {}

    def __getstate__(self):  # safe_open handles do not pickle; each DataLoader worker reopens
        return dict(self.__dict__, _open={})

    def _handle(self, si: int):
        h = self._open.get(si)
        if h is None:
            h = self._open[si] = safe_open(self.files[si], framework="pt")
        return h

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> dict:
        si, a, b, sid = self._index[i]
        h = self._handle(si)
        x = {k: h.get_slice(k)[a:b] for k in _KEYS} | {"sample_id": sid}
        if self.int8:  # int8 storage (eagle3nb.dataset.layout): dequantised per token and slot on read
            x["aux"] = dequantize_aux(x["aux"], h.get_slice("aux_scale")[a:b])
        return x

    def fingerprint(self) -> str:
        """sha256 over the shards' recorded hashes (same value as ``AuxDataset.fingerprint``)."""
        return fingerprint(self.manifest)

    def token_masks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(input_ids [T] int64, loss_mask [T] uint8)`` per sample, reading only those two
        tensors of each shard (for the draft vocab)."""
        cur = None
        for si, a, b, _ in self._index:  # ordered by shard
            if si != cur:
                with safe_open(self.files[si], framework="pt") as h:
                    ids, mask = h.get_tensor("input_ids"), h.get_tensor("loss_mask")
                cur = si
            yield ids[a:b], mask[a:b]
