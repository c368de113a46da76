"""Run by tests/training/test_shard_target.py under torchrun (2 gloo processes on CPU): load the
embedded target sharded over the ranks (FSDP2), in float32 then in bfloat16, capture a few steps
of online batches and write, per rank and dtype, what it holds and what it captured to
``<out>/rank-<r>-<dtype>.pt``.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node 2 shard_worker.py OUT STEPS``
with ``OUT/samples.json`` holding ``[[sample_id, input_ids, loss_mask], ...]``.
"""

import json
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from eagle3nb.training import distributed
from eagle3nb.training.online import OnlineSource
from eagle3nb.training.shard_target import load_sharded_target


def main(out: Path, steps: int) -> None:
    ctx = distributed.init_from_env("cpu")
    samples = json.loads((out / "samples.json").read_text())
    for dtype in ("float32", "bfloat16"):
        model, _, _, _, rep = load_sharded_target("stories260K-hd32", dtype, "cpu", ctx)
        local = {  # name -> (is a DTensor, local shard numel, logical numel)
            n: (
                isinstance(p, DTensor),
                p.to_local().numel() if isinstance(p, DTensor) else p.numel(),
                p.numel(),
            )
            for n, p in model.named_parameters()
        }
        src = OnlineSource(samples, model, [0, 1, 3], "sglang", {}).configure(3, seed=0)
        batches = [
            {k: v.clone() for k, v in b.items()} for b in src.batches(0, steps, ctx.rank, ctx.world)
        ]
        res = {"local": local, "report": rep, "batches": batches}
        torch.save(res, out / f"rank-{ctx.rank}-{dtype}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
