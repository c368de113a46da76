"""vLLM 0.26.0: its layer-id rules, drafter flags (no CPU limits measured: the GPU host's engine;
the newest vLLM whose pin, torch 2.11.0, matches the offline H200
image: ``../shared/reference/gpu_engines_h200.md``), read in its sources (the PyPI sdist
``vllm-0.26.0.tar.gz``, sha256 23e9fa19...8502, whose files are byte-identical to the x86_64
wheel's; ``.ci/setup_engines.sh`` extracts them for the tests).

``vllm/model_executor/models/interfaces.py:1343-1359`` ``EagleModelMixin._maybe_add_hidden_state``
appends ``hidden_states + residual`` (or ``hidden_states`` when the residual is None) when the
index is in ``aux_hidden_state_layers``. The models call it once before the layer loop at index 0
(``start_layer`` in qwen3_moe.py, gpt_oss.py: the same without pipeline parallelism) and after
layer idx at idx+1 -> id L = boundary L, 0..N, as in 0.32: ``llama.py:419-428`` (also
``MistralForCausalLM(LlamaForCausalLM)`` ``mistral.py:230`` and ``Llama4ForCausalLM`` ``llama4.py:709``),
``qwen2.py:415-422`` (Qwen3: ``Qwen3Model(Qwen2Model)`` ``qwen3.py:264``), ``qwen3_moe.py:503-515``,
``gpt_oss.py:349-355``, ``minimax_m2.py:397-405``. DeepSeek (``deepseek_v2.py:1450-1475``) adds
``hidden_states + residual`` *before* layer idx and ``end_layer`` after the loop (``1495-1496``),
with ``residual = None`` at layer 0 (``1430``): id 0 raises ``TypeError``; Kimi-K2.5 builds its
language model as ``DeepseekV2ForCausalLM`` (``kimi_k25.py:371-375``). GLM-4.5
(``glm4_moe.py:528``), Gemma-3 (``gemma3.py:380``, ``gemma3_mm.py:470-472``) and Mixtral
(``mixtral.py:376``) lack ``SupportsEagle3``: ``v1/worker/gpu_model_runner.py:5428-5432`` raises.
"""

from __future__ import annotations

from eagle3nb.boundaries.version_file import VersionFile

__all__ = ["VERSION"]

_VL = "vllm/model_executor/models/"
_NO_EAGLE3 = (
    "the model class does not implement SupportsEagle3, so capture and EAGLE-3 serving raise "
    "'Model does not support EAGLE3 interface' (vllm/v1/worker/gpu_model_runner.py:5428-5432 in "
    "vLLM 0.26.0); turn vllm_extract off and leave vllm out of eval_engines, or serve with SGLang"
)
_DS0 = "id 0 raises TypeError: residual is None before layer 0 (deepseek_v2.py:1430, 1469)"
_DS = _VL + "deepseek_v2.py:1430, 1450-1475, 1495-1496"
_LLAMA = "llama.py:419-428"

_RULES = {
    "LlamaForCausalLM": ("same", 0, 0, _VL + _LLAMA, ""),
    "MistralForCausalLM": ("same", 0, 0, _VL + "mistral.py:230 -> " + _LLAMA, ""),
    "Qwen2ForCausalLM": ("same", 0, 0, _VL + "qwen2.py:415-422", ""),
    "Qwen3ForCausalLM": ("same", 0, 0, _VL + "qwen3.py:264 -> qwen2.py:415-422", ""),
    "Qwen3MoeForCausalLM": ("same", 0, 0, _VL + "qwen3_moe.py:503-515", ""),
    "GptOssForCausalLM": ("same", 0, 0, _VL + "gpt_oss.py:349-355", ""),
    "Llama4ForCausalLM": ("same", 0, 0, _VL + "llama4.py:709 -> " + _LLAMA, ""),
    "MiniMaxM2ForCausalLM": ("same", 0, 0, _VL + "minimax_m2.py:397-405", ""),
    "DeepseekV3ForCausalLM": ("same", 1, 0, _DS, _DS0),
    "Kimi_K25ForConditionalGeneration": (
        "same",
        1,
        0,
        _VL + "kimi_k25.py:290-297, 371-375 -> " + _DS,
        _DS0,
    ),
    "Glm4MoeForCausalLM": ("refused", 0, 0, _VL + "glm4_moe.py:528", _NO_EAGLE3),
    "MixtralForCausalLM": ("refused", 0, 0, _VL + "mixtral.py:376", _NO_EAGLE3),
    "Gemma3ForCausalLM": ("refused", 0, 0, _VL + "gemma3.py:380", _NO_EAGLE3),
    "Gemma3ForConditionalGeneration": ("refused", 0, 0, _VL + "gemma3_mm.py:470-472", _NO_EAGLE3),
}

VERSION = VersionFile(
    engine="vllm",
    version="0.26.0",
    read_from="the PyPI sdist vllm-0.26.0.tar.gz (= the x86_64 wheel's files; .ci/setup_engines.sh)",
    rules=_RULES,
    flag_reads={  # read from the 0.26.0 wheel (pip download vllm==0.26.0 --no-deps)
        "norm_before_fc": "model_executor/models/llama_eagle3.py:150-152, 367-368",
        "fc_norm": "model_executor/models/llama_eagle3.py:197-206, 370-376",
        "norm_output": "model_executor/models/llama_eagle3.py:218, 251-252",
    },
)
