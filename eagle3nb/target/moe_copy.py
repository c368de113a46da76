"""A dense Llama target re-expressed as a Mixtral MoE that computes the same function (no download).

Every decoder layer's MLP becomes ``num_experts`` experts that are exact copies of it, routed by a
seeded random router (rows equal in groups of ``top_k``, see :func:`moe_copy_weights`) with
top-``top_k`` softmax weights renormalised to sum to 1 (Mixtral always
renormalises: HF ``models/mixtral/modeling_mixtral.py`` ``MixtralTopKRouter``; vLLM
``model_executor/models/mixtral.py`` ``renormalize=True``). So each token's MoE output is
``sum_k w_k * mlp(x) = mlp(x)`` (up to float rounding of ``sum_k w_k``), while the router really picks
different experts per token. Attention, norms, embeddings and head are copied unchanged:
``MixtralForCausalLM`` keeps Llama's attention (q/k/v/o without bias, rotate-half rope, RMSNorm).

Weights are written in the per-expert layout Mixtral checkpoints ship in
(``model.layers.{i}.block_sparse_moe.gate.weight`` ``[E, H]``,
``...block_sparse_moe.experts.{e}.w1|w2|w3.weight`` = gate/down/up projections), which
transformers (``conversion_mapping.py`` "mixtral"), vLLM and SGLang all load.

Names in :data:`DERIVED` are built on first use by :func:`eagle3nb.target.models.resolve_model`
into :func:`cache_dir` (``$EAGLE3NB_CACHE/models``, default ``~/.cache/eagle3nb/models``), so a
params file can say ``model: stories260K-hd32-mixtral``. CLI:
``python -m eagle3nb.target.moe_copy SRC_FOLDER DST [--experts 4] [--top-k 2] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3nb.target.derived import publish_derived_copy

__all__ = ["DERIVED", "cache_dir", "moe_copy_config", "moe_copy_weights", "write_moe_copy"]

# derived model name -> (source model name, num_experts, top_k, router seed)
DERIVED = {"stories260K-hd32-mixtral": ("stories260K-hd32", 4, 2, 0)}
_MLP = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}


def cache_dir() -> Path:
    """Folder derived models are written to: ``$EAGLE3NB_CACHE/models`` (default
    ``~/.cache/eagle3nb/models``)."""
    return Path(os.environ.get("EAGLE3NB_CACHE", "~/.cache/eagle3nb")).expanduser() / "models"


def moe_copy_config(cfg: dict, num_experts: int, top_k: int) -> dict:
    """The Mixtral ``config.json`` dict for a Llama ``cfg`` (attention, widths, rope, vocab kept).

    Raises:
        ValueError: ``cfg`` is not a ``LlamaForCausalLM`` config, or its attention has biases or its
            MLP is not SiLU-gated (Mixtral has neither), or ``top_k`` not in ``1..num_experts``.
    """
    arch = list(cfg.get("architectures") or [])
    if arch != ["LlamaForCausalLM"]:
        raise ValueError(f"architectures={arch}: a MoE copy is made from a LlamaForCausalLM config")
    if cfg.get("attention_bias") or cfg.get("mlp_bias") or cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"attention_bias={cfg.get('attention_bias')}, mlp_bias={cfg.get('mlp_bias')}, "
            f"hidden_act={cfg.get('hidden_act')!r}: Mixtral has no biases and a SiLU-gated MLP, so "
            "this Llama has no exact Mixtral copy"
        )
    if not (isinstance(num_experts, int) and 1 <= top_k <= num_experts):
        raise ValueError(
            f"num_experts={num_experts}, top_k={top_k}: need 1 <= top_k <= num_experts"
        )
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
            "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_parameters",
            "initializer_range", "tie_word_embeddings", "bos_token_id", "eos_token_id",
            "pad_token_id", "attention_dropout", "torch_dtype")  # fmt: skip
    out = {k: cfg[k] for k in keep if k in cfg}
    out.update(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=int(num_experts),
        num_experts_per_tok=int(top_k),
        sliding_window=None,
        router_jitter_noise=0.0,
        output_router_logits=False,
    )
    return out


def moe_copy_weights(
    src: dict[str, torch.Tensor], n_layers: int, num_experts: int, top_k: int = 2, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Mixtral tensors from a Llama state dict: each ``mlp.{gate,up,down}_proj`` copied into every
    expert (``w1``/``w3``/``w2``), a router ``[num_experts, H]`` drawn with ``seed`` (std 1,
    centred over groups) in groups of ``top_k`` equal rows, everything else unchanged.

    Equal rows make each token's top-k one whole group with softmax weights exactly ``1/top_k``
    each (for ``top_k`` a power of 2 the weighted sum of the copies is then the dense MLP output to
    the last bit); which group wins differs from token to token, so tokens are really routed to
    different experts.

    Raises:
        ValueError: a layer's MLP tensor is missing from ``src``.
    """
    out = {k: v for k, v in src.items() if ".mlp." not in k}
    g = torch.Generator().manual_seed(int(seed))
    for i in range(n_layers):
        pre = f"model.layers.{i}"
        need = [f"{pre}.mlp.{n}.weight" for n in _MLP]
        missing = [k for k in need if k not in src]
        if missing:
            raise ValueError(
                f"source weights lack {missing}: not a Llama checkpoint of {n_layers} layers"
            )
        h = src[need[0]].shape[1]
        rows = torch.randn(-(-num_experts // top_k), h, generator=g, dtype=torch.float32)
        rows = rows - rows.mean(0) if rows.shape[0] > 1 else rows  # no group favoured by the mean
        router = rows.repeat_interleave(top_k, dim=0)[:num_experts]
        out[f"{pre}.block_sparse_moe.gate.weight"] = router.to(src[need[0]].dtype)
        for name, w in _MLP.items():
            t = src[f"{pre}.mlp.{name}.weight"]
            for e in range(num_experts):
                out[f"{pre}.block_sparse_moe.experts.{e}.{w}.weight"] = t.clone().contiguous()
    return out


def write_moe_copy(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    num_experts: int = 4,
    top_k: int = 2,
    seed: int = 0,
) -> Path:
    """Write the Mixtral copy of the Llama folder ``src`` to ``dst`` (config, weights, tokenizer
    files, ``moe_copy.json`` naming the source and its sha256). Built in a temp folder and renamed
    into place; an existing ``dst`` is kept (a concurrent writer's result wins). Returns ``dst``.

    Raises:
        FileNotFoundError: ``src`` has no config.json or model.safetensors.
        ValueError: see :func:`moe_copy_config` and :func:`moe_copy_weights`.
    """
    src, dst = Path(src), Path(dst)
    if (dst / "config.json").is_file():
        return dst
    if not (src / "config.json").is_file() or not (src / "model.safetensors").is_file():
        raise FileNotFoundError(f"{src}: a MoE copy needs config.json and model.safetensors there")
    cfg = json.loads((src / "config.json").read_text())
    new_cfg = moe_copy_config(cfg, num_experts, top_k)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        sd = {k: f.get_tensor(k) for k in f.keys()}
    weights = moe_copy_weights(sd, int(cfg["num_hidden_layers"]), num_experts, top_k, seed)
    info = {"num_experts": num_experts, "top_k": top_k, "router_seed": seed,
            "made_by": "eagle3nb.target.moe_copy"}  # fmt: skip
    return publish_derived_copy(src, dst, weights, new_cfg, "moe_copy.json", info)


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m eagle3nb.target.moe_copy SRC_FOLDER DST [--experts E] [--top-k K] [--seed S]``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", help="Llama model folder (config.json, model.safetensors, tokenizer)")
    ap.add_argument("dst", help="folder to write the Mixtral copy to")
    ap.add_argument("--experts", type=int, default=4, help="experts per layer")
    ap.add_argument("--top-k", type=int, default=2, help="experts per token")
    ap.add_argument("--seed", type=int, default=0, help="router seed")
    a = ap.parse_args(argv)
    print(write_moe_copy(a.src, a.dst, a.experts, a.top_k, a.seed))


if __name__ == "__main__":
    main()
