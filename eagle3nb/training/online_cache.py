"""Opt-in on-disk cache of the first epoch of online training from the serving engine
(``online_cache_gib`` > 0), as speculators' hybrid mode keeps what it captured once: the states the
engine captured are written once, within a bound in bytes, and later epochs read them back instead
of asking the engine again. Off by default: then nothing but 01's token ids is on disk.

Format: the offline dataset's (:mod:`eagle3nb.dataset.read`), so
:class:`eagle3nb.dataset.read.AuxDataset` opens the folder: safetensors shards built by the offline
writer's own shard builder and written atomically (temp file, fsync, rename), and a
``manifest.json`` rewritten atomically after each shard, carrying the online source's dataset
manifest (engine, version, how its rule is known, convention, ids, boundaries, dtype, template
hash, generation sha256) plus ``online_cache``: the bound, whether it was reached, and per stored
sample the engine call it came from (``captured_with``, the sample ids of that call in order), so
the re-check can ask the engine the very same call again (bit-equal on CPU float32; a call of
other neighbours may differ by a few ulp).

The bound: a sample is stored only while the shard files stay within ``capacity_bytes`` (exact:
:func:`eagle3nb.dataset.layout.shard_file_bytes` of the shard being filled, plus the shards
written). Samples are stored in the order they are first captured; the first that does not fit
closes the cache, and it and every sample not stored are recaptured in every epoch (the progress
line says how many). The shard being filled is held in memory (at most ``shard_samples``
samples) and read from there until it is written. A run killed mid-epoch keeps the shards written; the samples of the shard
being filled are captured again after resume and stored then. A folder written with other settings
(engine, ids, dtype, ...) or whose shards fail their sha256 is emptied and filled again (it is a
cache: nothing in it is lost).

Where: ``outputs/<run>/online_cache/`` (:attr:`eagle3nb.rundir.RunDir.online_cache`): the states
belong to this run's engine, ids and samples, are removed with the run folder, resume finds them,
and the bytes are seen where the run's other outputs are; a shared per-user cache would need a key
over all of that and an eviction policy (docs/training.md#online-from-the-serving-engine).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Sequence

from safetensors import safe_open

from eagle3nb.dataset.layout import METADATA, shard_file_bytes, shard_layout
from eagle3nb.dataset.read import DATASET_KIND, FORMAT_VERSION
from eagle3nb.dataset.shard_file import all_finite
from eagle3nb.dataset.write import _build_shard, _save_atomic
from eagle3nb.manifest import atomic_write_json, read_json, sha256_file
from eagle3nb.target.capture import Captured

__all__ = ["FirstEpochCache", "check_cache_space", "GIB"]

GIB = 1 << 30
# what must be unchanged for a cache folder to be read again (the dataset writer's resume keys,
# less the shard size and input count, which do not change what a stored sample holds)
_KEYS = tuple(
    "target engine convention layer_ids aux_boundaries final_boundary dtype template "
    "template_kwargs generation_sha256".split()
)


def check_cache_space(folder: str | os.PathLike, capacity_bytes: int) -> None:
    """Refuse a cache bound the disk cannot hold, before any engine starts.

    Raises:
        ValueError: free space on ``folder``'s file system (plus what the cache already holds) is
            below ``capacity_bytes``; names ``online_cache_gib``, the values and the fix.
    """
    folder = Path(folder)
    have = sum(f.stat().st_size for f in folder.glob("*.safetensors")) if folder.is_dir() else 0
    probe = folder if folder.is_dir() else next(p for p in folder.parents if p.is_dir())
    free = shutil.disk_usage(probe).free
    if free + have < capacity_bytes:
        raise ValueError(
            f"online_cache_gib={capacity_bytes / GIB:g}: {folder} has {(free + have) / GIB:.2f} GiB "
            "free for it; lower online_cache_gib (0 = no cache, every epoch recaptured) or free space"
        )


class FirstEpochCache:
    """Captured samples stored once within a byte bound, read back in later epochs.

    Args:
        folder: the cache folder (created).
        manifest: the online source's dataset manifest (engine block, ids, boundaries, dtype, ...).
        capacity_bytes: most bytes of shard files (> 0).
        shard_samples: samples per shard file.
        log: where one-line notices go (a folder emptied and why).

    Raises:
        ValueError: ``capacity_bytes`` < 1 or ``shard_samples`` < 1.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        manifest: dict,
        capacity_bytes: int,
        shard_samples: int = 64,
        log=print,
    ):
        if int(capacity_bytes) < 1 or int(shard_samples) < 1:
            raise ValueError(
                f"capacity_bytes={capacity_bytes}, shard_samples={shard_samples}: both must be >= 1"
            )
        self.folder, self.capacity = Path(folder), int(capacity_bytes)
        self.shard_samples, self.n_aux = int(shard_samples), len(manifest["aux_boundaries"])
        self.manifest = dict(manifest, kind=DATASET_KIND, format_version=FORMAT_VERSION)
        self.manifest.update(shard_size=self.shard_samples, aux_storage="dtype")
        self.shards: list[dict] = []
        self.index: dict[int, tuple[int, int, int]] = {}  # sample id -> (shard, row a, row b)
        self.calls: dict[int, list[int]] = {}  # sample id -> sample ids of its engine call
        self.pending: list[tuple[tuple[int, list[int], list[int]], Captured, list[int]]] = []
        self.bytes, self.full, self.hits, self.stored_now = 0, False, 0, 0
        self._handles: dict[int, object] = {}
        self._open(log)

    # ---- folder ------------------------------------------------------------------------------
    def _open(self, log) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in self.folder.glob("*.tmp"):  # a shard whose rename a kill prevented
            stale.unlink()
        mpath = self.folder / "manifest.json"
        if not mpath.exists():
            return
        old = read_json(mpath)
        why = [k for k in _KEYS if old.get(k) != self.manifest.get(k)]
        bad = [s["file"] for s in old.get("shards", []) if not self._intact(s)]
        held = sum(s["bytes"] for s in old.get("shards", []))
        if why or bad or held > self.capacity:
            reason = (
                f"settings differ ({', '.join(why)})" if why
                else f"shards fail their sha256 ({', '.join(bad[:3])})" if bad
                else f"it holds {held} bytes, over the bound {self.capacity}"
            )  # fmt: skip
            log(f"online cache {self.folder}: emptied and filled again: {reason}")
            for f in self.folder.iterdir():
                f.unlink()
            return
        for s in old["shards"]:
            self._add_shard(s)
        self.full = bool(old.get("online_cache", {}).get("full"))

    def _intact(self, s: dict) -> bool:
        f = self.folder / s["file"]
        return f.is_file() and sha256_file(f) == s["sha256"]

    def _add_shard(self, entry: dict) -> None:
        si = len(self.shards)
        self.shards.append(entry)
        self.bytes += entry["bytes"]
        with safe_open(str(self.folder / entry["file"]), framework="pt") as h:
            off, sid = h.get_tensor("offsets").tolist(), h.get_tensor("sample_ids").tolist()
        for j, s in enumerate(sid):
            self.index[int(s)] = (si, off[j], off[j + 1])
            self.calls[int(s)] = list(entry["captured_with"][j])

    def _write_manifest(self) -> None:
        man = dict(self.manifest, shards=self.shards, complete=True)
        man["n_samples"] = sum(s["n_samples"] for s in self.shards)
        man["n_tokens"] = sum(s["n_tokens"] for s in self.shards)
        man["skipped"] = {"nonfinite": [], "empty_loss_mask": []}
        man["online_cache"] = {
            "capacity_bytes": self.capacity,
            "bytes": self.bytes,
            "full": self.full,
            "is": "the first epoch's captured states, read back by later epochs; samples not "
            "stored are recaptured every epoch (eagle3nb.training.online_cache)",
        }
        atomic_write_json(self.folder / "manifest.json", man)

    # ---- reading -----------------------------------------------------------------------------
    def has(self, sample_id: int) -> bool:
        """Whether ``sample_id``'s states are stored: in a shard written, or in the shard being
        filled (held in memory until it is written)."""
        sid = int(sample_id)
        return sid in self.index or any(int(s[0]) == sid for s, _, _ in self.pending)

    def read(self, sample_id: int) -> tuple[Captured, list[int]]:
        """``(states, call)``: the stored ``aux [T, n_aux*H]`` and ``final [T, H]`` (the dtype
        they were captured in) and the sample ids of the engine call they came from."""
        self.hits += 1
        for s, cap, call in self.pending:  # the shard being filled: the very tensors captured
            if int(s[0]) == int(sample_id):
                return cap, list(call)
        si, a, b = self.index[int(sample_id)]
        h = self._handles.get(si)
        if h is None:
            h = self._handles[si] = safe_open(
                str(self.folder / self.shards[si]["file"]), framework="pt"
            )
        cap = Captured(h.get_slice("aux")[a:b], h.get_slice("final")[a:b])
        return cap, self.calls[int(sample_id)]

    # ---- writing -----------------------------------------------------------------------------
    def _shard_bytes(self, rows: Sequence) -> int:
        cap = rows[0][1]
        lens = [len(s[1]) for s, _, _ in rows]
        lay = shard_layout(lens, self.n_aux, cap.final.shape[1], cap.aux.dtype)
        return shard_file_bytes(lay, METADATA)

    def offer(self, sample: tuple[int, list[int], list[int]], cap: Captured, call: list[int]):
        """Store ``sample`` ``(sample_id, input_ids, loss_mask)`` with its capture ``cap`` (from
        the engine call of sample ids ``call``) while the bound allows; the first sample that
        does not fit closes the cache. Non-finite states are never stored (recaptured)."""
        sid = int(sample[0])
        if self.full or self.has(sid):
            return
        if not (all_finite(cap.aux) and all_finite(cap.final)):
            return
        if cap.final.dtype != cap.aux.dtype:  # one dtype per shard layout
            cap = Captured(cap.aux, cap.final.to(cap.aux.dtype))
        rows = self.pending + [(sample, cap, list(call))]
        if self.bytes + self._shard_bytes(rows) > self.capacity:
            self.full = True
            self.flush()
            return
        self.pending = rows
        if len(self.pending) >= self.shard_samples:
            self.flush()

    def flush(self) -> None:
        """Write the pending samples as one shard (atomically), then the manifest."""
        if not self.pending:
            if self.full:
                self._write_manifest()
            return
        rows, self.pending = self.pending, []
        name = f"shard-{len(self.shards):05d}.safetensors"
        caps = [c for _, c, _ in rows]
        chunk = [s for s, _, _ in rows]
        dtype = caps[0].aux.dtype
        t, entry = _build_shard(name, chunk, lambda xs: caps, self.manifest, dtype, "dtype")
        entry["sha256"] = _save_atomic(t, self.folder / name, METADATA)
        entry["bytes"] = (self.folder / name).stat().st_size
        entry["captured_with"] = [c for _, _, c in rows]
        self._add_shard(entry)
        self.stored_now += len(rows)
        self._write_manifest()

    def close(self) -> None:
        """Write what is pending (the last, partial shard)."""
        self.flush()
        self._handles.clear()

    @property
    def n_stored(self) -> int:
        """Samples stored: written to shards, and pending in the shard being filled."""
        return len(self.index) + len(self.pending)

    def stats(self, n_samples: int) -> dict:
        """metrics.json["train"]["online"]["cache"]: folder, bound, bytes, samples stored of
        ``n_samples``, whether the bound was reached, reads served."""
        return {
            "folder": str(self.folder),
            "capacity_bytes": self.capacity,
            "bytes": self.bytes,
            "samples_stored": self.n_stored,
            "samples_written": len(self.index),
            "samples_recaptured_every_epoch": n_samples - self.n_stored if self.full else None,
            "full": self.full,
            "reads": self.hits,
        }

    def status(self, n_samples: int) -> str:
        """The progress line's part: bytes of the bound, samples stored, and, once the bound is
        reached, how many samples are recaptured every epoch."""
        mib = 1 << 20
        s = f"cache {self.bytes / mib:.1f}/{self.capacity / mib:.0f} MiB, {self.n_stored}/{n_samples} samples"
        if self.full:
            s += f" (bound reached: {n_samples - self.n_stored} recaptured every epoch)"
        return s
