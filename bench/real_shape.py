"""Random-weight targets of a real shape, built at run time from configs (nothing is downloaded).

- :func:`llama31_8b_config`: Llama-3.1-8B's config.json (hidden 4096, 32 layers, 32 heads, 8 kv
  heads, intermediate 14336, vocab 128256, rope_theta 500000, llama3 rope scaling).
- :func:`qwen3_moe_config`: Qwen3-30B-A3B's config.json (hidden 2048, 128 experts, 8 active,
  moe_intermediate 768, vocab 151936) cut in depth (48 layers in the original) so it fits and runs
  quickly.
- :func:`build_tokenizer`: a byte-level tokenizer of exactly ``vocab_size`` ids, made with the
  ``tokenizers`` library: any text encodes (one id per byte, no merges) and every id decodes
  (ids past the bytes are tokens ``<xN>``), so HF and vLLM both load the folder.
- :func:`write_target`: config.json, generation_config.json and the tokenizer in a folder, with
  random weights (``weights="random"``: the HF model made on ``device`` from the config, seeded,
  saved as safetensors) or without (``weights="none"``: for vLLM's ``load_format="dummy"`` and HF
  :func:`hf_from_config`, which is what the GPU benches use: no 16 GB write).

Random weights give a near-uniform next-token distribution: speed and memory are the real
shape's, acceptance is not (a drafter's tau stays near 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = [
    "SHAPES",
    "llama31_8b_config",
    "qwen3_moe_config",
    "build_tokenizer",
    "write_target",
    "hf_from_config",
]

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def llama31_8b_config(**over) -> dict:
    """Llama-3.1-8B's config.json fields (``over`` replaces any, e.g. ``num_hidden_layers``)."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    }
    return {**cfg, **over}


def qwen3_moe_config(num_hidden_layers: int = 8, **over) -> dict:
    """Qwen3-30B-A3B's config.json fields, ``num_hidden_layers`` of its 48 kept."""
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": int(num_hidden_layers),
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
    }
    return {**cfg, **over}


SHAPES = {"llama-3.1-8b": llama31_8b_config, "qwen3-moe": qwen3_moe_config}


def build_tokenizer(vocab_size: int, bos_id: int, eos_id: int):
    """A byte-level BPE tokenizer (no merges) with exactly ``vocab_size`` ids: the 256 byte tokens
    first, ``BOS`` at ``bos_id`` and ``EOS`` at ``eos_id`` (special), ``<xN>`` at every other id.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` (bos/eos set, no chat template).

    Raises:
        ValueError: ``vocab_size`` below 258, or bos/eos ids outside 256..vocab_size-1 or equal.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 258 or not (256 <= bos_id < vocab_size and 256 <= eos_id < vocab_size):
        raise ValueError(
            f"vocab_size={vocab_size}, bos_id={bos_id}, eos_id={eos_id}: need vocab_size >= 258 "
            "and bos/eos ids in 256..vocab_size-1 (ids 0..255 are the bytes)"
        )
    if bos_id == eos_id:
        raise ValueError(f"bos_id == eos_id == {bos_id}: give two ids")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 printable stand-ins of bytes
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for i in range(256, vocab_size):
        vocab[{bos_id: BOS, eos_id: EOS}.get(i, f"<x{i}>")] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)
    # a completion prompt starts with BOS (as Llama's tokenizer adds it)
    from tokenizers import processors

    fast.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return fast


def _config_object(cfg: dict):
    import copy

    from transformers import AutoConfig

    # deep copy: transformers rewrites a rope_scaling dict in place (adds rope_theta)
    kw = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in ("model_type", "architectures")}
    c = AutoConfig.for_model(cfg["model_type"], **kw)
    c.architectures = list(cfg["architectures"])
    return c


def write_target(
    cfg: dict,
    out_dir: str | Path,
    weights: str = "none",
    device: str = "cpu",
    dtype: str = "bfloat16",
    seed: int = 0,
) -> Path:
    """A model folder of ``cfg``: config.json (``torch_dtype`` ``dtype``), generation_config.json,
    the tokenizer of :func:`build_tokenizer`, and with ``weights="random"`` the HF model made on
    ``device`` by :func:`hf_from_config` and saved as safetensors. Written to a temp folder,
    then renamed; an existing complete folder of the same config is reused.

    Returns:
        The folder.

    Raises:
        ValueError: ``weights`` not ``none`` / ``random``.
    """
    import shutil

    from transformers import GenerationConfig

    if weights not in ("none", "random"):
        raise ValueError(f"weights={weights!r}: use none (dummy-load engines) or random")
    out = Path(out_dir)
    stamp = json.dumps({"cfg": cfg, "weights": weights, "dtype": dtype, "seed": seed}, sort_keys=1)
    if (out / ".complete").is_file() and (out / ".complete").read_text() == stamp:
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    c = _config_object(cfg)
    c.dtype = dtype
    if weights == "random":
        hf_from_config(cfg, device, dtype, seed).save_pretrained(tmp, safe_serialization=True)
    c.save_pretrained(tmp)
    GenerationConfig(
        bos_token_id=cfg["bos_token_id"], eos_token_id=cfg["eos_token_id"]
    ).save_pretrained(tmp)
    build_tokenizer(cfg["vocab_size"], cfg["bos_token_id"], cfg["eos_token_id"]).save_pretrained(
        tmp
    )
    (tmp / ".complete").write_text(stamp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def hf_from_config(cfg: dict, device: str = "cpu", dtype: str = "bfloat16", seed: int = 0):
    """The HF model of ``cfg`` with random weights (transformers' own init, seeded), made directly
    on ``device`` in ``dtype``, eval mode, grads off, SDPA attention."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(
            _config_object(cfg), dtype=dt, attn_implementation="sdpa"
        )
    return m.eval().requires_grad_(False)
