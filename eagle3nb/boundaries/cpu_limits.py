"""What each engine version is measured not to run on CPU, per architecture class and per config
(:data:`CPU_LIMITS`, :data:`CPU_CONFIG_LIMITS`), read by preflight before any notebook runs
(tests/test_cpu_refusals.py). Measured on this machine kind (``../shared/reference/architectures.md``
sections 3 and 4); the id rules themselves are in :mod:`eagle3nb.boundaries.rules`.

vLLM 0.32 MLA targets (DeepSeek-V3, Kimi-K2) on CPU run on the reference ``CPU_MLA`` backend, which
eagle3nb's vLLM backend asks for (``attention_backend``;
``vllm/v1/attention/backends/registry.py:152``, ``v1/attention/backends/mla/cpu_mla.py``): on a CPU
with AMX tiles vLLM's own pick is ``AMX_MLA`` (``vllm/platforms/cpu.py:151-164``), whose weight
packing refuses float32 ("expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8",
``v1/attention/backends/mla/amx_mla.py:303``). Measured with ``CPU_MLA`` on the 12-layer DeepSeek-V3
twin (``twin:eagle3nb/data/deepseek_v3.config.json``, float32, 2026-12-04;
tests/engines/test_vllm_cpu_mla.py): capture equals HF's boundaries within 1.0e-6 relative, plain
greedy generation equals HF's; EAGLE-3 serving of the Llama head fails at engine build
(:data:`_DS_CPU_SERVE`), so it stays refused. The MLA head (``drafter_head: mla``,
:mod:`eagle3nb.drafter.mla`) is served: with CPU_MLA asked for the drafter too, target and drafter
share KV blocks of 16 (use ``serve_mla``: tests/engines/test_vllm_mla.py, served counters = the
simulator's). SGLang 0.5.23 cannot serve the MLA head on CPU (:data:`_SG_MLA_SERVE`).
"""

from __future__ import annotations

_DS_CPU_SG = (
    "its CPU MLA path runs silently wrong at small sizes (next-token log-probs 2.9 from HF) and "
    "crashes at real ones (layers/attention/torch_native_backend.py:160)"
)
# vLLM 0.32 EAGLE-3 serving of an MLA target on CPU, as measured (module docstring)
_DS_CPU_SERVE = (
    "with attention_backend CPU_MLA (which eagle3nb sets on CPU for MLA targets) plain generation "
    "and capture match HF, but serving a drafter fails at engine build with 'No common block size "
    "for 128 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])' (v1/worker/utils.py:555): the target's "
    "CPU_MLA takes KV blocks of exactly 16 (v1/attention/backends/mla/cpu_mla.py:67-72), the "
    "drafter's CPU_ATTN only multiples of 32 (v1/attention/backends/cpu_attn.py:65-66), and no "
    "option changes either (block_size 32: 'No common block size for 16'); AMX_MLA, vLLM's own "
    "pick on this CPU, takes no float32 weights (v1/attention/backends/mla/amx_mla.py:303)"
)
# SGLang 0.5.23 serving the MLA drafter head on CPU, as measured on the DeepSeek-V3 twin (2026-12-04)
_SG_MLA_SERVE = (
    "its MLA drafter class calls torch.cuda.synchronize() unconditionally when it takes the "
    "target's embedding (srt/models/kimi_k25_eagle3.py:415, set_embed): the scheduler dies at "
    "start with 'Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
    "multiprocessing, you must use the 'spawn' start method'; and " + _DS_CPU_SG
)
# (engine, version, class) -> {use: why it fails on CPU}; use "capture" (02a/02b), "serve" (04,
# the Llama head) or "serve_mla" (04, the MLA head: drafter_head mla).
# Measured on this machine kind (../shared/reference/architectures.md sections 3 and 4).
CPU_LIMITS: dict[tuple[str, str, str], dict[str, str]] = {
    ("sglang", "0.5.23", "DeepseekV3ForCausalLM"): {
        "capture": _DS_CPU_SG,
        "serve_mla": _SG_MLA_SERVE,
    },
    ("sglang", "0.5.23", "Kimi_K25ForConditionalGeneration"): {
        "capture": _DS_CPU_SG,
        "serve_mla": _SG_MLA_SERVE,
    },
    ("sglang", "0.5.23", "GptOssForCausalLM"): {
        "capture": "it fails at weight load (layers/moe/fused_moe_triton/layer.py:879 _load_w13)"
    },
    ("sglang", "0.5.23", "Llama4ForCausalLM"): {
        "capture": "float32 fails at o_proj (models/llama4.py:369, BFloat16 != float), bfloat16 in "
        "the native MoE (layers/moe/fused_moe_native.py:69 NotImplementedError)"
    },
    ("sglang", "0.5.23", "MiniMaxM2ForCausalLM"): {
        "capture": "its qk-norm kernel is CUDA-only (models/minimax_m2.py:205)"
    },
    ("vllm", "0.32.0", "MiniMaxM2ForCausalLM"): {
        "capture": "its CPU MoE router takes only softmax scoring, M2 uses sigmoid + bias "
        "(model_executor/layers/fused_moe/router/cpu_router.py:239)",
        "serve": "its CPU MoE router takes only softmax scoring (cpu_router.py:239)",
    },
    ("vllm", "0.32.0", "DeepseekV3ForCausalLM"): {"serve": _DS_CPU_SERVE},
    ("vllm", "0.32.0", "Kimi_K25ForConditionalGeneration"): {"serve": _DS_CPU_SERVE},
}


def cpu_limit(engine: str, version: str, arch: str, use: str) -> str | None:
    """Why ``engine`` at ``version`` cannot ``use`` ("capture", "serve" or "serve_mla") a target of class
    ``arch`` on CPU, as measured here; None where nothing is known to fail."""
    return CPU_LIMITS.get((engine, str(version).split("+")[0], arch), {}).get(use)


def _rope(cfg: dict) -> dict:
    return cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}


def _mla_576(cfg: dict) -> str | None:
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


def _yarn_factor(cfg: dict) -> str | None:
    if "factor" not in _rope(cfg):
        return "it reads rope_parameters['factor'] (KeyError without it, models/gpt_oss.py:117)"
    return None


def _chunk_128(cfg: dict) -> str | None:
    c = cfg.get("attention_chunk_size")
    if isinstance(c, int) and c % 128:
        return (
            f"attention_chunk_size {c} is not divisible by its CPU KV block size 128 "
            "(v1/attention/backends/utils.py:588)"
        )
    return None


def _kimi_not_run(cfg: dict) -> str | None:
    return "it was not run on CPU here (vision tower, media processor), so its capture is unproven"


# (engine, version, class) -> [(use, test(cfg) -> why it fails or None)]: limits that depend on the
# target's config, measured on this machine kind (../shared/reference/architectures.md section 4)
CPU_CONFIG_LIMITS = {
    # capture runs on CPU_MLA (module docstring), which needs the 576 latent head and YaRN
    # an MLA drafter runs on CPU_MLA beside the target: the same widths and YaRN needed
    ("vllm", "0.32.0", "DeepseekV3ForCausalLM"): [("capture", _mla_576), ("serve_mla", _mla_576)],
    ("vllm", "0.32.0", "Kimi_K25ForConditionalGeneration"): [
        ("capture", _kimi_not_run),
        ("serve_mla", _kimi_not_run),
    ],
    ("vllm", "0.32.0", "GptOssForCausalLM"): [("capture", _yarn_factor), ("serve", _yarn_factor)],
    ("vllm", "0.32.0", "Llama4ForCausalLM"): [("capture", _chunk_128), ("serve", _chunk_128)],
}


def cpu_config_limit(engine: str, version: str, arch: str, cfg: dict, use: str) -> str | None:
    """Why ``engine`` at ``version`` cannot ``use`` a target of class ``arch`` with this text
    config (``cfg``: config.json's text model) on CPU: :func:`cpu_limit`'s class-wide reason, else
    a config-dependent one (:data:`CPU_CONFIG_LIMITS`: vLLM MLA latent width and YaRN, gpt-oss
    YaRN factor, Llama-4 chunk size); None where nothing is known to fail."""
    why = cpu_limit(engine, version, arch, use)
    if why:
        return why
    for u, test in CPU_CONFIG_LIMITS.get((engine, str(version).split("+")[0], arch), []):
        if u == use and (why := test(cfg)):
            return why
    return None


# vLLM 0.32's CPU attention (CPU_ATTN) head sizes, v1/attention/backends/cpu_attn.py:69-70
# (get_supported_head_sizes); a drafter's layer runs on it as the target's do (issue 43 item 3)
VLLM_CPU_HEAD_SIZES = {"0.32.0": (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)}


def cpu_drafter_limit(engine: str, version: str, drafter_cfg: dict) -> str | None:
    """Why ``engine`` at ``version`` cannot run the drafter whose config.json is ``drafter_cfg``
    (eagle3nb's form: ``head_dim`` at the top level) on CPU: vLLM's CPU attention head sizes
    (:data:`VLLM_CPU_HEAD_SIZES`; an MLA drafter runs on CPU_MLA, :data:`CPU_CONFIG_LIMITS`); None
    where nothing is known to fail."""
    sizes = VLLM_CPU_HEAD_SIZES.get(str(version).split("+")[0]) if engine == "vllm" else None
    hd = drafter_cfg.get("head_dim")
    if sizes is None or hd is None or "kv_lora_rank" in drafter_cfg or int(hd) in sizes:
        return None
    return (
        f"the drafter's head_dim={hd} is not a head size of vLLM {version}'s CPU attention "
        f"{list(sizes)} (v1/attention/backends/cpu_attn.py:69-70, checked at engine build: "
        "'head_size not supported', v1/attention/backend.py:103, 300); serve it on GPU, or retrain with a head_dim it takes "
        "(draft_num_heads so that hidden_size / heads is one of them)"
    )
