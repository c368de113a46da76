"""SGLang 0.5.23, as installed here (``~/.cache/eagle3nb/engines/sglang-0.5.23``, files under
``sglang/srt/``): its layer-id rule per class, CPU limits and the drafter flags it reads.

Explicit ids become ``layers_to_capture`` in each model's ``set_eagle3_layers_to_capture``, captured
in the layer loop *before* layer i for i in that list; the capture-only mode refuses ids >= N
(``model_runner_components/spec_aux_hidden_state.py:113-130``) and negative or duplicate ids
(``arg_groups/validation_hook.py``):

- ``models/llama.py:929-941`` (Llama; Mistral ``mistral.py:33`` and Llama-4 text ``llama4.py:546``
  subclass it), ``qwen2.py:781-794``, ``qwen3.py:778-791``, ``glm4_moe.py:1269-1281``,
  ``minimax_m2.py:1067-1080``: ``[val + 1 for val in layer_ids]`` -> id L = boundary L+1; the final
  norm captures nothing (``llama.py:497-499``), so boundaries 1..N-1.
- ``qwen3_moe.py:1128-1143`` the same +1, but ``qwen2_moe.py:1153-1156`` sets a flag on
  ``self.layers[id]``: boundary N (layer index N) raises ``IndexError`` at engine start.
- ``deepseek_v2.py:3458-3473`` (DeepSeek-V3, and Kimi-K2.5 through ``kimi_k25.py:928-941``):
  ``if layer_ids and layer_ids[0] == 1: [val + 1 ...] else: list(layer_ids)`` -> +1 **only when the
  first id is 1**, otherwise ids are boundaries (measured: ids [0..4] -> b0..b4, [1..4] -> b2..b5).
- ``gpt_oss.py:1337-1352``: unshifted if ``max(layer_ids) == num_layers`` else +1; the final norm
  captures at ``end_layer`` (``gpt_oss.py:722-739``), so id N-1 (or N) gives boundary N.
- ``gemma3_causal.py:634-672`` (rule ``917-926``; wrapper ``gemma3_mm.py:543-545``) appends the
  previous layer's MLP-branch output without the residual: refused (sglang PR #39286).
- ``mixtral.py:341`` (``MixtralForCausalLM``, also eagle3nb's MoE copy of a Llama) has no
  ``set_eagle3_layers_to_capture``: ``model_runner_components/attention_backend_setup.py:55-61``
  raises, so capture and EAGLE-3 serving are refused (plain generation runs).

CPU limits: measured on this machine kind (``../shared/reference/architectures.md`` sections 3, 4).
Variant flags: ``srt/models/llama_eagle3.py`` (lines in :data:`VERSION`'s ``flag_reads``).
"""

from __future__ import annotations

from eagle3nb.boundaries.version_file import VersionFile

__all__ = ["VERSION"]

_SG = "sglang/srt/models/"
_GEMMA = (
    "it captures each layer's MLP-branch output without the residual (0.7-1.7 relative from "
    "every boundary; upstream sglang PR #39286, open); vLLM 0.32 has no EAGLE-3 support for "
    "Gemma-3 either, so set extract_engine: hf"
)
_MIXTRAL = (  # its plain generation also takes head_dim = hidden / heads (mixtral.py:151)
    "no set_eagle3_layers_to_capture in models/mixtral.py: capture and EAGLE-3 serving raise "
    "(model_runner_components/attention_backend_setup.py:55-61); set extract_engine: hf, and "
    "generate_engine hf or vllm when the config sets its own head_dim (eagle3nb's MoE copy)"
)
_NO_N = "the final norm captures nothing, so boundary N never comes back"
_MOE_N = "boundary N (layer index N) raises IndexError at engine start, qwen2_moe.py:1156"
_DS_N = "ids must lie below N (spec_aux_hidden_state.py:113-130) and layer N has no capture"
_DS_CPU = (
    "its CPU MLA path runs silently wrong at small sizes (next-token log-probs 2.9 from HF) and "
    "crashes at real ones (layers/attention/torch_native_backend.py:160)"
)
# serving the MLA drafter head on CPU, as measured on the DeepSeek-V3 twin (2026-12-04)
_MLA_SERVE = (
    "its MLA drafter class calls torch.cuda.synchronize() unconditionally when it takes the "
    "target's embedding (srt/models/kimi_k25_eagle3.py:415, set_embed): the scheduler dies at "
    "start with 'Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
    "multiprocessing, you must use the 'spawn' start method'; and " + _DS_CPU
)

VERSION = VersionFile(
    engine="sglang",
    version="0.5.23",
    read_from="the installed wheel, ~/.cache/eagle3nb/engines/sglang-0.5.23 (.ci/setup_engines.sh)",
    rules={
        "LlamaForCausalLM": ("plus1", 1, 1, _SG + "llama.py:929-941", _NO_N),
        "MistralForCausalLM": ("plus1", 1, 1, _SG + "mistral.py:33 -> llama.py:929-941", _NO_N),
        "Qwen2ForCausalLM": ("plus1", 1, 1, _SG + "qwen2.py:781-794", _NO_N),
        "Qwen3ForCausalLM": ("plus1", 1, 1, _SG + "qwen3.py:778-791", _NO_N),
        "Qwen3MoeForCausalLM": (
            "plus1",
            1,
            1,
            _SG + "qwen3_moe.py:1128-1143, qwen2_moe.py:1153-1156",
            _MOE_N,
        ),
        "Glm4MoeForCausalLM": ("plus1", 1, 1, _SG + "glm4_moe.py:1269-1281", _NO_N),
        "Llama4ForCausalLM": ("plus1", 1, 1, _SG + "llama4.py:546 -> llama.py:929-941", _NO_N),
        "MiniMaxM2ForCausalLM": ("plus1", 1, 1, _SG + "minimax_m2.py:1067-1080", _NO_N),
        "DeepseekV3ForCausalLM": ("first_id_1", 0, 1, _SG + "deepseek_v2.py:3458-3473", _DS_N),
        "Kimi_K25ForConditionalGeneration": (
            "first_id_1",
            0,
            1,
            _SG + "kimi_k25.py:928-941 -> deepseek_v2.py:3458-3473",
            _DS_N,
        ),
        "GptOssForCausalLM": ("unless_n", 0, 0, _SG + "gpt_oss.py:1337-1352, 722-739", ""),
        "MixtralForCausalLM": ("refused", 0, 0, _SG + "mixtral.py:341", _MIXTRAL),
        "Gemma3ForCausalLM": ("refused", 0, 0, _SG + "gemma3_causal.py:634-672, 917-926", _GEMMA),
        "Gemma3ForConditionalGeneration": (
            "refused",
            0,
            0,
            _SG + "gemma3_mm.py:543-545 -> gemma3_causal.py:634-672",
            _GEMMA,
        ),
    },
    cpu_limits={
        "DeepseekV3ForCausalLM": {"capture": _DS_CPU, "serve_mla": _MLA_SERVE},
        "Kimi_K25ForConditionalGeneration": {"capture": _DS_CPU, "serve_mla": _MLA_SERVE},
        "GptOssForCausalLM": {
            "capture": "it fails at weight load (layers/moe/fused_moe_triton/layer.py:879 _load_w13)"
        },
        "Llama4ForCausalLM": {
            "capture": "float32 fails at o_proj (models/llama4.py:369, BFloat16 != float), "
            "bfloat16 in the native MoE (layers/moe/fused_moe_native.py:69 NotImplementedError)"
        },
        "MiniMaxM2ForCausalLM": {
            "capture": "its qk-norm kernel is CUDA-only (models/minimax_m2.py:205)"
        },
    },
    flag_reads={
        "norm_before_fc": "srt/models/llama_eagle3.py:173-182, 239-240",
        "fc_norm": "srt/models/llama_eagle3.py:184-196, 241-246",
        "norm_output": "srt/models/llama_eagle3.py:207, 267-268",
    },
)
