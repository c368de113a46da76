"""Per SGLang version, what its CPU chain-drafting path (``speculative_eagle_topk`` 1) calls of the
``sgl_kernel`` ops eagle3nb stands in for (:mod:`eagle3nb.engines.sglang_spec_ops`): each op's
schema, the ``sgl_kernel`` wrapper that looks it up in ``torch.ops.sgl_kernel`` and the SGLang
lines that call it there; and the SGLang methods :mod:`eagle3nb.engines.sglang_spec_attn` patches.

Read in the wheels' sources (paths under site-packages) of SGLang 0.5.23 (CI's,
``.ci/setup_engines.sh``; sglang-kernel 0.4.10) and SGLang 0.5.22 (``bench/setup_engine_versions.sh``,
outside CI; sglang-kernel 0.4.9). What differs between them is *where* the ops are called, not what
is called: both kernels' ``sgl_kernel/speculative.py`` and ``sgl_kernel/kvcacheio.py`` are the same
file, so every schema (the wrapper's arguments, passed positionally in that order) is the same, and
the patched attention pieces (``srt/layers/attention/torch_native_backend.py``, byte-identical;
``DraftBackendFactory._create_backend``, same signature) are too. 0.5.23 moved the CPU branches of
the draft slots and the tree ops from ``srt/speculative/`` into ``sglang/kernels/ops/speculative/``
(``cache_locs.py`` ``assign_draft_cache_locs_contiguous_func``, ``spec_tree.py``
``build_tree_kernel_efficient_func`` / ``verify_tree_greedy_func``); 0.5.22 calls the same ops
inline from ``eagle_worker_common.py`` and ``eagle_utils.py``. Chain callers only: the tree path's
``move_accept_tokens_to_target_kvcache`` (0.5.22 ``srt/speculative/spec_utils.py:824``, 0.5.23
``spec_utils.py:897`` -> ``cache_locs.py:763``) is not reached with topk 1.

A version missing here is refused by name (:func:`table`). Adding one: read its wheel's lines,
add its :data:`TABLES` and :data:`PATCHED` entries; ``tests/engines/test_sglang_spec_cpu.py`` checks
each version's schemas against the stand-ins through torch's dispatcher, and each cited line in
that version's venv where it is installed. Stdlib only (engine side).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OpSite", "TABLES", "PATCHED", "VERSIONS", "table"]


@dataclass(frozen=True)
class OpSite:
    """One op as a SGLang version calls it on CPU.

    Attributes:
        schema: the op's arguments in ``torch.library`` schema form (returns ``()``).
        wrapper: ``file:line`` of the ``sgl_kernel`` wrapper that calls ``torch.ops.sgl_kernel.<op>``.
        callers: ``file:line`` of each line of SGLang's chain path that calls the wrapper.
    """

    schema: str
    wrapper: str
    callers: tuple[str, ...]


_SPEC, _KVIO = "sgl_kernel/speculative.py", "sgl_kernel/kvcacheio.py"
_SCHEMAS = {  # sgl_kernel/speculative.py:143-310 and kvcacheio.py:350-361, both kernels
    "copy_all_layer_kv_cache_cpu": "Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc",
    "assign_req_to_token_pool_cpu": "Tensor req_pool_indices, Tensor(a!) req_to_token, "
    "Tensor start_offset, Tensor end_offset, Tensor out_cache_loc, int pool_len",
    "assign_draft_cache_locs_contiguous_cpu": "Tensor req_pool_indices, Tensor req_to_token, "
    "Tensor seq_lens, Tensor(a!) out_cache_loc, int pool_len, int topk, int num_steps",
    "build_tree_kernel_efficient_cpu": "Tensor parent_list, Tensor selected_index, "
    "Tensor verified_seq_len, Tensor(a!) tree_mask, Tensor(b!) positions, "
    "Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, Tensor(e!) retrive_next_sibling, "
    "int topk, int depth, int draft_token_num, int tree_mask_mode",
    "assign_extend_cache_locs_cpu": "Tensor req_pool_indices, Tensor req_to_token, "
    "Tensor start_offset, Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len",
    "verify_tree_greedy_cpu": "Tensor(a!) predicts, Tensor(b!) accept_index, "
    "Tensor(c!) accept_token_num, Tensor candidates, Tensor retrive_index, "
    "Tensor retrive_next_token, Tensor retrive_next_sibling, Tensor target_predict",
    "fill_bonus_tokens_cpu": "Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, "
    "int accept_stride",
}
_WRAPPERS = {
    "copy_all_layer_kv_cache_cpu": _KVIO + ":350",
    "assign_req_to_token_pool_cpu": _SPEC + ":195",
    "assign_draft_cache_locs_contiguous_cpu": _SPEC + ":257",
    "build_tree_kernel_efficient_cpu": _SPEC + ":165",
    "assign_extend_cache_locs_cpu": _SPEC + ":277",
    "verify_tree_greedy_cpu": _SPEC + ":143",
    "fill_bonus_tokens_cpu": _SPEC + ":231",
}
_K, _S = "sglang/kernels/ops/", "sglang/srt/"
# op -> its chain callers, in the order the chain path calls the ops
_CALLERS = {
    "0.5.23": {
        "copy_all_layer_kv_cache_cpu": (_K + "kvcache/cache_move.py:191",),
        "assign_req_to_token_pool_cpu": (_S + "mem_cache/allocation.py:746",),
        "assign_draft_cache_locs_contiguous_cpu": (_K + "speculative/cache_locs.py:99",),
        "build_tree_kernel_efficient_cpu": (_K + "speculative/spec_tree.py:412",),
        "assign_extend_cache_locs_cpu": (_K + "speculative/cache_locs.py:740",),
        "verify_tree_greedy_cpu": (_K + "speculative/spec_tree.py:510",),
        "fill_bonus_tokens_cpu": (_K + "speculative/eagle.py:40",),
    },
    "0.5.22": {
        "copy_all_layer_kv_cache_cpu": (_K + "kvcache/cache_move.py:191",),
        "assign_req_to_token_pool_cpu": (_S + "mem_cache/allocation.py:739",),
        "assign_draft_cache_locs_contiguous_cpu": (_S + "speculative/eagle_worker_common.py:285",),
        "build_tree_kernel_efficient_cpu": (_S + "speculative/eagle_utils.py:263",),
        "assign_extend_cache_locs_cpu": (_K + "speculative/cache_locs.py:625",),
        "verify_tree_greedy_cpu": (_S + "speculative/eagle_utils.py:414",),
        "fill_bonus_tokens_cpu": (_K + "speculative/eagle.py:40",),
    },
}
TABLES: dict[str, dict[str, OpSite]] = {
    v: {op: OpSite(_SCHEMAS[op], _WRAPPERS[op], callers) for op, callers in ops.items()}
    for v, ops in _CALLERS.items()
}
_TN = _S + "layers/attention/torch_native_backend.py"
# what sglang_spec_attn patches or subclasses, and the scheduler entry sglang_spec_cpu wraps
PATCHED: dict[str, dict[str, str]] = {
    "0.5.23": {
        "DraftBackendFactory._create_backend": _S + "speculative/draft_utils.py:47",
        "TorchNativeAttnBackend.forward_extend": _TN + ":279",
        "TorchNativeAttnBackend._run_sdpa_forward_decode": _TN + ":176",
        "run_scheduler_process": _S + "managers/scheduler.py:6310",
    },
    "0.5.22": {
        "DraftBackendFactory._create_backend": _S + "speculative/draft_utils.py:47",
        "TorchNativeAttnBackend.forward_extend": _TN + ":279",
        "TorchNativeAttnBackend._run_sdpa_forward_decode": _TN + ":176",
        "run_scheduler_process": _S + "managers/scheduler.py:6076",
    },
}
VERSIONS = tuple(sorted(TABLES))  # the SGLang versions whose sources the stand-ins mirror


def table(version: str) -> dict[str, OpSite]:
    """The ops SGLang ``version`` calls on its CPU chain path, in call order.

    Raises:
        RuntimeError: ``version`` is not in :data:`VERSIONS` (names them and the fix).
    """
    if str(version) not in TABLES:
        raise RuntimeError(
            f"SGLang {version}: eagle3nb's CPU speculative stand-ins are written for SGLang "
            f"{' and '.join(VERSIONS)} only (op schemas, callers and patched methods read from "
            "those sources, eagle3nb/engines/sglang_spec_versions.py); install one of them "
            "(bash .ci/setup_engines.sh installs 0.5.23) or serve on a GPU"
        )
    return TABLES[str(version)]
