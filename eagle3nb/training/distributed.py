"""torch.distributed plumbing for training: process group from torchrun, DDP/FSDP wrapping,
per-rank checkpoints, and launching torchrun from a notebook.

- Process group: torchrun (``python -m torch.distributed.run``) sets ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK`` and the rendezvous; :func:`init_from_env` joins it with ``nccl`` on GPUs and
  ``gloo`` on CPU. Without those variables everything runs in one process, unchanged.
- Wrapping: DDP (``torch.nn.parallel.DistributedDataParallel``) replicates the drafter; FSDP2
  (``torch.distributed.fsdp.fully_shard``) shards its parameters, gradients and AdamW state, for
  drafters whose lm_head (draft vocab x H) or MLP make replicas too big.
- Checkpoints: ``torch.distributed.checkpoint`` (DCP) writes model and optimizer state with one
  file per rank (sharded under FSDP, resharded on load); a per-rank ``rank-XXXXX.pt`` holds that
  rank's RNG states, scheduler, step (= data position) and logs. The step folder is committed by
  ``latest.json`` after every rank has written, so a kill leaves the previous checkpoint in force.
  Several nodes need ``out_dir`` on a shared filesystem.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from eagle3nb.manifest import atomic_write_json, read_json

__all__ = [
    "DistContext",
    "init_from_env",
    "current",
    "under_torchrun",
    "use_fsdp",
    "wrap",
    "unwrap_full_state",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "best_checkpoint",
    "load_weights",
    "torchrun_command",
    "FSDP_AUTO_PARAMS",
]

# fsdp: auto shards when a replica's trainable parameters exceed this (fp32 weights + grads + two
# AdamW moments = 16 bytes each, so 16 GB per replica); the 8B-shape drafter (lm_head 32000 x 4096)
# has ~0.42e9 and stays on DDP, a 1T target's drafter (H 7168, draft vocab 128k+) goes to FSDP.
FSDP_AUTO_PARAMS = 1_000_000_000


@dataclass
class DistContext:
    """Where this process sits: ``rank`` of ``world`` processes, ``local_rank`` on its node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: Optional[str] = None

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the process that logs, exports and writes metrics)."""
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """All-reduce SUM of ``t`` over all ranks (no-op in one process); returns the sum on
        ``t``'s device (a CPU tensor goes through the GPU under NCCL, which reduces GPU tensors only)."""
        if self.world > 1:
            if self.backend == "nccl" and t.device.type == "cpu":
                g = t.to(f"cuda:{torch.cuda.current_device()}")
                dist.all_reduce(g, op=dist.ReduceOp.SUM)
                return g.cpu()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        """Wait for every rank (no-op in one process)."""
        if self.world > 1:
            dist.barrier()


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) started this process with a world size."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def current() -> DistContext:
    """The context of an initialised process group, or the one-process context."""
    if dist.is_available() and dist.is_initialized():
        return DistContext(
            dist.get_rank(),
            dist.get_world_size(),
            int(os.environ.get("LOCAL_RANK", 0)),
            dist.get_backend(),
        )
    return DistContext()


def init_from_env(device: str) -> DistContext:
    """Join the process group torchrun describes in the environment (no-op when not launched by
    torchrun or when WORLD_SIZE is 1). ``device``: ``cpu`` (gloo) or ``cuda`` (nccl; this process
    takes GPU ``LOCAL_RANK``).

    Raises:
        ValueError: ``device`` is cuda but fewer GPUs are visible than ``LOCAL_RANK`` needs.
    """
    if dist.is_available() and dist.is_initialized():
        return current()
    if not under_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return DistContext()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if device.startswith("cuda"):
        if local >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK={local} but torch sees {torch.cuda.device_count()} GPUs; lower nproc_per_node to the GPUs per node"
            )
        torch.cuda.set_device(local)
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend)
    return current()


def local_device(device: str, ctx: DistContext) -> str:
    """``cuda`` -> ``cuda:LOCAL_RANK`` under torchrun (one GPU per process); else unchanged."""
    return f"cuda:{ctx.local_rank}" if device == "cuda" and ctx.world > 1 else device


def use_fsdp(mode: str, n_trainable: int, ctx: DistContext) -> bool:
    """Whether to shard: ``on``/``off`` as asked; ``auto`` when several processes train a drafter
    with more than :data:`FSDP_AUTO_PARAMS` trainable parameters.

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"fsdp={mode!r}: use auto, on or off")
    if ctx.world == 1:
        return False
    return mode == "on" or (mode == "auto" and n_trainable > FSDP_AUTO_PARAMS)


def wrap(module: torch.nn.Module, fsdp: bool, ctx: DistContext) -> tuple[torch.nn.Module, str]:
    """Wrap ``module`` for data parallel training; returns ``(wrapped, "single"|"ddp"|"fsdp")``.

    FSDP shards the whole module as one unit: the drafter is one layer run k times per step (TTT),
    and a single unit keeps every reuse inside one unshard/reshard (sharding pays off in the
    gradients and AdamW state, which stay sharded). Buffers (d2t, t2d) are the same on every rank
    (built from the same data), so DDP does not re-broadcast them each step.
    """
    if ctx.world == 1:
        return module, "single"
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(module)
        return module, "fsdp"
    dev = next(module.parameters()).device
    ids = [dev.index] if dev.type == "cuda" else None
    import inspect

    DDP = torch.nn.parallel.DistributedDataParallel
    no_sync = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DDP).parameters
        else {"broadcast_buffers": False}
    )
    return DDP(module, device_ids=ids, **no_sync), "ddp"


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def unwrap_full_state(model: torch.nn.Module) -> dict:
    """Full (unsharded) state dict of the wrapped module on CPU; every rank must call it (FSDP
    gathers). Keys as in the unwrapped module."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        _inner(model), options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


@contextlib.contextmanager
def _quiet_single(ctx: DistContext):
    """DCP warns that it assumes one process when no group exists: that is the intent here."""
    with warnings.catch_warnings():
        if ctx.world == 1:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def latest_checkpoint(ckpt_dir: Path) -> Optional[dict]:
    """``latest.json`` of a checkpoint folder (``{"step", "dir", "world_size", "mode"}``) or None."""
    f = Path(ckpt_dir) / "latest.json"
    return read_json(f, "checkpoint pointer") if f.exists() else None


def best_checkpoint(ckpt_dir: Path) -> Optional[dict]:
    """``best.json`` of a checkpoint folder (``{"step", "dir", "tau", "world_size", "mode"}``: the
    step with the highest held-out tau so far) or None."""
    f = Path(ckpt_dir) / "best.json"
    return read_json(f, "best checkpoint pointer") if f.exists() else None


def save_checkpoint(
    ckpt_dir: Path,
    step: int,
    model,
    opt,
    extra: dict,
    ctx: DistContext,
    mode: str,
    *,
    commit: tuple[str, ...] = ("latest",),
    keep_last: int = 1,
    best_tau: float | None = None,
) -> None:
    """Write step ``step``: DCP model+optimizer (one file per rank) and this rank's ``extra``
    (+ RNG states), then commit it (rank 0, after every rank has written). Every rank must call it.

    Args:
        commit: the pointers that name this step: ``latest`` (``latest.json``, what a rerun
            resumes from) and/or ``best`` (``best.json``, with ``best_tau``, the held-out tau).
        keep_last: step folders kept as ``latest`` history (1: the previous one is dropped once
            this one is committed); the ``best`` folder is kept whatever its age.

    Raises:
        ValueError: ``commit`` empty or naming another pointer, ``best`` without ``best_tau``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if not commit or set(commit) - {"latest", "best"} or ("best" in commit and best_tau is None):
        raise ValueError(f"commit={commit!r}: latest and/or best (best needs best_tau)")
    ckpt_dir = Path(ckpt_dir)
    name = f"step-{step:08d}"
    tmp = ckpt_dir / (name + ".partial")
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a killed run
        tmp.mkdir(parents=True)
    ctx.barrier()
    msd, osd = get_state_dict(_inner(model), opt)
    with _quiet_single(ctx):
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp), no_dist=ctx.world == 1)
    torch.save(dict(extra, rng=_rng_state()), tmp / f"rank-{ctx.rank:05d}.pt")
    ctx.barrier()  # every rank's files are on disk
    if ctx.is_main:
        final = ckpt_dir / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _commit(
            ckpt_dir,
            name,
            step,
            {"world_size": ctx.world, "mode": mode},
            commit,
            keep_last,
            best_tau,
        )
    ctx.barrier()


def _commit(ckpt_dir: Path, name, step, info, commit, keep_last: int, best_tau) -> None:
    """Point ``latest.json`` / ``best.json`` at folder ``name``, then drop the step folders that
    neither the kept ``latest`` history (``recent``, newest ``keep_last``) nor ``best`` names."""
    old, old_best = latest_checkpoint(ckpt_dir), best_checkpoint(ckpt_dir)
    before = set(old.get("recent", [old["dir"]])) if old else set()
    if old_best:
        before.add(old_best["dir"])
    if "latest" in commit:
        recent = [d for d in (old.get("recent", [old["dir"]]) if old else []) if d != name]
        recent = (recent + [name])[-max(1, keep_last) :]
        atomic_write_json(
            ckpt_dir / "latest.json", {"step": step, "dir": name, **info, "recent": recent}
        )
    if "best" in commit:
        atomic_write_json(
            ckpt_dir / "best.json", {"step": step, "dir": name, "tau": best_tau, **info}
        )
    new, new_best = latest_checkpoint(ckpt_dir), best_checkpoint(ckpt_dir)
    keep = set(new.get("recent", [new["dir"]])) if new else set()
    keep |= {new_best["dir"]} if new_best else set()
    for d in before - keep:
        shutil.rmtree(ckpt_dir / d, ignore_errors=True)


def load_weights(ckpt_dir: Path, name: str, model, ctx: DistContext) -> None:
    """Load the model weights (not the optimizer) of step folder ``name`` into ``model`` (DCP
    reshards under FSDP). Every rank must call it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    msd = get_model_state_dict(_inner(model))
    sd = {"model": msd}
    with _quiet_single(ctx):
        dcp.load(sd, checkpoint_id=str(Path(ckpt_dir) / name), no_dist=ctx.world == 1)
    set_model_state_dict(_inner(model), sd["model"])


def load_checkpoint(ckpt_dir: Path, model, opt, ctx: DistContext, expect: dict) -> Optional[dict]:
    """Restore the committed checkpoint into ``model`` and ``opt`` (DCP reshards if the world size
    changed) and return this rank's extra dict (RNG states restored); None when there is none.
    Every rank must call it.

    Args:
        expect: entries the saved extra dict must equal (e.g. config and data fingerprint),
            checked before any tensor is read.

    Raises:
        ValueError: the checkpoint differs from ``expect`` (names the folder to delete).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    ptr = latest_checkpoint(ckpt_dir)
    if ptr is None:
        return None
    d = Path(ckpt_dir) / ptr["dir"]
    f = d / f"rank-{ctx.rank:05d}.pt"
    if not f.exists():
        f = (
            d / "rank-00000.pt"
        )  # more ranks than saved: data position and logs are global, RNG unused
    extra = torch.load(f, weights_only=False, map_location="cpu")
    bad = [k for k, v in expect.items() if extra.get(k) != v]
    if bad:
        raise ValueError(
            f"checkpoint {d} was made with another training config or dataset ({', '.join(bad)} differ); delete {ckpt_dir} or use another run_name"
        )
    msd, osd = get_state_dict(_inner(model), opt)
    sd = {"model": msd, "optim": osd}
    with _quiet_single(ctx):
        dcp.load(sd, checkpoint_id=str(d), no_dist=ctx.world == 1)
    set_state_dict(_inner(model), opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    _set_rng_state(extra.pop("rng"))
    return extra


def torchrun_command(
    module_args: list[str],
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str = "localhost:29500",
) -> list[str]:
    """``python -m torch.distributed.run ... -m <module_args>`` for this interpreter. One node:
    ``--standalone`` (a free local port); several: c10d rendezvous at ``rdzv_endpoint`` (host:port
    of node 0, reachable from every node)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_per_node}"]
    if nnodes == 1:
        cmd += ["--standalone"]
    else:
        cmd += [
            f"--nnodes={nnodes}",
            f"--node_rank={node_rank}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={rdzv_endpoint}",
            "--rdzv_id=eagle3nb",
        ]
    return cmd + ["-m", *module_args]
