"""The hand-over of captured batches from the capture engine's side to the trainer, behind one
small interface (:class:`BatchTransport`: put batch / get batch / close), so a transport across
hosts (NCCL, Mooncake; docs/training.md#online-from-the-serving-engine) can take the place of the
one implemented here.

:class:`ByteBoundedQueue` is that interface inside one process: a capture thread puts each
training batch (already right-padded CPU tensors, what :func:`eagle3nb.dataset.read.collate`
gives for stored samples) and the training loop takes them in order. The queue holds at most
``capacity_bytes`` of tensors: a put that would pass it waits (the engine is held back when the
trainer is slower), a get on an empty queue waits (the trainer is held back when capture is
slower); both waits are summed, so the progress line can say which side waits. A single batch
larger than the whole capacity is admitted only into an empty queue (else nothing could ever
move), so the bytes held never exceed ``max(capacity_bytes, largest batch)``.

Mirrors, in one process, the byte watermarks of SpecForge v0.3's feature store
(``feature_store_max_resident_bytes``) and TorchSpec's sample pool (``max_sample_pool_size``):
/work/shared/reference/streaming_and_versions.md, section 1a.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Protocol

import torch

__all__ = ["BatchTransport", "ByteBoundedQueue", "TransportClosed", "batch_nbytes"]


class TransportClosed(RuntimeError):
    """A put or get on a transport that was closed (the other side stopped)."""


def batch_nbytes(batch: dict) -> int:
    """Bytes of the tensors of ``batch`` (a dict of tensors and other values; others count 0)."""
    return sum(v.numel() * v.element_size() for v in batch.values() if torch.is_tensor(v))


class BatchTransport(Protocol):
    """What the online source needs from a transport (one producer, one consumer, in order).

    - ``put(batch)``: hand over one training batch (dict of CPU tensors); may block while the
      transport is full; raises :class:`TransportClosed` after ``close``.
    - ``get() -> dict | None``: the next batch in put order, blocking while none is there;
      None once the producer called ``close`` and everything put was taken.
    - ``close()``: no more puts; wakes both sides (idempotent).
    - ``stats() -> dict``: counters for the progress line and metrics.json.
    """

    name: str

    def put(self, batch: dict) -> None: ...

    def get(self) -> dict | None: ...

    def close(self) -> None: ...

    def stats(self) -> dict: ...


class ByteBoundedQueue:
    """In-process transport bounded in bytes (see the module docstring).

    Args:
        capacity_bytes: most tensor bytes held at once (> 0).
        clock: seconds (monotonic) for the wait counters.

    Raises:
        ValueError: ``capacity_bytes`` < 1.
    """

    name = "in-process queue (bounded in bytes)"

    def __init__(self, capacity_bytes: int, clock=time.monotonic):
        if int(capacity_bytes) < 1:
            raise ValueError(f"capacity_bytes={capacity_bytes}: must be >= 1")
        self.capacity = int(capacity_bytes)
        self._items: deque = deque()
        self._bytes = 0
        self._closed = False
        self._cv = threading.Condition()
        self._clock = clock
        self.put_wait_seconds = 0.0  # capture waiting: the queue was full
        self.get_wait_seconds = 0.0  # trainer waiting: the queue was empty
        self.max_bytes = 0
        self.max_depth = 0
        self.puts = 0

    def put(self, batch: dict) -> None:
        n = batch_nbytes(batch)
        with self._cv:
            t0 = self._clock()
            while not self._closed and self._items and self._bytes + n > self.capacity:
                self._cv.wait(0.5)
            self.put_wait_seconds += self._clock() - t0
            if self._closed:
                raise TransportClosed("put on a closed transport (the trainer stopped)")
            self._items.append((batch, n))
            self._bytes += n
            self.puts += 1
            self.max_bytes = max(self.max_bytes, self._bytes)
            self.max_depth = max(self.max_depth, len(self._items))
            self._cv.notify_all()

    def get(self) -> dict | None:
        with self._cv:
            t0 = self._clock()
            while not self._items and not self._closed:
                self._cv.wait(0.5)
            self.get_wait_seconds += self._clock() - t0
            if not self._items:
                return None
            batch, n = self._items.popleft()
            self._bytes -= n
            self._cv.notify_all()
            return batch

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def stats(self) -> dict:
        """``depth`` and ``bytes`` now, their maxima, ``capacity_bytes``, the summed waits of
        both sides (``capture_wait_seconds``: full queue; ``trainer_wait_seconds``: empty)."""
        with self._cv:
            return {
                "transport": self.name,
                "depth": len(self._items),
                "bytes": self._bytes,
                "max_depth": self.max_depth,
                "max_bytes": self.max_bytes,
                "capacity_bytes": self.capacity,
                "batches_put": self.puts,
                "capture_wait_seconds": round(self.put_wait_seconds, 3),
                "trainer_wait_seconds": round(self.get_wait_seconds, 3),
            }
