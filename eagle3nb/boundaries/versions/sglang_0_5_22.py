"""SGLang 0.5.22's layer-id rules, read in the ``sglang-0.5.22-cp311`` wheel's sources
(``sglang/srt/...``; installed by ``bench/setup_engine_versions.sh``, which also extracts them).

The same rules as 0.5.23 at other lines. Explicit ids become ``layers_to_capture`` in each model's
``set_eagle3_layers_to_capture``, captured in the layer loop *before* layer i for i in that list
(``models/llama.py:485``):

- ``models/llama.py:922-934`` (Llama; Mistral ``mistral.py:30`` and Llama-4 text ``llama4.py:540``
  subclass it), ``qwen2.py:774-787``, ``qwen3.py:725-738``, ``glm4_moe.py:1274-1286``,
  ``minimax_m2.py:1071-1084``: ``[val + 1 for val in layer_ids]`` -> id L = boundary L+1; the final
  norm captures nothing (``llama.py:491-498``), so boundaries 1..N-1.
- ``qwen3_moe.py:1141-1156`` the same +1, and ``qwen2_moe.py:1160-1163`` sets a flag on
  ``self.layers[id]``: boundary N (layer index N) raises ``IndexError`` at engine start.
- ``deepseek_v2.py:3404-3419`` (DeepSeek-V3, and Kimi-K2.5 through ``kimi_k25.py:916-927``):
  ``if layer_ids and layer_ids[0] == 1: [val + 1 ...] else: list(layer_ids)`` -> +1 only when the
  first id is 1; layer inputs only (``deepseek_v2.py:3140``), so ids below N.
- ``gpt_oss.py:1336-1351``: unshifted if ``max(layer_ids) == num_layers`` else +1; the final norm
  captures at ``end_layer`` (``gpt_oss.py:714-737``), so id N-1 (or N) gives boundary N.
- ``gemma3_causal.py:634-672`` (rule ``917-926``; wrapper ``gemma3_mm.py:500-502``) appends the
  previous layer's MLP-branch output without the residual: refused (sglang PR #39286).
- ``mixtral.py:340`` has no ``set_eagle3_layers_to_capture``, which
  ``model_executor/model_runner_components/attention_backend_setup.py:54-55`` calls: refused.

What 0.5.22 lacks: the capture-only mode ``enable_return_aux_hidden_states`` (no such server
argument in the 0.5.22 wheel; 0.5.23 added it with its range check ``spec_aux_hidden_state.py:113-130``).
eagle3nb captures through SGLang's in-process ``ModelRunner`` instead
(``eagle3nb/engines/sglang_runner.py``, ``capture_route: runner``; ``auto`` picks it here): the recipe
``benchmark/one_batch.py`` is byte-identical to 0.5.23's, and the runner's other lines are the ones
read above plus ``forward_batch_info.py:937-972``, ``logits_processor.py:815-834`` and
``schedule_batch.py:2556-2567`` (cited in the runner's docstring).

EAGLE-3 serving on CPU (04) runs through eagle3nb's CPU speculative stand-ins, whose table for
0.5.22 is ``eagle3nb/engines/sglang_spec_versions.py``: the same seven ``sgl_kernel`` ops with the
same schemas as 0.5.23 (sglang-kernel 0.4.9's ``sgl_kernel/speculative.py`` and ``kvcacheio.py``
are 0.4.10's), called from other lines (0.5.22's ``kernels/ops/speculative/cache_locs.py`` lacks
0.5.23's ``assign_draft_cache_locs_contiguous_func``; the draft slots and the tree ops are called
inline at ``srt/speculative/eagle_worker_common.py:285`` and ``eagle_utils.py:263, 414``), and the
same patched ``torch_native`` attention (``torch_native_backend.py`` is 0.5.23's file). What was
measured through the runner, and the default job's served tau, is in
``bench/reference_engine_versions.json``.
"""

from __future__ import annotations

from eagle3nb.boundaries.version_file import VersionFile

__all__ = ["VERSION"]

_SG = "sglang/srt/models/"
_NO_N = "the final norm captures nothing, so boundary N never comes back (llama.py:491-498)"
_MOE_N = "boundary N (layer index N) raises IndexError at engine start, qwen2_moe.py:1160-1163"
_DS_N = "ids must lie below N: layer N has no capture (deepseek_v2.py:3140 captures layer inputs)"
_GEMMA = (
    "it captures each layer's MLP-branch output without the residual (0.7-1.7 relative from every "
    "boundary; upstream sglang PR #39286, open); set extract_engine: hf"
)
_MIXTRAL = (
    "no set_eagle3_layers_to_capture in models/mixtral.py: capture and EAGLE-3 serving raise "
    "AttributeError (model_executor/model_runner_components/attention_backend_setup.py:54-55 in "
    "SGLang 0.5.22); set extract_engine: hf"
)
_LLAMA = "llama.py:922-934"
_DS = "deepseek_v2.py:3404-3419"

_RULES = {
    "LlamaForCausalLM": ("plus1", 1, 1, _SG + _LLAMA, _NO_N),
    "MistralForCausalLM": ("plus1", 1, 1, _SG + "mistral.py:30 -> " + _LLAMA, _NO_N),
    "Qwen2ForCausalLM": ("plus1", 1, 1, _SG + "qwen2.py:774-787", _NO_N),
    "Qwen3ForCausalLM": ("plus1", 1, 1, _SG + "qwen3.py:725-738", _NO_N),
    "Qwen3MoeForCausalLM": (
        "plus1",
        1,
        1,
        _SG + "qwen3_moe.py:1141-1156, qwen2_moe.py:1160-1163",
        _MOE_N,
    ),
    "Glm4MoeForCausalLM": ("plus1", 1, 1, _SG + "glm4_moe.py:1274-1286", _NO_N),
    "Llama4ForCausalLM": ("plus1", 1, 1, _SG + "llama4.py:540 -> " + _LLAMA, _NO_N),
    "MiniMaxM2ForCausalLM": ("plus1", 1, 1, _SG + "minimax_m2.py:1071-1084", _NO_N),
    "DeepseekV3ForCausalLM": ("first_id_1", 0, 1, _SG + _DS, _DS_N),
    "Kimi_K25ForConditionalGeneration": (
        "first_id_1",
        0,
        1,
        _SG + "kimi_k25.py:916-927 -> " + _DS,
        _DS_N,
    ),
    "GptOssForCausalLM": ("unless_n", 0, 0, _SG + "gpt_oss.py:1336-1351, 714-737", ""),
    "MixtralForCausalLM": ("refused", 0, 0, _SG + "mixtral.py:340", _MIXTRAL),
    "Gemma3ForCausalLM": ("refused", 0, 0, _SG + "gemma3_causal.py:634-672, 917-926", _GEMMA),
    "Gemma3ForConditionalGeneration": (
        "refused",
        0,
        0,
        _SG + "gemma3_mm.py:500-502 -> gemma3_causal.py:634-672",
        _GEMMA,
    ),
}

VERSION = VersionFile(
    engine="sglang",
    version="0.5.22",
    read_from="the cp311 wheel sglang-0.5.22, ~/.cache/eagle3nb/engines/sglang-0.5.22 "
    "(bench/setup_engine_versions.sh, not CI)",
    rules=_RULES,
    flag_reads={  # llama_eagle3.py: 0.5.23's lines less one (0.5.23 added one import line)
        "norm_before_fc": "srt/models/llama_eagle3.py:172-181, 238-239",
        "fc_norm": "srt/models/llama_eagle3.py:183-195, 240-245",
        "norm_output": "srt/models/llama_eagle3.py:206, 266-267",
    },
)
