"""SGLang 0.5.17: its layer-id rules (the newest SGLang whose pin, torch 2.11.0, matches the offline GPU
image: ``../shared/reference/gpu_engines_h200.md``), read in the PyPI wheel
``sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl`` (``sglang/srt/models/...``; its Python files
are those of the cp311 wheel). 0.5.17 has no aux-capture API: eagle3nb captures through its
in-process ``ModelRunner`` (:mod:`eagle3nb.engines.sglang_runner`) and EAGLE-3 serving reads the
drafter's ids, both through each model's ``set_eagle3_layers_to_capture``.

- ``llama.py:885-897`` (Mistral ``mistral.py:30`` and Llama-4 text ``llama4.py:556`` subclass it),
  ``qwen2.py:747-760``, ``qwen3.py:688-701``, ``glm4_moe.py:1446-1458``, ``minimax_m2.py:1254-1267``:
  ``[val + 1 for val in layer_ids]``; the loop captures ``hidden_states + residual`` before layer i
  (``llama.py:434-437``) -> id L = boundary L + 1; the final norm captures nothing
  (``llama.py:454``), so boundaries 1..N-1. Measured on an H100 for Llama (SGLang ids 0-3 = HF
  boundaries 1-4, 2026-12-06, the reference above).
- ``qwen3_moe.py:1073-1088``: the same +1, through ``qwen2_moe.py:891-894``, which sets a flag on
  ``self.layers[id]``: boundary N (layer index N) raises ``IndexError``.
- ``deepseek_v2.py:3134-3149`` (DeepSeek-V3; Kimi-K2.5 ``kimi_k25.py:920-931``): +1 only when the
  first id is 1, else the ids as given; captured before layer i in the loop (``:2804-2826``).
- ``gpt_oss.py:1328-1343``: unshifted when ``max(layer_ids) == num_layers``, else +1; captured at
  ``start_layer`` and after layer i when i + 1 is listed (``:726-737``), so boundary N comes back.
- ``gemma3_causal.py:636-676`` (rule ``:920-929``; wrapper ``gemma3_mm.py:498-500``) appends
  ``hidden_states`` without the residual, as 0.5.23 does: refused.
- ``mixtral.py:338`` has no ``set_eagle3_layers_to_capture``: ``model_runner_components/
  attention_backend_setup.py:53-54`` (serving) and the runner route raise ``AttributeError``.

The rule bodies of llama, qwen2/3, qwen3_moe, deepseek_v2, glm4_moe and kimi_k25 are identical
0.5.14 -> 0.5.23 (``../shared/reference/streaming_and_versions.md`` 2d), so these rows equal
0.5.23's at 0.5.17's own lines.
"""

from __future__ import annotations

from eagle3nb.boundaries.version_file import VersionFile

__all__ = ["VERSION"]

_SG = "sglang/srt/models/"
_NO_N = "the final norm captures nothing (llama.py:454 in 0.5.17), so boundary N never comes back"
_MOE_N = "boundary N (layer index N) raises IndexError: qwen2_moe.py:891-894 flags self.layers[N]"
_DS_N = "layer N has no capture: the loop captures layer inputs (deepseek_v2.py:2804-2826)"
_MIXTRAL = (
    "no set_eagle3_layers_to_capture in models/mixtral.py (0.5.17): capture and EAGLE-3 serving "
    "raise AttributeError (model_runner_components/attention_backend_setup.py:53-54); set "
    "extract_engine: hf"
)
_LLAMA = "llama.py:885-897, 434-437"
_GEMMA = (
    "it captures each layer's MLP-branch output without the residual, as 0.5.23 does (upstream "
    "sglang PR #39286); set extract_engine: hf"
)

_RULES = {
    "LlamaForCausalLM": ("plus1", 1, 1, _SG + _LLAMA, _NO_N),
    "MistralForCausalLM": ("plus1", 1, 1, _SG + "mistral.py:30 -> " + _LLAMA, _NO_N),
    "Qwen2ForCausalLM": ("plus1", 1, 1, _SG + "qwen2.py:747-760", _NO_N),
    "Qwen3ForCausalLM": ("plus1", 1, 1, _SG + "qwen3.py:688-701", _NO_N),
    "Qwen3MoeForCausalLM": (
        "plus1",
        1,
        1,
        _SG + "qwen3_moe.py:1073-1088, qwen2_moe.py:891-894",
        _MOE_N,
    ),  # fmt: skip
    "Glm4MoeForCausalLM": ("plus1", 1, 1, _SG + "glm4_moe.py:1446-1458", _NO_N),
    "Llama4ForCausalLM": ("plus1", 1, 1, _SG + "llama4.py:556 -> " + _LLAMA, _NO_N),
    "MiniMaxM2ForCausalLM": ("plus1", 1, 1, _SG + "minimax_m2.py:1254-1267", _NO_N),
    "DeepseekV3ForCausalLM": ("first_id_1", 0, 1, _SG + "deepseek_v2.py:3134-3149", _DS_N),
    "Kimi_K25ForConditionalGeneration": (
        "first_id_1",
        0,
        1,
        _SG + "kimi_k25.py:920-931 -> deepseek_v2.py:3134-3149",
        _DS_N,
    ),
    "GptOssForCausalLM": ("unless_n", 0, 0, _SG + "gpt_oss.py:1328-1343, 726-737", ""),
    "MixtralForCausalLM": ("refused", 0, 0, _SG + "mixtral.py:338", _MIXTRAL),
    "Gemma3ForCausalLM": ("refused", 0, 0, _SG + "gemma3_causal.py:636-676, 920-929", _GEMMA),
    "Gemma3ForConditionalGeneration": (
        "refused",
        0,
        0,
        _SG + "gemma3_mm.py:498-500 -> gemma3_causal.py:636-676",
        _GEMMA,
    ),
}

VERSION = VersionFile(
    engine="sglang",
    version="0.5.17",
    read_from="the PyPI wheel sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl (not installed here)",
    rules=_RULES,
    # no CPU limits: not installed on CPU here (its torch pin, 2.11.0, is the GPU image's)
    # flag reads of its llama_eagle3.py not recorded: an export setting a variant flag refuses it
)
