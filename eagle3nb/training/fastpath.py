"""How training runs on its device: precision, compilation and optimizer (the GPU fast path).

Chosen by two settings of :class:`eagle3nb.training.loop.TrainConfig` (run parameters of 03):

``precision``
    ``float32``: weights, activations, gradients and AdamW state in float32 (on CPU exactly the
    computation of earlier versions). ``bf16-mixed``: float32 master weights, gradients and AdamW
    state (no update is rounded away), the forward under ``torch.autocast(bfloat16)`` on CUDA
    (matmuls and attention in bf16, norms and the loss in float32); the frozen embedding table is
    stored in bf16. ``auto``: bf16-mixed on CUDA, float32 elsewhere.
``torch_compile``
    ``on``: the decoder layer (norms, RoPE, projections, flex attention, MLP) and the per-step soft
    cross-entropy run through ``torch.compile`` (static shapes: one graph per TTT step and padded
    length; batches are right-padded to a multiple of :data:`PAD_MULTIPLE` tokens so few lengths
    compile). The compiled wrappers live in the objective's ``fast`` dict, outside the module tree:
    held-out evaluation and export use the plain modules. ``off``: eager. ``auto``: on for CUDA,
    off elsewhere.

The optimizer is AdamW, ``fused=True`` on CUDA (one kernel for all tensors), the default
implementation elsewhere. bench/train_gpu.py measures the result at Llama-3.1-8B drafter shapes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from eagle3nb.drafter.flex_attention import raise_recompile_limits
from eagle3nb.training.objective import soft_ce

__all__ = ["PRECISIONS", "COMPILE", "PAD_MULTIPLE", "FastPath", "resolve", "pad_batch"]

PRECISIONS = ("auto", "float32", "bf16-mixed")
COMPILE = ("auto", "on", "off")
PAD_MULTIPLE = 128  # tokens; compiled training pads each batch's length up to a multiple of this


@dataclass(frozen=True)
class FastPath:
    """The resolved choices for one training run on ``device``."""

    precision: str  # float32 or bf16-mixed
    compile: bool
    fused_adamw: bool

    def autocast(self, device: torch.device):
        """The context the forward runs in: bf16 autocast for bf16-mixed, else nothing."""
        if self.precision == "bf16-mixed":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def setup(self, objective, sharded: bool) -> None:
        """Prepare a :class:`eagle3nb.training.objective.TTTObjective` before it is wrapped for
        DDP/FSDP: bf16 embedding table (bf16-mixed, unless FSDP shards it: FSDP needs one dtype),
        compiled layer and loss (``compile``)."""
        d = objective.drafter
        if self.precision == "bf16-mixed" and not sharded:
            d.embed_tokens.to(torch.bfloat16)  # frozen: read, never updated
        if self.compile:
            raise_recompile_limits()
            objective.fast["layer"] = torch.compile(d.midlayer, dynamic=False)
            objective.fast["ce"] = torch.compile(soft_ce, dynamic=False)

    def optimizer(self, params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        """AdamW (betas 0.9, 0.95) over ``params``; fused on CUDA."""
        extra = {"fused": True} if self.fused_adamw else {}
        return torch.optim.AdamW(
            params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay, **extra
        )

    def prepare(self, b: dict) -> dict:
        """A batch as training consumes it: padded to :data:`PAD_MULTIPLE` when compiled."""
        return pad_batch(b, PAD_MULTIPLE) if self.compile else b


def resolve(precision: str, compile: str, device: torch.device) -> FastPath:
    """The :class:`FastPath` for the settings on ``device`` (``auto``: the GPU choice on CUDA,
    float32 and eager elsewhere, as earlier versions computed).

    Raises:
        ValueError: an unknown setting, or bf16-mixed / compile on a device other than CUDA.
    """
    if precision not in PRECISIONS or compile not in COMPILE:
        raise ValueError(
            f"precision={precision!r}, torch_compile={compile!r}: use precision in {PRECISIONS} "
            f"and torch_compile in {COMPILE}"
        )
    cuda = device.type == "cuda"
    prec = ("bf16-mixed" if cuda else "float32") if precision == "auto" else precision
    comp = cuda if compile == "auto" else compile == "on"
    if not cuda and (prec != "float32" or comp):
        raise ValueError(
            f"precision={prec}, torch_compile={compile} need a CUDA device (training runs on "
            f"{device}); use precision auto or float32 and torch_compile auto or off"
        )
    return FastPath(prec, comp, cuda)


def pad_batch(b: dict, multiple: int) -> dict:
    """Right-pad every ``[B, T, ...]`` tensor of a batch (all but ``sample_index``) with zeros to
    a length that is a multiple of ``multiple``: padded positions are masked out of attention
    (``attn_mask`` 0) and of the loss (``loss_mask`` 0), so the loss is the same."""
    T = b["input_ids"].shape[1]
    extra = -T % multiple
    if extra == 0:
        return b
    out = {}
    for k, v in b.items():
        if k == "sample_index":
            out[k] = v
            continue
        pad = v.new_zeros((v.shape[0], extra, *v.shape[2:]))
        out[k] = torch.cat([v, pad], dim=1)
    return out
