"""Streaming offline loader: memory-mapped shards, a deterministic global batch plan, rank slices.

Three parts, each usable alone:

- :class:`eagle3nb.dataset.read.AuxDataset` with ``mmap=True`` opens the dataset's safetensors
  shards with ``safetensors.safe_open`` (the file is memory-mapped; a sample read copies only its
  own rows), so memory does not grow with the dataset.
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
:mod:`eagle3nb.training.loop` (the online path feeds the same loop through its own source).

Bucketing mirrors fairseq's / Hugging Face's "length-grouped" samplers (sort within mega-batches).
"""

from __future__ import annotations

from typing import Iterator, Optional, Protocol

import torch

from eagle3nb.dataset.read import collate


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919 + 17) % (2**63)


class BatchPlan:
    """Which samples form each global batch, a pure function of ``(seed, epoch)``.

    Args:
        lengths: tokens per sample (``AuxDataset.lengths``).
        global_batch: samples per optimizer step, summed over all ranks.
        seed: shuffling seed.
        bucket: group similar lengths into a batch (cuts padding); False = plain shuffle.
        bucket_window: global batches per sorting window (larger = less padding, less randomness).

    Raises:
        ValueError: no samples, ``global_batch`` < 1 or ``bucket_window`` < 1.
    """

    def __init__(
        self,
        lengths: list[int],
        global_batch: int,
        seed: int = 0,
        bucket: bool = True,
        bucket_window: int = 16,
    ):
        if not lengths:
            raise ValueError(
                "lengths is empty: the dataset has no samples; check 02b's skipped counts"
            )
        if global_batch < 1 or bucket_window < 1:
            raise ValueError(
                f"global_batch={global_batch}, bucket_window={bucket_window}: both must be >= 1"
            )
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
                win = sorted(
                    perm[s : s + w], key=lambda i: -self.lengths[i]
                )  # stable: ties keep the shuffle
                batches += [win[i : i + G] for i in range(0, len(win), G)]
            order = torch.randperm(
                len(batches), generator=g
            ).tolist()  # long and short batches mixed
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
    return {
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_fraction": 1 - real / padded if padded else 0.0,
    }


def plan_padding(plan: BatchPlan, world: int = 1) -> dict:
    """:func:`padding_stats` of one epoch of ``plan`` against a plain shuffle of the same lengths,
    global batch and seed (no bucketing): ``{"this_plan", "plain_shuffle"}``, what every batch
    source's ``padding(world)`` reports to the training report."""
    plain = BatchPlan(plan.lengths, plan.global_batch, plan.seed, bucket=False)
    return {"this_plan": padding_stats(plan, world), "plain_shuffle": padding_stats(plain, world)}


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
    """:func:`eagle3nb.dataset.read.collate` plus ``sample_index [B] int64`` (-1: stand-in row)."""
    out = collate(items)
    out["sample_index"] = torch.tensor(
        [x["index"] for x in items], dtype=torch.long
    )  # -1: stand-in
    return out


def add_aux_noise(b: dict, step: int, seed: int, rel_std: float) -> torch.Tensor:
    """Feature noise as EAGLE's training adds to hidden states: ``b["aux"]`` plus, per sample,
    Gaussian noise of std = ``rel_std`` x the sample's own aux std, from a CPU generator seeded by
    (seed, step, sample): the same noise for a sample whichever rank or device trains it."""
    aux, attn_mask, sample_index = b["aux"], b["attn_mask"], b["sample_index"]
    out = aux.clone()
    for r, idx in enumerate(sample_index.tolist()):
        if idx < 0:
            continue
        L = int(attn_mask[r].sum())
        x = aux[r, :L]
        g = torch.Generator().manual_seed((seed + 1) * 1_000_003 + step * 100_003 + idx)
        out[r, :L] = x + rel_std * x.std() * torch.randn(x.shape, generator=g)
    return out


class OfflineSource:
    """Batch source over stored shards (see :class:`eagle3nb.training.batches.BatchSource`).

    Args:
        store: an :class:`eagle3nb.dataset.read.AuxDataset` (memory-mapped or in memory).
        global_batch, seed, bucket, bucket_window: see :class:`BatchPlan`.
        workers: DataLoader worker processes (0 = load in the training process).
    """

    def __init__(
        self,
        store,
        global_batch: int,
        seed: int = 0,
        bucket: bool = True,
        bucket_window: int = 16,
        workers: int = 0,
    ):
        self.store = store
        self.plan = BatchPlan(store.lengths, global_batch, seed, bucket, bucket_window)
        self.workers = int(workers)
        self.n_aux = len(store.manifest["aux_boundaries"])

    def fingerprint(self) -> str:
        """Identity of the data (changes when any stored byte changes)."""
        return self.store.fingerprint()

    def token_masks(self):
        """``(input_ids, loss_mask)`` per sample, for building the draft vocab."""
        return self.store.token_masks()

    def padding(self, world: int = 1) -> dict:
        """:func:`plan_padding` of this source's plan."""
        return plan_padding(self.plan, world)

    def batches(
        self, start: int, stop: int, rank: int = 0, world: int = 1, pin_memory: bool = False
    ) -> Iterator[dict]:
        """This rank's batch of each step ``start..stop-1``: ``input_ids, loss_mask, attn_mask
        [b, T]`` int64, ``aux [b, T, n_aux*H]``, ``final [b, T, H]`` float32, ``sample_index [b]``
        (dataset index; -1 for a loss-free stand-in row)."""
        dl = torch.utils.data.DataLoader(
            _Fetch(self.store),
            batch_sampler=_RankBatches(self.plan, rank, world, start, stop),
            collate_fn=_collate,
            num_workers=self.workers,
            prefetch_factor=4 if self.workers else None,
            pin_memory=pin_memory,
        )
        yield from dl


class BatchSource(Protocol):
    """What the training loop needs from its data (offline shards or an online target).

    ``batches(start, stop, rank, world, pin_memory)`` yields, for each global step in
    ``start..stop-1``, this rank's slice of the global batch as a dict of CPU tensors:
    ``input_ids, loss_mask, attn_mask [b, T] int64`` (right padding), ``aux [b, T, n_aux*Ht]`` and
    ``final [b, T, Ht]`` float32, ``sample_index [b] int64`` (a stable sample key, -1 for a
    loss-free stand-in row). It must be a pure function of the step (resume restarts at ``start``)
    and the slices of all ranks must partition the global batch (ranks without samples yield a
    stand-in row with an all-zero loss_mask, so collectives line up).
    """

    n_aux: int

    def fingerprint(self) -> str: ...

    def token_masks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def batches(
        self, start: int, stop: int, rank: int = 0, world: int = 1, pin_memory: bool = False
    ) -> Iterator[dict]: ...


def loader_workers_for(cfg, device) -> int:
    """``cfg.loader_workers``, with -1 (auto) resolved: 4 worker processes when training on CUDA
    (bench/online_gpu.py, one H200 at 8B drafter shapes: 0 workers left the GPU waiting for the
    loader 25% of each step, 4 workers 0.1%, 23% more tokens/s), else 0 (a CPU step is slow
    next to loading, and workers would take the cores the step uses)."""
    if cfg.loader_workers >= 0:
        return cfg.loader_workers
    return 4 if torch.device(device).type == "cuda" else 0


def make_source(ds, cfg, device="cpu"):
    """The batch source for ``cfg``: an offline source over ``ds`` (an ``AuxDataset``, either
    mode) loading with :func:`loader_workers_for` workers for ``device``, or ``ds`` itself when it
    computes its batches (an online source, given the same batch plan as the offline loader)."""
    if hasattr(ds, "configure"):
        return ds.configure(cfg.batch_size, cfg.seed, cfg.bucket_by_length, cfg.bucket_window)

    workers = loader_workers_for(cfg, device)
    return OfflineSource(
        ds, cfg.batch_size, cfg.seed, cfg.bucket_by_length, cfg.bucket_window, workers
    )
