"""Online training fed by the serving engine: the engine (vLLM or SGLang, in its own worker)
captures the aux states of the next batches while the trainer steps on the current ones; no
state is written to the run folder.

:class:`EngineOnlineSource` is a batch source of :func:`eagle3nb.training.loop.train_drafter`
(the interface of :class:`eagle3nb.training.batches.BatchSource`): the same samples, batch plan
(:class:`eagle3nb.training.batches.BatchPlan`) and rank slices as offline training on that
engine's dataset, so online and offline train the same drafter up to the float noise of other
capture batch shapes (``tests/training/test_engine_online.py``, and with the real engines
``tests/engines/test_online_engines.py``).

How a batch travels: a capture thread walks the plan from the resume step, asks the engine
(``capture``: one engine call per training batch; the worker hands tensors over through shared
memory, :mod:`eagle3nb.steps.train.online_engine`), pads them as ``collate`` pads stored samples
and puts the batch into a :class:`eagle3nb.training.transport.BatchTransport` (by default a queue
bounded in bytes); the loop takes batches in order. Every epoch re-captures, unless the opt-in
first-epoch cache (:mod:`eagle3nb.training.online_cache`, ``cache_dir`` / ``cache_bytes``) holds a
sample: then its states are read from there and only the others are captured (one engine call).
Each captured batch's step and sample ids are recorded in :attr:`EngineOnlineSource.cursor`
(``batches_log``: one JSON line per batch, appended), so a resumed run can be shown to have
captured the same batches as an uninterrupted one.

Faults: an exception of a class in ``restartable`` (the engine died) restarts the engine once
(``restart``) and captures the same batch again; a second one stops the run with an error naming
the step and the samples being captured. Resume: batches are a pure function of the step, so a
run killed after its last checkpoint captures the same batches again from there.

Re-check: every ``recheck_every`` steps the loop's batch (as it came out of the transport) is
compared with the engine's own capture of the same samples, asked again as the calls they came
from (a cached sample: the call of the first epoch that captured it): bit-equal when ``exact``
(float32 on CPU), else within ``recheck_tol`` (max |diff|).

This layer imports no engine: the step (:mod:`eagle3nb.steps.train.online_engine`) passes the
capture and restart callables.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from eagle3nb.padding import pad_right
from eagle3nb.training.online import OnlineSource, loss_bearing_items, nonfinite_samples
from eagle3nb.training.online_cache import FirstEpochCache
from eagle3nb.training.transport import BatchTransport, ByteBoundedQueue, TransportClosed

__all__ = ["EngineOnlineSource", "RecheckError"]


class RecheckError(RuntimeError):
    """A streamed batch differs from the engine's own capture of the same samples."""


class EngineOnlineSource(OnlineSource):
    """Training samples whose aux states a serving engine captures while the trainer steps.

    Args:
        samples: ``(sample_id, input_ids, loss_mask)`` triples (as 02 extracts them).
        capture: ``list[list[int]] -> list`` of objects with ``aux [T, n_aux*H]`` and ``final
            [T, H]`` tensors (:class:`eagle3nb.target.capture.Captured`), one per sample, the
            engine's ids already bound.
        manifest: the dataset manifest 02a/02b would write for this engine (engine block,
            convention, layer ids, boundaries, dtype, template, ...); completed here with
            ``training_mode``, counts and ``skipped``.
        prefetch_bytes: capacity of the default transport (bytes of padded batches held).
        recheck_every: steps between re-checks (0: none).
        exact: re-checks demand bit-equality (float32 on CPU); else ``recheck_tol``.
        restart: called once when the engine died; returns nothing (``capture`` then reaches the
            new engine). None: no restart.
        restartable: exception classes that mean the engine died.
        transport: a :class:`BatchTransport` factory ``(capacity_bytes) -> transport``.
        on_close: called by :meth:`close` after the transport is closed (stops the engine).
        final_tol: re-check tolerance of ``final`` when it is not the engine's own tensor (SGLang:
            HF's boundary N computed in this process, whose float32 bits follow torch's thread
            count, which :class:`eagle3nb.threads.Rebalancer` changes during training); None:
            ``final`` is checked as ``aux``.
        build_threads: threads that capture and build batches, each its own steps, put in step
            order (the engine's calls stay one at a time); None: 3 when the trainer asks for
            pinned batches (CUDA), else 1.
        cache_dir, cache_bytes: the first-epoch cache's folder and bound
            (:class:`eagle3nb.training.online_cache.FirstEpochCache`); None / 0: no cache.
        batches_log: a JSON-lines file getting ``{"step", "sample_ids", "cached"}`` per batch
            handed to the trainer (None: not written).

    Raises:
        ValueError: no sample with a loss-bearing token.
    """

    def __init__(
        self,
        samples: Sequence[tuple[int, list[int], list[int]]],
        capture: Callable,
        manifest: dict,
        prefetch_bytes: int = 64 << 20,
        recheck_every: int = 0,
        exact: bool = True,
        recheck_tol: float = 0.0,
        restart: Callable | None = None,
        restartable: tuple = (),
        transport: Callable[[int], BatchTransport] = ByteBoundedQueue,
        on_close: Callable | None = None,
        final_tol: float | None = None,
        build_threads: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_bytes: int = 0,
        batches_log: str | os.PathLike | None = None,
    ):
        self.items, empty = loss_bearing_items(samples)
        self.manifest = dict(
            manifest,
            training_mode="online",
            n_samples=len(self.items),
            n_tokens=int(sum(x["input_ids"].numel() for x in self.items)),
            skipped={"nonfinite": [], "empty_loss_mask": empty},
        )
        self.manifest["engine"] = dict(manifest["engine"], online=True)
        self.n_aux = len(self.manifest["aux_boundaries"])
        self.capture_fn, self.restart_fn, self.restartable = capture, restart, tuple(restartable)
        self.prefetch_bytes, self.recheck_every = int(prefetch_bytes), int(recheck_every)
        self.exact, self.recheck_tol = bool(exact), float(recheck_tol)
        self.make_transport, self.on_close, self.final_tol = transport, on_close, final_tol
        self.plan = None
        self.capture_seconds, self.captured_tokens, self.nonfinite_rows = 0.0, 0, 0
        self.restarts: list[dict] = []
        self.rechecks: list[dict] = []
        self.transport: BatchTransport | None = None
        self._pin = False  # set by batches(): pinned host memory for a CUDA trainer
        # threads building batches (capture, pad, check, pin), putting them in step order: on the
        # first GPU run (H100, 8B shape cut to 8 layers) one thread gave 1.46 s per 0.5 GB batch
        # of host work against 0.18 s of engine capture, and the trainer waited 87 % of the time
        self.build_threads = build_threads
        self._stats_lock = threading.Lock()
        self._engine_lock = threading.Lock()  # one engine call at a time (one pipe)
        self._by_sid = {int(x["sample_id"]): i for i, x in enumerate(self.items)}
        self.cache = None
        if cache_dir is not None and cache_bytes > 0:
            self.cache = FirstEpochCache(cache_dir, self.manifest, cache_bytes)
        self.batches_log = batches_log
        if batches_log is not None:
            Path(batches_log).parent.mkdir(parents=True, exist_ok=True)
        self.cursor: list[dict] = []  # per batch captured in this process: step, sample ids

    def fingerprint(self) -> str:
        """:meth:`OnlineSource.fingerprint` plus the engine (name, version) and its ids: a
        checkpoint trained on another engine's states is not resumed."""
        h = hashlib.sha256(super().fingerprint().encode())
        e = self.manifest["engine"]
        key = [e.get("name"), e.get("version"), self.manifest.get("layer_ids")]
        h.update(json.dumps(key, default=str).encode())
        return h.hexdigest()

    def close(self) -> None:
        """Stop the capture thread (its next put fails) and then the engine (``on_close``);
        called by 03 after training, also when training raised."""
        if self.transport is not None:
            self.transport.close()
        if self.cache is not None:
            self.cache.close()
        if self.on_close is not None:
            self.on_close()

    # ---- capture side ------------------------------------------------------------------------
    def _capture(self, idx: list[int], step: int) -> list:
        """The engine's capture of samples ``idx``, restarting a dead engine once per run."""
        xs = [self.items[i]["input_ids"].tolist() for i in idx]
        while True:
            try:
                with self._engine_lock:
                    return self.capture_fn(xs)
            except self.restartable as e:
                ids = [self.items[i]["sample_id"] for i in idx]
                if self.restart_fn is None or self.restarts:
                    raise RuntimeError(
                        f"the capture engine died capturing step {step}, sample ids {ids}"
                        + (" after its one restart" if self.restarts else "")
                        + f": {str(e).splitlines()[0] if str(e) else type(e).__name__}. The "
                        "checkpoints are kept: fix the engine (its log is named above) and rerun "
                        "03 to resume"
                    ) from e
                self.restarts.append({"step": step, "sample_ids": ids, "error": str(e)[:300]})
                with self._engine_lock:
                    self.restart_fn()

    def build_batch(self, idx: list[int], step: int, keep_loss: bool = True) -> dict:
        """Samples ``idx`` captured by the engine and right-padded as ``collate`` pads stored
        samples: ``input_ids, loss_mask, attn_mask [B, T]`` int64, ``aux [B, T, n_aux*H]`` and
        ``final [B, T, H]`` float32 (zero at padding), ``sample_index [B]`` int64 (-1 for the
        loss-free stand-in row of a rank without samples, ``keep_loss`` False)."""
        items = [self.items[i] for i in idx]
        sids = [int(x["sample_id"]) for x in items]
        hit = [i for i, s in zip(idx, sids) if self.cache is not None and self.cache.has(s)]
        fresh = [i for i in idx if i not in hit]
        got, calls = {}, {}
        if fresh:
            t0 = time.time()
            got = dict(zip(fresh, self._capture(fresh, step)))
            calls = {i: tuple(fresh) for i in fresh}
            with self._stats_lock:
                self.capture_seconds += time.time() - t0
                self.captured_tokens += sum(self.items[i]["input_ids"].numel() for i in fresh)
        for i in hit:  # the first epoch's states, and the call they came from (for the re-check)
            got[i], call = self.cache.read(self.items[i]["sample_id"])
            calls[i] = tuple(self._by_sid[s] for s in call)
        if self.cache is not None:
            fresh_sids = [int(self.items[i]["sample_id"]) for i in fresh]
            for i in fresh:
                x = self.items[i]
                s = (int(x["sample_id"]), x["input_ids"].tolist(), x["loss_mask"].tolist())
                self.cache.offer(s, got[i], fresh_sids)
        caps = [got[i] for i in idx]
        ids, attn = pad_right([x["input_ids"] for x in items], dtype=torch.long)
        loss = pad_right([x["loss_mask"] for x in items], dtype=torch.long)[0]
        aux = pad_right([c.aux for c in caps], dtype=torch.float32)[0]  # [B, T, n_aux*H]
        final = pad_right([c.final for c in caps], dtype=torch.float32)[0]  # [B, T, H]
        bad = nonfinite_samples(aux, final)  # [B]
        with self._stats_lock:
            self.nonfinite_rows += int(bad.sum())
        if bad.any():  # offline drops such samples at extraction; online drops them from the loss
            loss[bad] = 0
            aux[bad], final[bad] = 0.0, 0.0
        if not keep_loss:
            loss = torch.zeros_like(loss)
        index = torch.tensor(idx if keep_loss else [-1], dtype=torch.long)
        self._log_batch(step, sids, len(hit))
        return {
            "input_ids": ids, "loss_mask": loss, "attn_mask": attn, "aux": aux, "final": final,
            "sample_index": index, "_calls": [calls[i] for i in idx],
        }  # fmt: skip

    def _log_batch(self, step: int, sids: list[int], cached: int) -> None:
        rec = {"step": step, "sample_ids": sids, "cached": cached}
        with self._stats_lock:  # build threads (CUDA) append in the order they finish
            self.cursor.append(rec)
            if self.batches_log is not None:  # appended and flushed: what a killed run captured
                with open(self.batches_log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")

    def _produce(self, start: int, stop: int, rank: int, world: int, errors: list, lane: int,
                 lanes: int, turn: threading.Condition, state: dict) -> None:  # fmt: skip
        """Build the batches of steps ``start + lane``, ``+ lanes``, ... and put each when every
        earlier step's is in (``state["next"]``), so the trainer sees step order."""
        try:
            for s in range(start + lane, stop, lanes):
                b = self.plan.global_batch_at(s)
                part = self.plan.rank_slice(b, rank, world)
                batch = self.build_batch(part or [b[0]], s, keep_loss=bool(part))
                if self._pin:  # CUDA: the trainer's non_blocking copy is then asynchronous, as
                    # from the offline loader's pinned batches (a pageable 0.5 GB batch at the 8B
                    # shape is a synchronous copy in the training step)
                    batch = {
                        k: v.pin_memory() if torch.is_tensor(v) else v for k, v in batch.items()
                    }
                batch["_step"] = s
                with turn:
                    turn.wait_for(lambda s=s: state["next"] == s or state["stop"])
                    if state["stop"]:
                        return
                    self.transport.put(batch)
                    state["next"] = s + 1
                    turn.notify_all()
        except TransportClosed:
            pass  # the trainer stopped early
        except BaseException as e:  # noqa: BLE001 (re-raised on the training side)
            errors.append(e)
        finally:
            with turn:
                state["alive"] -= 1
                if errors or state["alive"] == 0:
                    state["stop"] = True
                    self.transport.close()
                turn.notify_all()

    # ---- training side -----------------------------------------------------------------------
    def batches(
        self, start: int, stop: int, rank: int = 0, world: int = 1, pin_memory: bool = False
    ):
        """This rank's batch of each step ``start..stop-1`` (see :class:`BatchSource`), captured
        by the engine on a thread up to ``prefetch_bytes`` ahead of the trainer; ``pin_memory``
        (the loop passes it on CUDA): its tensors in pinned host memory, copied there on that
        thread."""
        if self.plan is None:
            raise RuntimeError(
                "EngineOnlineSource.batches before configure(): pass the source to train_drafter, which configures it from TrainConfig"
            )
        self.transport = self.make_transport(self.prefetch_bytes)
        self._pin = bool(pin_memory)
        errors: list = []
        lanes = self.build_threads or (3 if self._pin else 1)  # CPU: one, as bit-exact tests ran
        lanes = 1 if self.cache is not None else lanes  # the cache fills in step order
        turn, state = threading.Condition(), {"next": start, "stop": False, "alive": lanes}
        ths = [threading.Thread(target=self._produce, daemon=True, args=(
            start, stop, rank, world, errors, i, lanes, turn, state)) for i in range(lanes)]  # fmt: skip
        for th in ths:
            th.start()
        try:
            while True:
                b = self.transport.get()
                if b is None:
                    break
                step, calls = b.pop("_step"), b.pop("_calls")
                if self.recheck_every and (step + 1) % self.recheck_every == 0:
                    self.recheck(b, step, calls)
                yield b
        finally:
            self.transport.close()
            with turn:
                state["stop"] = True
                turn.notify_all()
            for th in ths:
                th.join(timeout=600)
        if errors:
            raise errors[0]

    def recheck(self, b: dict, step: int, calls: list | None = None) -> dict:
        """Compare streamed batch ``b`` (step ``step``) with the engine's capture of the same
        samples asked again now, as the engine calls ``calls`` (per row, the item indices of the
        call it came from; None: the batch's samples in one call); the record goes to
        :attr:`rechecks`.

        Raises:
            RecheckError: a difference (any, when ``exact``; else over ``recheck_tol``), naming
                the step, the sample and the size of the difference.
        """
        idx = [int(i) for i in b["sample_index"].tolist() if i >= 0]
        if not idx:
            return {}
        calls = [tuple(c) for c in calls] if calls is not None else [tuple(idx)] * len(idx)
        again = {}
        for call in dict.fromkeys(calls[: len(idx)]):  # each distinct call once, in order
            again.update({(call, i): c for i, c in zip(call, self._capture(list(call), step))})
        caps = [again[(call, i)] for call, i in zip(calls, idx)]
        worst = 0.0
        for r, (i, c) in enumerate(zip(idx, caps)):
            n = int(b["attn_mask"][r].sum())
            for key, got in (("aux", b["aux"][r, :n]), ("final", b["final"][r, :n])):
                want = getattr(c, key).to(torch.float32)
                same = torch.equal(got, want)
                d = float((got - want).abs().max()) if got.numel() else 0.0
                worst = max(worst, d)
                exact, tol = self.exact, self.recheck_tol
                if key == "final" and self.final_tol is not None:
                    exact, tol = False, self.final_tol
                if (exact and not same) or d > tol:
                    raise RecheckError(
                        f"re-check at step {step}: streamed {key} of sample id "
                        f"{self.items[i]['sample_id']} differs from the engine's own capture of it "
                        f"by {d:.3g} (max |diff|; "
                        + ("bit-equality expected: float32 on CPU" if exact else f"tolerance {tol}")
                        + "): the batch was changed on its way to the trainer"
                    )  # fmt: skip
        rec = {"step": step, "samples": len(idx), "max_abs_diff": worst, "exact": self.exact}
        rec["engine_calls"] = len(set(calls[: len(idx)]))
        self.rechecks.append(rec)
        return rec

    def progress_status(self) -> str:
        """The progress line's part for the prefetch queue: which side waited, the depth."""
        if self.transport is None:
            return ""
        st = self.transport.stats()
        mib = 1 << 20
        line = (
            f"capture waiting {st['capture_wait_seconds']:.1f} s / trainer waiting "
            f"{st['trainer_wait_seconds']:.1f} s, queue {st['depth']} batches "
            f"{st['bytes'] / mib:.1f}/{st['capacity_bytes'] / mib:.0f} MiB"
        )
        if self.cache is not None:
            line += ", " + self.cache.status(len(self.items))
        return line

    def stats(self) -> dict:
        """metrics.json["train"]["online"]: capture seconds and tokens/s, the transport's
        counters, restarts and re-checks."""
        secs = self.capture_seconds
        return {
            "engine": self.manifest["engine"].get("name"),
            "engine_version": self.manifest["engine"].get("version"),
            "target_capture_seconds": round(secs, 3),
            "target_capture_tokens_per_s": round(self.captured_tokens / secs, 1) if secs else None,
            "nonfinite_rows_masked": self.nonfinite_rows,
            "transport": self.transport.stats() if self.transport is not None else None,
            "restarts": self.restarts,
            "rechecks": self.rechecks,
            "cache": self.cache.stats(len(self.items)) if self.cache is not None else None,
            "batches": {
                "first_step": self.cursor[0]["step"] if self.cursor else None,
                "last_step": self.cursor[-1]["step"] if self.cursor else None,
                "captured": len(self.cursor),
                "from_cache_rows": sum(r["cached"] for r in self.cursor),
                "log": str(self.batches_log) if self.batches_log is not None else None,
            },
            "note": "capture times are the engine calls of this process (a resumed run counts its last part)",
        }
