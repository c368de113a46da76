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

from eagle3nb.dataset.layout import dequantize_aux
from eagle3nb.manifest import read_json, sha256_file
from eagle3nb.padding import pad_right


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
        raise ValueError(
            f"{path}/manifest.json is not an eagle3nb dataset manifest (kind={man.get('kind')!r}, expected {DATASET_KIND!r}); point at the dataset folder 02b wrote (outputs/<run_name>/dataset)"
        )
    if not man.get("complete"):
        raise ValueError(
            f"dataset {path} is incomplete (manifest.json complete={man.get('complete')!r}: extraction interrupted); rerun 02b with the same params to finish it"
        )
    for s in man["shards"]:
        f = path / s["file"]
        if not f.is_file():
            raise ValueError(
                f"shard {f} is listed in {path}/manifest.json but missing; rerun 02b with the same params to redo it"
            )
        if verify and sha256_file(f) != s["sha256"]:
            raise ValueError(
                f"shard {f} is corrupt: its sha256 differs from the manifest; rerun 02b after deleting it"
            )
    return man


def fingerprint(manifest: dict) -> str:
    """sha256 over a dataset's recorded shard hashes: changes whenever any stored byte changes."""
    import hashlib

    return hashlib.sha256("".join(s["sha256"] for s in manifest["shards"]).encode()).hexdigest()


_KEYS = ("input_ids", "loss_mask", "aux", "final")


class AuxDataset:
    """The samples of a dataset folder, held in memory or read on demand from memory-mapped shards.

    ``ds[i]`` -> dict ``input_ids [T] int64``, ``loss_mask [T] uint8`` (1 = loss-bearing),
    ``aux [T, n_aux*H]``, ``final [T, H]`` and ``sample_id`` (int, index into the generation
    JSONL). ``aux`` and ``final`` keep the stored dtype (float32 / bfloat16 / float16), except int8
    aux storage (:mod:`eagle3nb.dataset.layout`), which is dequantised to float32. Both modes give
    the same tensors, bit for bit (``tests/training/test_batches.py``).

    - in memory (``mmap=False``, the default): every shard is loaded once here; ``ds[i]`` returns
      views into the loaded shards. For notebooks and small datasets.
    - memory-mapped (``mmap=True``): only the per-shard ``offsets`` / ``sample_ids`` are read
      here; ``ds[i]`` reads that sample's rows through ``safetensors.safe_open`` (the file is
      memory-mapped, a read copies only its own rows), so memory does not grow with the dataset.
      Training uses this. The open handles are per process: a pickled copy (a DataLoader
      worker) reopens the shards on first read.

    Attributes:
        path: the dataset folder. manifest: its ``manifest.json`` (checked). mmap: the mode.
        files: shard paths in manifest order. lengths: ``lengths[i]`` = T of sample i.

    Args:
        path: the dataset folder (``outputs/<run>/dataset``).
        verify: check every shard's sha256 against the manifest first (reads each file once).
        mmap: read samples on demand from memory-mapped shards instead of loading them.

    Raises:
        FileNotFoundError / ValueError: as :func:`open_manifest` (no manifest, not a dataset,
            incomplete, a shard missing or corrupt: the file is named).
    """

    def __init__(self, path: str | os.PathLike, verify: bool = True, mmap: bool = False):
        self.path = Path(path)
        self.manifest = open_manifest(self.path, verify)
        self.mmap = bool(mmap)
        self.files = [str(self.path / s["file"]) for s in self.manifest["shards"]]
        self._int8 = self.manifest.get("aux_storage") == "int8"
        self._open: dict[int, object] = {}  # mmap: shard -> safe_open handle, opened on first read
        self._shards: list[dict[str, torch.Tensor]] = []  # in memory: shard -> its tensors
        self._index: list[tuple[int, int, int, int]] = []  # (shard, row start, row end, sample_id)
        for si, f in enumerate(self.files):
            if self.mmap:
                with safe_open(f, framework="pt") as h:
                    off, sid = h.get_tensor("offsets").tolist(), h.get_tensor("sample_ids").tolist()
            else:
                t = load_file(f)
                if "aux_scale" in t:  # int8 storage: dequantised once here, as on each mmap read
                    t["aux"] = dequantize_aux(t["aux"], t.pop("aux_scale"))
                self._shards.append(t)
                off, sid = t["offsets"].tolist(), t["sample_ids"].tolist()
            self._index += [(si, off[i], off[i + 1], int(sid[i])) for i in range(len(off) - 1)]
        self.lengths = [b - a for _, a, b, _ in self._index]

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
        if not self.mmap:
            t = self._shards[si]
            return {k: t[k][a:b] for k in _KEYS} | {"sample_id": sid}
        h = self._handle(si)
        x = {k: h.get_slice(k)[a:b] for k in _KEYS} | {"sample_id": sid}
        if self._int8:  # int8 storage (eagle3nb.dataset.layout): dequantised per token and slot
            x["aux"] = dequantize_aux(x["aux"], h.get_slice("aux_scale")[a:b])
        return x

    def __iter__(self) -> Iterator[dict]:
        """``ds[0], ds[1], ...`` in dataset order."""
        return (self[i] for i in range(len(self)))

    def fingerprint(self) -> str:
        """sha256 over the shards' recorded hashes: changes whenever any stored byte changes."""
        return fingerprint(self.manifest)

    def token_masks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(input_ids [T] int64, loss_mask [T] uint8)`` per sample in dataset order (for
        the draft vocab); memory-mapped, only those two tensors of each shard are read."""
        cur = None
        for si, a, b, _ in self._index:  # ordered by shard
            if si != cur:
                if self.mmap:
                    with safe_open(self.files[si], framework="pt") as h:
                        ids, mask = h.get_tensor("input_ids"), h.get_tensor("loss_mask")
                else:
                    ids, mask = self._shards[si]["input_ids"], self._shards[si]["loss_mask"]
                cur = si
            yield ids[a:b], mask[a:b]


def collate(items: Sequence[dict]) -> dict:
    """Right-pad samples (``ds[i]`` dicts) into a batch (:func:`eagle3nb.padding.pad_right`).

    Returns:
        ``input_ids, loss_mask, attn_mask [B, T]`` int64 (attn_mask 1 = token, 0 = padding),
        ``aux [B, T, n_aux*H]`` and ``final [B, T, H]`` float32 (cast for training), all zero at
        padding; T = the longest sample.
    """
    input_ids, attn_mask = pad_right([x["input_ids"] for x in items], dtype=torch.long)
    return {
        "input_ids": input_ids,
        "loss_mask": pad_right([x["loss_mask"] for x in items], dtype=torch.long)[0],
        "attn_mask": attn_mask,
        "aux": pad_right([x["aux"] for x in items], dtype=torch.float32)[0],
        "final": pad_right([x["final"] for x in items], dtype=torch.float32)[0],
    }


def states_by_boundary(ds: AuxDataset, max_tokens: int = 4096) -> dict[int, torch.Tensor]:
    """``{boundary: [n, H] float32}`` for the aux boundaries and the final boundary N, from the
    first ``n = min(max_tokens, tokens in ds)`` tokens of the dataset in order (for distribution
    plots); reads only the samples those tokens come from."""
    aux, fin, n = [], [], 0
    for x in ds:
        aux.append(x["aux"])
        fin.append(x["final"])
        n += x["aux"].shape[0]
        if n >= max_tokens:
            break
    aux = torch.cat(aux)[:max_tokens].float()  # [n, n_aux*H]
    fin = torch.cat(fin)[:max_tokens].float()  # [n, H]
    H = fin.shape[1]
    out = {b: aux[:, i * H : (i + 1) * H] for i, b in enumerate(ds.manifest["aux_boundaries"])}
    out[int(ds.manifest["final_boundary"])] = fin
    return out


def boundary_engines(manifest: dict) -> dict[int, str]:
    """``{boundary: name of the engine that produced it}`` for a dataset manifest: the aux
    boundaries come from ``engine``, boundary N from ``final_state`` (HF when SGLang captured the
    aux states, since SGLang cannot return boundary N)."""
    out = {int(b): manifest["engine"]["name"] for b in manifest["aux_boundaries"]}
    final = manifest.get("final_state", {}).get("engine", manifest["engine"]["name"])
    out[int(manifest["final_boundary"])] = final
    return out


def states_by_engine(ds: AuxDataset, max_tokens: int = 4096) -> dict[str, dict[int, torch.Tensor]]:
    """:func:`states_by_boundary` grouped by the engine that produced each boundary,
    ``{engine: {boundary: [n, H]}}`` (for views whose sources are labelled by engine)."""
    states, engines = states_by_boundary(ds, max_tokens), boundary_engines(ds.manifest)
    out: dict[str, dict[int, torch.Tensor]] = {}
    for b, x in states.items():
        out.setdefault(engines[b], {})[b] = x
    return out
