"""vLLM 0.32.0 (CPU build), as installed here (``~/.cache/eagle3nb/engines/vllm-0.32.0``, files under
``vllm/``): its layer-id rule per class, CPU limits and the drafter flags it reads.

``model_executor/models/interfaces.py:1601-1611`` ``_maybe_add_hidden_state`` appends
``hidden_states + residual`` before the loop (index ``start_layer``) and after each layer (index
idx+1) -> id L = boundary L, 0..N (``llama.py:427-441`` also Mistral and ``Llama4ForCausalLM``
``llama4.py:708``; ``qwen2.py:422-433``, Qwen3 ``qwen3.py:280``; ``qwen3_moe.py:505-515``;
``gpt_oss.py:527-533``; ``minimax_m2.py:403-410``). DeepSeek (``deepseek_v2.py:1545-1568``, end
``1586-1587``; Kimi-K2.5 ``kimi_k25.py:291``) adds ``hidden_states + residual`` before layer idx
with ``residual = None`` at layer 0 (``1525``): id 0 raises ``TypeError``. GLM-4.5
(``glm4_moe.py:534``) and Gemma-3 (``gemma3.py:367``, ``gemma3_mm.py:500``) and Mixtral
(``mixtral.py:375``) lack ``SupportsEagle3``: ``v1/worker/gpu_model_runner.py:5234-5238`` raises
(plain generation runs).

CPU: MLA targets (DeepSeek-V3, Kimi-K2) run on the reference ``CPU_MLA`` backend, which eagle3nb's
vLLM backend asks for (``attention_backend``; ``vllm/v1/attention/backends/registry.py:152``,
``v1/attention/backends/mla/cpu_mla.py``): on a CPU with AMX tiles vLLM's own pick is ``AMX_MLA``
(``vllm/platforms/cpu.py:151-164``), whose weight packing refuses float32 ("expect weight to be
bfloat16, float16, int8, fp8_e4m3 or uint8", ``v1/attention/backends/mla/amx_mla.py:303``).
Measured with ``CPU_MLA`` on the 12-layer DeepSeek-V3 twin (``twin:eagle3nb/data/
deepseek_v3.config.json``, float32, 2026-12-04; tests/engines/test_vllm_cpu_mla.py): capture equals
HF's boundaries within 1.0e-6 relative, plain greedy generation equals HF's; EAGLE-3 serving of the
Llama head fails at engine build (``_DS_CPU_SERVE``), so it stays refused. The MLA head
(``drafter_head: mla``) is served: with CPU_MLA asked for the drafter too, target and drafter share
KV blocks of 16 (tests/engines/test_vllm_mla.py, served counters = the simulator's).
Variant flags: ``model_executor/models/llama_eagle3.py`` (lines in ``flag_reads``).
"""

from __future__ import annotations

from eagle3nb.boundaries.cpu_checks import chunk_128, kimi_not_run, mla_576, yarn_factor
from eagle3nb.boundaries.version_file import VersionFile

__all__ = ["VERSION"]

_VL = "vllm/model_executor/models/"
_NO_EAGLE3 = (
    "the model class does not implement SupportsEagle3, so capture and EAGLE-3 serving raise "
    "'Model does not support EAGLE3 interface' (vllm/v1/worker/gpu_model_runner.py:5234-5238); "
    "turn vllm_extract off and leave vllm out of eval_engines, or serve with SGLang"
)
_MIXTRAL = (
    "no SupportsEagle3: capture and EAGLE-3 serving raise 'Model does not support EAGLE3 "
    "interface' (v1/worker/gpu_model_runner.py:5234-5238); turn vllm_extract off and leave vllm "
    "out of eval_engines"
)
_DS = _VL + "deepseek_v2.py:1525, 1545-1568, 1586-1587"
_DS0 = "id 0 raises TypeError: residual is None before layer 0 (deepseek_v2.py:1525, 1562)"
_DS_CPU_SERVE = (
    "with attention_backend CPU_MLA (which eagle3nb sets on CPU for MLA targets) plain generation "
    "and capture match HF, but serving a drafter fails at engine build with 'No common block size "
    "for 128 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])' (v1/worker/utils.py:555): the target's "
    "CPU_MLA takes KV blocks of exactly 16 (v1/attention/backends/mla/cpu_mla.py:67-72), the "
    "drafter's CPU_ATTN only multiples of 32 (v1/attention/backends/cpu_attn.py:65-66), and no "
    "option changes either (block_size 32: 'No common block size for 16'); AMX_MLA, vLLM's own "
    "pick on this CPU, takes no float32 weights (v1/attention/backends/mla/amx_mla.py:303)"
)

VERSION = VersionFile(
    engine="vllm",
    version="0.32.0",
    read_from="the installed CPU wheel, ~/.cache/eagle3nb/engines/vllm-0.32.0 (.ci/setup_engines.sh)",
    rules={
        "LlamaForCausalLM": ("same", 0, 0, _VL + "llama.py:427-441", ""),
        "MistralForCausalLM": ("same", 0, 0, _VL + "mistral.py:236 -> llama.py:427-441", ""),
        "Qwen2ForCausalLM": ("same", 0, 0, _VL + "qwen2.py:422-433", ""),
        "Qwen3ForCausalLM": ("same", 0, 0, _VL + "qwen3.py:280 -> qwen2.py:422-433", ""),
        "Qwen3MoeForCausalLM": ("same", 0, 0, _VL + "qwen3_moe.py:505-515", ""),
        "GptOssForCausalLM": ("same", 0, 0, _VL + "gpt_oss.py:527-533", ""),
        "Llama4ForCausalLM": ("same", 0, 0, _VL + "llama4.py:708 -> llama.py:427-441", ""),
        "MiniMaxM2ForCausalLM": ("same", 0, 0, _VL + "minimax_m2.py:403-410", ""),
        "DeepseekV3ForCausalLM": ("same", 1, 0, _DS, _DS0),
        "Kimi_K25ForConditionalGeneration": ("same", 1, 0, _VL + "kimi_k25.py:291 -> " + _DS, _DS0),
        "Glm4MoeForCausalLM": ("refused", 0, 0, _VL + "glm4_moe.py:534", _NO_EAGLE3),
        "MixtralForCausalLM": ("refused", 0, 0, _VL + "mixtral.py:375", _MIXTRAL),
        "Gemma3ForCausalLM": ("refused", 0, 0, _VL + "gemma3.py:367", _NO_EAGLE3),
        "Gemma3ForConditionalGeneration": ("refused", 0, 0, _VL + "gemma3_mm.py:500", _NO_EAGLE3),
    },
    cpu_limits={
        "MiniMaxM2ForCausalLM": {
            "capture": "its CPU MoE router takes only softmax scoring, M2 uses sigmoid + bias "
            "(model_executor/layers/fused_moe/router/cpu_router.py:239)",
            "serve": "its CPU MoE router takes only softmax scoring (cpu_router.py:239)",
        },
        "DeepseekV3ForCausalLM": {"serve": _DS_CPU_SERVE},
        "Kimi_K25ForConditionalGeneration": {"serve": _DS_CPU_SERVE},
    },
    cpu_config_limits={
        # capture runs on CPU_MLA (module docstring), which needs the 576 latent head and YaRN;
        # an MLA drafter runs on CPU_MLA beside the target: the same widths and YaRN needed
        "DeepseekV3ForCausalLM": [("capture", mla_576), ("serve_mla", mla_576)],
        "Kimi_K25ForConditionalGeneration": [
            ("capture", kimi_not_run),
            ("serve_mla", kimi_not_run),
        ],
        "GptOssForCausalLM": [("capture", yarn_factor), ("serve", yarn_factor)],
        "Llama4ForCausalLM": [("capture", chunk_128), ("serve", chunk_128)],
    },
    flag_reads={
        "norm_before_fc": "model_executor/models/llama_eagle3.py:184-188, 405-407",
        "fc_norm": "model_executor/models/llama_eagle3.py:231-240, 409-416",
        "norm_output": "model_executor/models/llama_eagle3.py:252, 285-286",
    },
)
