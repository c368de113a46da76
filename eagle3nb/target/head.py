"""The target's head alone: ``embed_tokens``, the final norm and ``lm_head``, read by tensor name from
the target's safetensors (one file or a sharded index), never the whole model.

Offline training needs nothing else of the target: the drafter's frozen embedding, the labels
(``lm_head(norm(boundary-N state))``) and the drafter's initial head. Memory is therefore that of
three tensors (two when the embeddings are tied), whatever the target's depth: an 8B target's head
is 2 x 128256 x 4096 values (1 GiB each in bf16) where the whole model is 16 GB.

Names: the embedding is the one tensor named ``<prefix>embed_tokens.weight`` outside the decoder
layers (``model.`` for Llama/Qwen/Mistral, ``model.language_model.`` or ``language_model.model.`` for
multimodal and MoE wrappers); the final norm is ``<prefix>norm.weight`` next to it; the head is the
``lm_head.weight`` outside the decoder layers, or the embedding itself when the config ties them
or no head is stored. The norm is Llama's RMSNorm (``weight * x / rms(x)``, in float32), the head
a bias-free linear map, exactly as in HF transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

__all__ = ["TargetHead", "head_tensor_names", "load_target_head"]

_EMBED, _NORM, _HEAD = "embed_tokens.weight", "norm.weight", "lm_head.weight"


class _RMSNorm(nn.Module):
    """Llama's RMSNorm, op for op as HF ``LlamaRMSNorm`` (so the labels are the same bits)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class TargetHead(nn.Module):
    """What training uses of a target, with the attribute names of an HF causal LM:
    ``config`` (the text config), ``model.embed_tokens``, ``model.norm``, ``lm_head``,
    ``get_input_embeddings()``, ``get_output_embeddings()``. Frozen, eval mode."""

    def __init__(self, config, embed: torch.Tensor, norm: torch.Tensor, head: torch.Tensor | None):
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        self.model.norm = _RMSNorm(norm, float(config.rms_norm_eps))
        self.lm_head = nn.Linear(embed.shape[1], embed.shape[0], bias=False)
        # tied: the head IS the embedding (one tensor in memory)
        w = self.model.embed_tokens.weight if head is None else nn.Parameter(head, False)
        self.lm_head.weight = w
        self.tied = head is None
        self.eval().requires_grad_(False)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def nbytes(self) -> int:
        """Bytes of the tensors held (a tied tensor once)."""
        seen = {p.data_ptr(): p.numel() * p.element_size() for p in self.parameters()}
        return sum(seen.values())


def _weight_map(path: Path) -> dict[str, str]:
    """Tensor name -> safetensors file name of a model folder (index file or single file)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    single = path / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(
            f"{path} holds neither model.safetensors nor model.safetensors.index.json; the head "
            "is read by tensor name from safetensors (convert other formats with transformers)"
        )
    with safe_open(str(single), framework="pt") as f:
        return {k: single.name for k in f.keys()}


def head_tensor_names(names, tied: bool) -> dict[str, str | None]:
    """``{"embed", "norm", "head"}`` -> stored tensor name (``head`` None when tied) among
    ``names`` (see the module docstring).

    Raises:
        KeyError: no embedding, several candidates, or no final norm beside it.
    """
    top = [n for n in names if ".layers." not in n and not n.startswith("layers.")]
    embeds = sorted((n for n in top if n.endswith(_EMBED)), key=len)
    if not embeds or (len(embeds) > 1 and len(embeds[0]) == len(embeds[1])):
        raise KeyError(
            f"no single '*{_EMBED}' outside the decoder layers among the target's tensors "
            f"(found {embeds}); this architecture needs its names added to eagle3nb.target.head"
        )
    prefix = embeds[0][: -len(_EMBED)]
    if prefix + _NORM not in names:
        raise KeyError(f"final norm {prefix + _NORM!r} not among the target's tensors")
    heads = sorted((n for n in top if n == _HEAD or n.endswith("." + _HEAD)), key=len)
    return {
        "embed": embeds[0],
        "norm": prefix + _NORM,
        "head": None if tied or not heads else heads[0],
    }


def load_target_head(
    path: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> TargetHead:
    """Read the target's embedding, final norm and lm_head from ``path`` (a model folder with
    ``config.json``) into a :class:`TargetHead` of ``dtype`` on ``device``; no other tensor is read.

    Raises:
        FileNotFoundError: no safetensors in the folder.
        KeyError: the names cannot be found (see :func:`head_tensor_names`).
    """
    from safetensors import safe_open
    from transformers import AutoConfig

    path = Path(path)
    full = AutoConfig.from_pretrained(str(path), local_files_only=True)
    text = full.get_text_config() if hasattr(full, "get_text_config") else full
    tied = bool(getattr(text, "tie_word_embeddings", False) or full.tie_word_embeddings)
    wmap = _weight_map(path)
    names = head_tensor_names(wmap, tied)
    out = {}
    for role, name in names.items():
        if name is not None:
            with safe_open(str(path / wmap[name]), framework="pt", device="cpu") as f:
                out[role] = f.get_tensor(name).to(device=device, dtype=dtype)
    return TargetHead(text, out["embed"], out["norm"], out.get("head"))
