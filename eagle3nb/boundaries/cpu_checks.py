"""Config-dependent CPU limits (a target's text config -> why an engine version fails on it, or
None), measured on this machine kind (``../shared/reference/architectures.md`` section 4). The
version files of :mod:`eagle3nb.boundaries.versions` name which apply to which class and use."""

from __future__ import annotations

__all__ = ["mla_576", "yarn_factor", "chunk_128", "kimi_not_run"]


def _rope(cfg: dict) -> dict:
    return cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}


def mla_576(cfg: dict) -> str | None:
    """vLLM's CPU_MLA: a latent head of kv_lora_rank + qk_rope_head_dim = 576, and YaRN rope."""
    d = int(cfg.get("kv_lora_rank") or 0) + int(cfg.get("qk_rope_head_dim") or 0)
    if d != 576:
        return (
            f"its CPU MLA takes only a latent head of kv_lora_rank + qk_rope_head_dim = 576 (this "
            f"config: {d}; 'Head dimension {d} is not supported by MLA', "
            "layers/attention/mla_attention.py:1717, v1/attention/backends/mla/cpu_mla.py:61-64)"
        )
    if _rope(cfg).get("rope_type", _rope(cfg).get("type")) != "yarn":
        return (
            "without YaRN rope its CPU MLA matched HF only to 1.7e-2-4.7e-2 relative, and 1 of 4 "
            "greedy outputs differed (the DeepSeek-V3 twin without rope_scaling, CPU_MLA, float32; "
            "with YaRN, as DeepSeek-V3/Kimi ship it: 1.0e-6 and all equal)"
        )
    return None


def yarn_factor(cfg: dict) -> str | None:
    """vLLM gpt-oss reads ``rope_parameters['factor']``."""
    if "factor" not in _rope(cfg):
        return "it reads rope_parameters['factor'] (KeyError without it, models/gpt_oss.py:117)"
    return None


def chunk_128(cfg: dict) -> str | None:
    """vLLM Llama-4 on CPU: attention_chunk_size a multiple of the KV block size 128."""
    c = cfg.get("attention_chunk_size")
    if isinstance(c, int) and c % 128:
        return (
            f"attention_chunk_size {c} is not divisible by its CPU KV block size 128 "
            "(v1/attention/backends/utils.py:588)"
        )
    return None


def kimi_not_run(cfg: dict) -> str | None:
    """Kimi-K2.5 on vLLM CPU: never run here, so refused whatever its config."""
    return "it was not run on CPU here (vision tower, media processor), so its capture is unproven"
