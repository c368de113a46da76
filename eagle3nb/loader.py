"""Streaming offline loader: memory-mapped shards, a deterministic global batch plan, rank slices.

Three parts, each usable alone:

- :class:`ShardStore` opens the dataset's safetensors shards with ``safetensors.safe_open`` (the
  file is memory-mapped; a sample read copies only its own rows), so memory does not grow with the
  dataset.
- :class:`BatchPlan` decides, from ``(seed, epoch)`` alone, which samples form global batch ``s``:
  a seeded permutation per epoch, bucketed by length (sorted within windows of ``bucket_window``
  global batches, then the batches shuffled) to cut padding. Every sample appears exactly once per
  epoch (the last global batch of an epoch may be short). Global step ``s`` maps to (epoch, batch)
  with no state, so the data position of a resumed run is its step.
- :meth:`BatchPlan.rank_slice` gives rank r of w the samples ``sorted_batch[r::w]`` (disjoint,
  their union is the global batch, lengths balanced). A rank left with no sample (a short last
  batch with fewer samples than ranks) gets a loss-free copy of one, so collectives still line up.

:class:`OfflineSource` ties them to a ``torch.utils.data.DataLoader`` (optional worker processes
prefetch and collate while the accelerator trains). It implements the batch-source interface of
:mod:`eagle3nb.train` (the online path feeds the same loop through its own source).

Bucketing mirrors fairseq's / Hugging Face's "length-grouped" samplers (sort within mega-batches).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Optional

import torch
from safetensors import safe_open

from .dataset import collate, fingerprint, open_manifest
from .storage import dequantize_aux

__all__ = ["ShardStore", "BatchPlan", "OfflineSource", "padding_stats"]

_KEYS = ("input_ids", "loss_mask", "aux", "final")


class ShardStore:
    """Samples of a dataset folder, read on demand from memory-mapped shards.

    ``store[i]`` -> dict ``input_ids [T] int64, loss_mask [T] uint8, aux [T, n_aux*H], final [T, H]``
    (stored dtype) and ``sample_id`` (index into the generation JSONL). ``lengths[i]`` = T.

    Args:
        path: the dataset folder (``outputs/<run>/dataset``).
        verify: check every shard's sha256 against the manifest first (reads each file once).

    Raises:
        FileNotFoundError / ValueError: as :func:`eagle3nb.dataset.open_manifest` (missing,
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
        if self.int8:  # int8 storage (eagle3nb.storage): dequantised per token and slot on read
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


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919 + 17) % (2**63)


class BatchPlan:
    """Which samples form each global batch, a pure function of ``(seed, epoch)``.

    Args:
        lengths: tokens per sample (``ShardStore.lengths``).
        global_batch: samples per optimizer step, summed over all ranks.
        seed: shuffling seed.
        bucket: group similar lengths into a batch (cuts padding); False = plain shuffle.
        bucket_window: global batches per sorting window (larger = less padding, less randomness).

    Raises:
        ValueError: no samples, ``global_batch`` < 1 or ``bucket_window`` < 1.
    """

    def __init__(self, lengths: list[int], global_batch: int, seed: int = 0, bucket: bool = True, bucket_window: int = 16):
        if not lengths:
            raise ValueError("lengths is empty: the dataset has no samples; check 02b's skipped counts")
        if global_batch < 1 or bucket_window < 1:
            raise ValueError(f"global_batch={global_batch}, bucket_window={bucket_window}: both must be >= 1")
        self.lengths, self.global_batch, self.seed = list(lengths), int(global_batch), int(seed)
        self.bucket, self.bucket_window = bucket, int(bucket_window)
        self.steps_per_epoch = -(-len(self.lengths) // self.global_batch)
        self._cache: dict[int, list[list[int]]] = {}

    def epoch(self, epoch: int) -> list[list[int]]:
        """The global batches of ``epoch`` in training order (lists of sample indices)."""
        if epoch in self._cache:
            return self._cache[epoch]
        g = torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))
        perm = torch.randperm(len(self.lengths), generator=g).tolist()
        G = self.global_batch
        if not self.bucket:
            batches = [perm[i : i + G] for i in range(0, len(perm), G)]
        else:
            w = G * self.bucket_window
            batches = []
            for s in range(0, len(perm), w):
                win = sorted(perm[s : s + w], key=lambda i: -self.lengths[i])  # stable: ties keep the shuffle
                batches += [win[i : i + G] for i in range(0, len(win), G)]
            order = torch.randperm(len(batches), generator=g).tolist()  # long and short batches mixed
            batches = [batches[i] for i in order]
        self._cache = {epoch: batches}  # one epoch at a time is all a run needs
        return batches

    def position(self, step: int) -> tuple[int, int]:
        """``(epoch, batch index within the epoch)`` of global step ``step`` (0-based)."""
        return divmod(int(step), self.steps_per_epoch)

    def global_batch_at(self, step: int) -> list[int]:
        """Sample indices of global step ``step``."""
        e, i = self.position(step)
        return self.epoch(e)[i]

    def rank_slice(self, batch: list[int], rank: int, world: int) -> list[int]:
        """Rank ``rank``'s samples of ``batch``: longest first, every ``world``-th (disjoint; equal
        token loads up to one sample)."""
        srt = sorted(batch, key=lambda i: (-self.lengths[i], i))
        return srt[rank::world]


def padding_stats(plan: BatchPlan, world: int = 1, steps: Optional[int] = None) -> dict:
    """Padded vs real tokens of the per-rank batches of the first ``steps`` steps (default: one
    epoch). Returns ``{"real_tokens", "padded_tokens", "padding_fraction"}`` where padded_tokens =
    sum over rank batches of (samples x longest sample)."""
    steps = plan.steps_per_epoch if steps is None else steps
    real = padded = 0
    for s in range(steps):
        b = plan.global_batch_at(s)
        for r in range(world):
            part = plan.rank_slice(b, r, world)
            if part:
                L = [plan.lengths[i] for i in part]
                real += sum(L)
                padded += len(L) * max(L)
    return {"real_tokens": real, "padded_tokens": padded, "padding_fraction": 1 - real / padded if padded else 0.0}


class _RankBatches:
    """Batch sampler for a DataLoader: this rank's ``(index, keep_loss)`` lists for steps
    ``start..stop-1``."""

    def __init__(self, plan: BatchPlan, rank: int, world: int, start: int, stop: int):
        self.plan, self.rank, self.world, self.start, self.stop = plan, rank, world, start, stop

    def __len__(self):
        return max(0, self.stop - self.start)

    def __iter__(self):
        for s in range(self.start, self.stop):
            b = self.plan.global_batch_at(s)
            part = self.plan.rank_slice(b, self.rank, self.world)
            yield [(i, True) for i in part] if part else [(b[0], False)]


class _Fetch(torch.utils.data.Dataset):
    def __init__(self, store):
        self.store = store

    def __len__(self):
        return len(self.store)

    def __getitem__(self, key):
        i, keep = key
        x = dict(self.store[i], index=i)
        if not keep:  # stand-in row of a rank without samples: contributes no loss, no gradient
            x["loss_mask"] = torch.zeros_like(x["loss_mask"])
            x["index"] = -1
        return x


def _collate(items: list[dict]) -> dict:
    out = collate(items)
    out["sample_index"] = torch.tensor([x["index"] for x in items], dtype=torch.long)  # -1: stand-in
    return out


class OfflineSource:
    """Batch source over stored shards (see :class:`eagle3nb.train.BatchSource`).

    Args:
        store: a :class:`ShardStore` (or an in-memory ``AuxDataset``: same interface).
        global_batch, seed, bucket, bucket_window: see :class:`BatchPlan`.
        workers: DataLoader worker processes (0 = load in the training process).
    """

    def __init__(self, store, global_batch: int, seed: int = 0, bucket: bool = True, bucket_window: int = 16, workers: int = 0):
        self.store = store
        lengths = getattr(store, "lengths", None) or [int(store[i]["input_ids"].numel()) for i in range(len(store))]
        self.plan = BatchPlan(lengths, global_batch, seed, bucket, bucket_window)
        self.workers = int(workers)
        self.n_aux = len(store.manifest["aux_boundaries"])

    def fingerprint(self) -> str:
        """Identity of the data (changes when any stored byte changes)."""
        return self.store.fingerprint()

    def token_masks(self):
        """``(input_ids, loss_mask)`` per sample, for building the draft vocab."""
        return self.store.token_masks()

    def padding(self, world: int = 1) -> dict:
        """:func:`padding_stats` of one epoch, this plan against a plain shuffle of the same batch."""
        plain = BatchPlan(self.plan.lengths, self.plan.global_batch, self.plan.seed, bucket=False)
        return {"this_plan": padding_stats(self.plan, world), "plain_shuffle": padding_stats(plain, world)}

    def batches(self, start: int, stop: int, rank: int = 0, world: int = 1, pin_memory: bool = False) -> Iterator[dict]:
        """This rank's batch of each step ``start..stop-1``: ``input_ids, loss_mask, attn_mask
        [b, T]`` int64, ``aux [b, T, n_aux*H]``, ``final [b, T, H]`` float32, ``sample_index [b]``
        (dataset index; -1 for a loss-free stand-in row)."""
        dl = torch.utils.data.DataLoader(
            _Fetch(self.store), batch_sampler=_RankBatches(self.plan, rank, world, start, stop), collate_fn=_collate,
            num_workers=self.workers, prefetch_factor=4 if self.workers else None, pin_memory=pin_memory,
        )
        yield from dl
