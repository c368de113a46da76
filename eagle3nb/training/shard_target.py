"""Online training with the target sharded over the ranks (FSDP2), for targets one GPU cannot hold.

Under torchrun with ``world`` processes, :func:`shard_target` applies
``torch.distributed.fsdp.fully_shard`` to each decoder layer, then to the whole model (the root:
embeddings, final norm, lm_head), so each rank keeps about ``1/world`` of the target's parameters.
Each rank still captures the aux states of its own slice of the global batch: the forward
all-gathers one layer's weights at a time (the root's group for the whole forward) and frees them
after, so peak memory is the shard plus one layer (plus the root group) plus activations.
Capture goes through the root's forward (:func:`eagle3nb.target.capture.capture_boundaries`
detects the FSDP root) with ``logits_to_keep=1``, so the root's pre-forward gathers the embeddings
and the lm_head costs one position per row.

Every rank must run the same capture calls in the same order (FSDP's all-gathers are collective):
:class:`eagle3nb.training.online.OnlineSource` already does, one forward per rank per step (a rank
left without samples captures a loss-free stand-in row). Held-out evaluation during training
generates with the whole target on rank 0 alone, so it is refused with a sharded target
(``eval_every: 0``; 04 evaluates the exported drafter).

Loading: each rank reads the whole target into host memory (CPU) and keeps only its shard after
``fully_shard`` (which moves the shard to the rank's GPU); the ranks of a node load one after
another, so a node's host holds one whole copy at a time plus the shards (and loading takes
nproc_per_node times one load). Loading straight into shards (meta device + per-rank reads) is not
built. The drafter's head (embedding, final norm, lm_head, float32) stays whole on every rank.

Tested on CPU with gloo, 2 processes (``tests/training/test_shard_target.py``); NCCL on GPUs was
not run (no multi-GPU machine lent).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from eagle3nb.target.capture import decoder_of
from eagle3nb.training import distributed
from eagle3nb.training.distributed import DistContext

__all__ = [
    "SHARD_MODES",
    "TARGET_SHARD_AUTO_PARAMS",
    "target_param_count",
    "resolve_target_shard",
    "choose_target_shard",
    "shard_target",
    "shard_report",
    "load_sharded_target",
]

SHARD_MODES = ("auto", "none", "fsdp")

# online_target_shard: auto shards when the target has more parameters than this: 2e10 parameters
# are 40 GB in bf16 (80 GB in float32), half an 80 GB GPU, leaving the rest for activations, the
# drafter's training and its AdamW state. 8B-class targets stay whole on every rank (no all-gather
# per layer per batch); 70B, 235B MoE and 671B targets are sharded.
TARGET_SHARD_AUTO_PARAMS = 20_000_000_000


def target_param_count(path: str | Path) -> int:
    """Parameters of the model folder ``path``, summed from its safetensors headers (no tensor is
    read; a tied embedding stored once counts once).

    Raises:
        FileNotFoundError: no ``*.safetensors`` file in ``path``.
    """
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors file to count the target's parameters")
    n = 0
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                n += int(torch.Size(h.get_slice(k).get_shape()).numel())
    return n


def resolve_target_shard(
    mode: str, world: int, training_mode: str = "online", n_params: int = 0, eval_every: int = 0
) -> str:
    """``online_target_shard`` resolved to ``none`` or ``fsdp``.

    ``auto``: ``fsdp`` when training online with ``world`` > 1 processes and the target has more
    than :data:`TARGET_SHARD_AUTO_PARAMS` parameters (``n_params``), else ``none``.

    Raises:
        ValueError: unknown ``mode``; ``fsdp`` (asked, or chosen by ``auto``) with offline
            training, one process, or held-out evaluation during training (``eval_every`` > 0).
    """
    if mode not in SHARD_MODES:
        raise ValueError(f"online_target_shard={mode!r}: use one of {', '.join(SHARD_MODES)}")
    if mode == "none" or (mode == "auto" and training_mode != "online"):
        return "none"
    if mode == "auto" and (world == 1 or n_params <= TARGET_SHARD_AUTO_PARAMS):
        return "none"
    how = (
        ""
        if mode == "fsdp"
        else f" (auto: {n_params:.3g} parameters > {TARGET_SHARD_AUTO_PARAMS:.0e})"
    )
    if training_mode != "online":
        raise ValueError(
            f"online_target_shard=fsdp with training_mode={training_mode!r}: offline training "
            "never loads the whole target (only its head); use online_target_shard: none or auto"
        )
    if world == 1:
        raise ValueError(
            "online_target_shard=fsdp needs several processes (torchrun, world size > 1), got world "
            "size 1; set nproc_per_node (and nnodes) so that there are at least 2, or use none"
        )
    if eval_every > 0:
        raise ValueError(
            f"online_target_shard=fsdp{how} with eval_every={eval_every}: held-out evaluation "
            "generates with the whole target on rank 0; set eval_every: 0 (04 evaluates the "
            "exported drafter) or online_target_shard: none"
        )
    return "fsdp"


def choose_target_shard(
    mode: str, world: int, training_mode: str, eval_every: int, model_path: str | Path
) -> str:
    """:func:`resolve_target_shard` for a run: counts the parameters of ``model_path`` (headers
    only) when ``auto`` needs them (online, ``world`` > 1). Returns ``none`` or ``fsdp``.

    Raises:
        ValueError: as :func:`resolve_target_shard`.
    """
    n = 0
    if mode == "auto" and training_mode == "online" and world > 1:
        n = target_param_count(model_path)
    return resolve_target_shard(mode, world, training_mode, n, eval_every)


def _mesh(ctx: DistContext, device: torch.device):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (ctx.world,))


def shard_target(model: torch.nn.Module, ctx: DistContext, device="cpu", mesh=None) -> dict:
    """Shard ``model`` (an HF causal LM or wrapper in eval mode, frozen, any dtype, on the CPU or
    already on ``device``) in place over the ``ctx.world`` ranks: ``fully_shard`` on each decoder
    layer, then on the model (root). Parameters become DTensors sharded on dim 0; FSDP moves them
    to ``device`` (the rank's GPU, or the CPU under gloo). Every rank must call it.

    Returns:
        :func:`shard_report` of the sharded model.

    Raises:
        ValueError: ``ctx.world`` is 1, or the model has no decoder layers
            (:func:`eagle3nb.target.capture.decoder_of`).
    """
    if ctx.world < 2:
        raise ValueError("shard_target needs a process group of 2 or more ranks (torchrun)")
    _fully_shard(model, mesh if mesh is not None else _mesh(ctx, torch.device(device)))
    return shard_report(model, ctx)


def _fully_shard(model: torch.nn.Module, mesh) -> None:
    """fully_shard each decoder layer, then the root (local work only: no collective)."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_of(model).layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def shard_report(model: torch.nn.Module, ctx: DistContext | None = None) -> dict:
    """What each rank holds of ``model``: ``{"mode": "fsdp"|"none", "world", "full_params",
    "rank_params" [world], "rank_bytes" [world], "largest_rank_share"}``; ``rank_*`` count the
    local shards (``DTensor.to_local()``; a whole tensor when not sharded), ``full_params`` the
    logical (unsharded) sizes, each parameter once; ``mode`` is fsdp when any parameter is a
    DTensor. ``ctx``: the process group (default: the current one). Every rank must call it
    (an all-reduce gathers the per-rank counts)."""
    from torch.distributed.tensor import DTensor

    ctx = ctx or distributed.current()
    seen, full, local, nbytes, sharded = set(), 0, 0, 0, False
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        sharded |= isinstance(p, DTensor)
        loc = p.to_local() if isinstance(p, DTensor) else p
        full += p.numel()
        local += loc.numel()
        nbytes += loc.numel() * loc.element_size()
    counts = torch.zeros(2, ctx.world, dtype=torch.float64)
    counts[0, ctx.rank], counts[1, ctx.rank] = local, nbytes
    counts = ctx.sum(counts)
    rank_params = [int(x) for x in counts[0].tolist()]
    return {
        "mode": "fsdp" if sharded else "none",
        "world": ctx.world,
        "full_params": int(full),
        "rank_params": rank_params,
        "rank_bytes": [int(x) for x in counts[1].tolist()],
        "largest_rank_share": max(rank_params) / max(full, 1),
    }


def load_sharded_target(name_or_path, dtype: str, device: str, ctx: DistContext):
    """Load the target (``dtype``) and shard it over the ranks (:func:`shard_target`), the ranks
    of a node one after another (each reads the whole model into host memory, then keeps its
    shard on ``device``; nodes load in parallel), plus its float32 head (embedding, final norm,
    lm_head: what the drafter and its labels read, :func:`eagle3nb.target.head.load_target_head`,
    whole on every rank as in offline training). Every rank must call it.

    The model is read on the CPU, so :func:`eagle3nb.target.models.load_target` picks HF's eager
    MoE experts implementation (it does for CPU loads), also when the shards then run on GPUs.

    Returns:
        ``(sharded_model, tokenizer, path, head, report)``; ``report`` as :func:`shard_report`.

    Raises:
        ValueError, FileNotFoundError: as :func:`eagle3nb.target.models.load_target`.
    """
    from eagle3nb.target import models
    from eagle3nb.target.head import load_target_head

    mesh = _mesh(ctx, torch.device(device))  # collective: before the staggered loads
    model = tok = path = None
    # the ranks of a node one after another (torchrun starts nproc_per_node on every node)
    for r in range(int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world))):
        if r == ctx.local_rank:
            model, tok, path = models.load_target(name_or_path, dtype, "cpu")
            _fully_shard(model, mesh)  # frees all but this rank's shard, moved to ``device``
        ctx.barrier()
    rep = shard_report(model, ctx)
    return model, tok, path, load_target_head(path, torch.float32, device), rep
