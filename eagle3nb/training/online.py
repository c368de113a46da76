"""Online training: the target captures each batch's aux states inside the training loop (Hugging
Face engine), so nothing but 01's token ids is on disk.

:class:`OnlineSource` stands where :class:`eagle3nb.dataset.read.AuxDataset` stands in
:func:`eagle3nb.training.loop.train_drafter`: same samples in the same order (01's train records with
generated tokens, minus those with an empty loss mask, exactly what 02 would store), same
``manifest`` fields, and a :meth:`OnlineSource.batch` that returns what ``collate`` returns for
the stored dataset. The drafter, the loss and the optimizer are untouched, so online and offline
training on the same data agree up to float noise from different capture batch shapes
(``tests/training/test_online.py``).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Sequence

import torch

from eagle3nb.padding import pad_right
from eagle3nb.target.capture import HFCaptureEngine, capture_boundaries, n_layers_of

__all__ = ["OnlineSource", "loss_bearing_items", "nonfinite_samples"]


def loss_bearing_items(samples) -> tuple[list[dict], list[int]]:
    """Online training's samples as items, as 02 would store them: ``(items, empty)``, items
    ``{"input_ids": [T] int64, "loss_mask": [T] uint8, "sample_id": int}`` for the samples
    ``(sample_id, input_ids, loss_mask)`` with a loss-bearing token, and the ids of those without.

    Raises:
        ValueError: no sample has a loss-bearing token.
    """
    items = [
        {
            "input_ids": torch.tensor(s[1], dtype=torch.long),
            "loss_mask": torch.tensor(s[2], dtype=torch.uint8),
            "sample_id": int(s[0]),
        }
        for s in samples
        if any(s[2])
    ]
    if not items:
        raise ValueError(
            "no sample with a loss-bearing token: nothing to train on online; check 01's output and the loss mask (mode)"
        )
    return items, [int(s[0]) for s in samples if not any(s[2])]


def nonfinite_samples(aux: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the samples of a batch holding a NaN or an infinity anywhere in ``aux
    [B, T, n_aux*H]`` or ``final [B, T, H]`` (float32), by each sample's float32 sum: a NaN or an
    infinity makes the sum non-finite (inf + -inf is NaN), finite values only past 3.4e38 in
    total, which no residual stream reaches. Why not ``isfinite`` per element: on the host it
    read 0.5 GB per batch at the 8B shape (0.30 s on 2 cores against 0.012 s for the sum), and
    engine-fed online training builds its batches on one thread."""
    return ~(
        torch.isfinite(aux.sum(dim=tuple(range(1, aux.dim())), dtype=torch.float32))
        & torch.isfinite(final.sum(dim=tuple(range(1, final.dim())), dtype=torch.float32))
    )


class OnlineSource:
    """Training samples whose aux states the target computes when a batch is drawn.

    Args:
        samples: ``(sample_id, input_ids, loss_mask)`` triples (as 02 extracts them).
        model: the HF target in eval mode (the capture engine; any dtype, on the training device).
        ids: aux layer ids in ``convention``.
        convention: layer-id convention name.
        manifest: provenance fields as 02 would write them (target, convention, dtype, template,
            generation_sha256, ...); completed here with engine, ids, boundaries and counts.

    ``ds[i]`` -> ``{"input_ids" [T] int64, "loss_mask" [T] uint8, "sample_id"}`` (no states);
    :meth:`batch` -> the ``collate`` dict with ``aux [B, T, n_aux*H]`` and ``final [B, T, H]``
    float32, zero at padding (as stored samples are padded).

    Raises:
        ValueError: no sample with a loss-bearing token; ids the convention cannot capture.
    """

    def __init__(
        self,
        samples: Sequence[tuple[int, list[int], list[int]]],
        model,
        ids: Sequence[int],
        convention: str,
        manifest: dict,
    ):
        import transformers

        self.model = model
        self.engine = HFCaptureEngine(model, convention)
        self.ids = list(ids)
        self.boundaries = self.engine.boundaries(self.ids)
        self.n = n_layers_of(model)
        self.items, empty = loss_bearing_items(samples)
        self.manifest = dict(
            manifest,
            engine={
                "name": self.engine.engine_name,
                "version": transformers.__version__,
                "capture_point_of": convention,
                "online": True,
            },
            convention=convention,
            layer_ids=self.ids,
            aux_boundaries=self.boundaries,
            final_boundary=self.n,
            training_mode="online",
            n_samples=len(self.items),
            n_tokens=int(sum(x["input_ids"].numel() for x in self.items)),
            skipped={"nonfinite": [], "empty_loss_mask": empty},
        )
        self.n_aux = len(self.boundaries)
        self.plan = None  # set by configure() from the training config
        self.capture_seconds = 0.0  # target forward + capture, summed over batches
        self.captured_tokens = 0
        self.nonfinite_rows = 0  # rows whose states were not finite: their loss mask is zeroed

    def stats(self) -> dict:
        """metrics.json["train"]["online"]: target capture seconds and tokens/s of this process,
        rows masked for non-finite states, and ``target_shard`` (what each rank holds of the
        target, :func:`eagle3nb.training.shard_target.shard_report`, when recorded)."""
        secs = self.capture_seconds
        return {
            "target_capture_seconds": round(secs, 3),
            "target_capture_tokens_per_s": round(self.captured_tokens / secs, 1) if secs else None,
            "nonfinite_rows_masked": self.nonfinite_rows,
            "target_shard": self.manifest["engine"].get("target_shard"),
            "note": "capture times are of this process only (a resumed run counts its last part)",
        }

    def fingerprint(self) -> str:
        """sha256 over what determines the batches: sample ids and tokens, target, boundaries, dtype."""
        h = hashlib.sha256(
            json.dumps(
                {
                    k: self.manifest.get(k)
                    for k in ("target", "aux_boundaries", "dtype", "generation_sha256", "template")
                },
                sort_keys=True,
                default=str,
            ).encode()
        )
        for x in self.items:
            h.update(str(x["sample_id"]).encode())
            h.update(x["input_ids"].numpy().tobytes())
            h.update(x["loss_mask"].numpy().tobytes())
        return h.hexdigest()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]

    def token_masks(self):
        """``(input_ids [T] int64, loss_mask [T] uint8)`` per sample, for the draft vocab."""
        for x in self.items:
            yield x["input_ids"], x["loss_mask"]

    def configure(
        self, global_batch: int, seed: int = 0, bucket: bool = True, bucket_window: int = 16
    ) -> "OnlineSource":
        """Use the offline loader's batch plan (:class:`eagle3nb.training.batches.BatchPlan`) over these
        samples' lengths, so online and offline training see the same global batches in the same
        order; :func:`eagle3nb.training.loop.make_source` calls it with the training config. Returns self."""
        from eagle3nb.training.batches import BatchPlan

        self.plan = BatchPlan(
            [x["input_ids"].numel() for x in self.items], global_batch, seed, bucket, bucket_window
        )
        return self

    def padding(self, world: int = 1) -> dict:
        """:func:`eagle3nb.training.batches.plan_padding` of this source's plan."""
        from eagle3nb.training.batches import plan_padding

        return plan_padding(self.plan, world)

    def batches(
        self, start: int, stop: int, rank: int = 0, world: int = 1, pin_memory: bool = False
    ):
        """The :class:`eagle3nb.training.batches.BatchSource` interface: this rank's slice of each global
        step's batch (the plan and slicing of :class:`eagle3nb.training.batches.OfflineSource`), its states
        captured by the target now, on the target's device, plus ``sample_index [b]`` (-1 for the
        loss-free stand-in row of a rank left without samples)."""
        if self.plan is None:
            raise RuntimeError(
                "OnlineSource.batches before configure(): pass the source to train_drafter, which configures it from TrainConfig"
            )
        dev = next(self.model.parameters()).device
        for s in range(start, stop):
            b = self.plan.global_batch_at(s)
            part = self.plan.rank_slice(b, rank, world)
            out = self.batch(part or [b[0]], dev)
            if not part:
                out["loss_mask"] = torch.zeros_like(out["loss_mask"])
            out["sample_index"] = torch.tensor(part or [-1], dtype=torch.long)
            yield out

    @torch.no_grad()
    def batch(self, idx: Sequence[int], device) -> dict:
        """Right-padded batch of samples ``idx`` on ``device`` with their states captured now:
        ``input_ids, loss_mask, attn_mask [B, T]`` int64, ``aux [B, T, n_aux*H]`` and
        ``final [B, T, H]`` float32, zero at padding (what ``collate`` gives for stored samples)."""
        items = [self.items[i] for i in idx]
        ids, attn = pad_right([x["input_ids"] for x in items], dtype=torch.long)  # [B, T] both
        loss = pad_right([x["loss_mask"] for x in items], dtype=torch.long)[0]  # [B, T]
        ids, loss, attn = ids.to(device), loss.to(device), attn.to(device)
        if torch.device(device).type == "cuda":  # the training step still queued is not capture
            torch.cuda.synchronize()
        t0 = time.time()
        st = capture_boundaries(self.model, ids, sorted(set(self.boundaries + [self.n])), attn)
        real = attn[..., None].float()  # padding holds zeros, as in the stored dataset's collate
        aux = torch.cat([st[b].float() for b in self.boundaries], dim=-1) * real  # [B, T, n_aux*H]
        final = st[self.n].float() * real  # [B, T, H]
        if torch.device(device).type == "cuda":  # time the forward, not its launch
            torch.cuda.synchronize()
        self.capture_seconds += time.time() - t0
        self.captured_tokens += int(attn.sum())
        bad = nonfinite_samples(aux, final)  # [B]
        if bad.any():  # offline drops such samples at extraction; online drops them from the loss
            self.nonfinite_rows += int(bad.sum())
            loss[bad] = 0
            aux[bad], final[bad] = 0.0, 0.0
        return {"input_ids": ids, "loss_mask": loss, "attn_mask": attn, "aux": aux, "final": final}
