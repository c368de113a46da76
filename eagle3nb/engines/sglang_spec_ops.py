"""Torch stand-ins for the CUDA-only ``sgl_kernel`` ops of SGLang's CPU chain-drafting path: one
function per op, with the op's own arguments (in the schema order of
:mod:`eagle3nb.engines.sglang_spec_versions`), writing its outputs in place as the op does.

Each docstring names the SGLang code it mirrors and the lines that call it on CPU in each version
the stand-ins serve (0.5.23, 0.5.22; the same schema in both: :mod:`sglang_spec_versions` says
why). :mod:`eagle3nb.engines.sglang_spec_cpu` registers them and gates the install. Stdlib at module
level, torch inside the functions that need more than tensor methods (engine side).
"""

from __future__ import annotations

import ctypes

# in the order the chain path calls them: sglang_spec_cpu.OPS is read from this list
__all__ = [
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "build_tree_kernel_efficient_cpu",
    "assign_extend_cache_locs_cpu",
    "verify_tree_greedy_cpu",
    "fill_bonus_tokens_cpu",
]


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """Copy KV rows ``src_loc[i] -> tgt_loc[i]`` in every buffer, all reads before the writes.

    Mirrors ``copy_all_layer_kv_cache_tiled`` / ``copy_all_layer_kv_cache_func``
    (``sglang/kernels/ops/kvcache/cache_move.py:146-191``); called once per KV pool at start
    (``srt/mem_cache/memory_pool.py`` ``_init_kv_copy_and_warmup``: slot 0 -> slot 0). Called at
    ``sglang/kernels/ops/kvcache/cache_move.py:191`` in 0.5.23 and 0.5.22 alike.

    Args:
        data_ptrs: int64 ``[n_buffers]`` raw addresses of contiguous CPU buffers (each layer's K
            and V). strides: int64 ``[n_buffers]`` bytes per slot (the row size copied).
        tgt_loc, src_loc: int ``[n]`` slot indices.
    """
    src, tgt = [int(x) for x in src_loc.tolist()], [int(x) for x in tgt_loc.tolist()]
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(base + s * stride, stride) for s in src]
        for t, row in zip(tgt, rows):
            ctypes.memmove(base + t * stride, row, stride)


def _offsets(start_offset, end_offset) -> list[int]:
    """Exclusive running sums of ``end - start``: each request's first index in the packed list."""
    lens = [int(n) for n in (end_offset - start_offset).tolist()]
    return [sum(lens[:b]) for b in range(len(lens))]


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len: int
) -> None:
    """``req_to_token[req_pool_indices[b], start[b]:end[b]] = `` request b's slice of the packed
    ``out_cache_loc`` (requests in order). Mirrors the Triton ``assign_req_to_token_pool``
    (``sglang/srt/mem_cache/allocation.py``, ``assign_req_to_token_pool_func``). Called at
    ``sglang/srt/mem_cache/allocation.py:746`` (0.5.23), ``sglang/srt/mem_cache/allocation.py:739``
    (0.5.22).

    Args:
        req_to_token: int32 ``[max_reqs, pool_len]`` (written). out_cache_loc: int64 ``[sum(end -
        start)]``. start_offset, end_offset, req_pool_indices: ``[bs]``.
    """
    offs = _offsets(start_offset, end_offset)
    for b, (r, s, e) in enumerate(
        zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist())
    ):
        req_to_token[r, s:e] = out_cache_loc[offs[b] : offs[b] + e - s].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len: int
) -> None:
    """The reverse gather: request b's ``req_to_token[req_pool_indices[b], start[b]:end[b]]``
    packed into ``out_cache_loc`` (written), requests in order. Mirrors the Triton
    ``assign_extend_cache_locs`` (``sglang/kernels/ops/speculative/cache_locs.py``,
    ``assign_extend_cache_locs_func``: the verify pass's slots, reached through
    ``assign_extend_cache_locs_uniform_func``). Called at
    ``sglang/kernels/ops/speculative/cache_locs.py:740`` (0.5.23, from ``srt/speculative/
    eagle_utils.py:357``), ``sglang/kernels/ops/speculative/cache_locs.py:625`` (0.5.22, from
    ``eagle_utils.py:575``)."""
    offs = _offsets(start_offset, end_offset)
    for b, (r, s, e) in enumerate(
        zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist())
    ):
        out_cache_loc[offs[b] : offs[b] + e - s] = req_to_token[r, s:e].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices,
    req_to_token,
    seq_lens,
    out_cache_loc,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """``out_cache_loc[b * n : (b + 1) * n] = req_to_token[req_pool_indices[b], seq_lens[b] :
    seq_lens[b] + n]`` with ``n = topk * num_steps``: each request's draft slots. Mirrors the
    Triton ``assign_draft_cache_locs_contiguous`` (``cache_locs.py``; its positions are not written
    on CPU). Called at ``sglang/kernels/ops/speculative/cache_locs.py:99`` (0.5.23, in
    ``assign_draft_cache_locs_contiguous_func``, which asserts so), inline at
    ``sglang/srt/speculative/eagle_worker_common.py:285`` (0.5.22; ``num_steps`` columns in both:
    the window plan is off on CPU, 0.5.22 ``eagle_worker_common.py:268-274``)."""
    import torch

    n = int(topk) * int(num_steps)
    if seq_lens.numel() == 0:
        return
    idx = seq_lens.long()[:, None] + torch.arange(n, device=seq_lens.device)
    rows = req_to_token[req_pool_indices.long()[:, None], idx]
    out_cache_loc[: seq_lens.numel() * n].copy_(rows.reshape(-1))


def build_tree_kernel_efficient_cpu(
    parent_list,
    selected_index,
    verified_seq_len,
    tree_mask,
    positions,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """The draft tree's retrieve links, positions and attention mask, per request.

    Mirrors ``sgl_build_tree_kernel_efficient_triton`` (``sglang/kernels/ops/speculative/
    spec_tree.py``; called by ``eagle_utils.py`` ``build_tree_kernel_efficient``). Called at
    ``sglang/kernels/ops/speculative/spec_tree.py:412`` (0.5.23), inline at
    ``sglang/srt/speculative/eagle_utils.py:263`` (0.5.22). Node 0 is the
    bonus token; node i >= 1 is ``selected_index[b, i - 1]``, whose parent is node 0 when
    ``selected_index // topk == 0``, else the node whose selected index is
    ``parent_list[b, selected_index // topk]``. Writes only (the caller fills -1 / True):
    ``retrive_index[b, i] = b * n + i``; ``retrive_next_token`` = the last-numbered child,
    ``retrive_next_sibling`` = the next lower-numbered sibling; ``positions[b * n + i] =
    verified_seq_len[b] + depth(i)``; in the mask row of node i, 1 for node 0, i and its
    ancestors, 0 for the other nodes. Mask layout: ``tree_mask_mode`` 0 (FULL_MASK, rows of
    ``seq_len + n`` after the requests before) or 1 (QLEN_ONLY, rows of n, the CPU default,
    ``eagle_utils.default_tree_mask_mode``). For a chain (topk 1: ``parent_list[b] = [-1, 0, 1,
    ...]``, ``selected_index[b] = [0, 1, ...]``) node i's parent is i - 1 and the mask is causal.

    Raises:
        NotImplementedError: ``tree_mask_mode`` 2 (bit-packed; SGLang's Triton path refuses it too).
    """
    n, topk = int(draft_token_num), int(topk)
    if int(tree_mask_mode) not in (0, 1):
        raise NotImplementedError(f"tree_mask_mode={tree_mask_mode}: only 0 and 1 here")
    seq = [int(x) for x in verified_seq_len.tolist()]
    parents = parent_list.tolist() if parent_list.dim() > 1 else [[]] * len(seq)  # [bs, 0]: 1 step
    before = 0
    for b, seq_len in enumerate(seq):
        sel, par = selected_index[b].tolist(), parents[b]

        def parent(i: int):  # node of draft i's parent, or None when its parent is not kept
            tb = sel[i - 1] // topk
            if tb == 0:
                return 0
            return next((pp + 1 for pp in range(n - 1) if sel[pp] == par[tb]), None)

        for i in range(n - 1, 0, -1):
            retrive_index[b, i] = b * n + i
            p = parent(i)
            if p is not None:
                old = int(retrive_next_token[b, p])
                retrive_next_token[b, p] = i
                if old != -1:
                    retrive_next_sibling[b, i] = old
        retrive_index[b, 0] = b * n
        for x in range(n):
            if int(tree_mask_mode) == 0:
                row = n * n * b + before * n + (seq_len + n) * x + seq_len
            else:
                row = n * n * b + n * x
            tree_mask[row : row + n] = False
            tree_mask[row] = True
            d, node = 0, x
            while node > 0 and d < int(depth):
                d += 1
                tree_mask[row + node] = True
                node = parent(node)
                node = 0 if node is None else node
            positions[b * n + x] = seq_len + d
        before += seq_len


def verify_tree_greedy_cpu(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    target_predict,
) -> None:
    """Greedy verification: walk the tree from node 0, at each level taking the child whose draft
    equals the target's argmax at the last accepted node; for a chain, the longest prefix of drafts
    equal to the target's argmax. Mirrors ``verify_tree_greedy_kernel_triton`` (``spec_tree.py``;
    called through ``verify_tree_greedy_func`` by ``eagle_utils.py`` on CPU, always greedy).
    Called at ``sglang/kernels/ops/speculative/spec_tree.py:510`` (0.5.23),
    ``sglang/srt/speculative/eagle_utils.py:414`` (0.5.22).

    Args:
        predicts: int32 ``[bs * n]`` (written): at each accepted node, the target's token there.
        accept_index: int32 ``[bs, depth + 1]`` (written, caller fills -1): accepted nodes' flat
            indices, node 0 first. accept_token_num: int32 ``[bs]`` (written): drafts accepted.
        candidates: ``[bs, n]`` node tokens (node 0 = bonus). retrive_*: int64 ``[bs, n]`` from
            :func:`build_tree_kernel_efficient_cpu`. target_predict: ``[bs, n]`` target argmax.
    """
    steps = accept_index.shape[1]
    flat_target = target_predict.reshape(-1).tolist()
    for b in range(candidates.shape[0]):
        ridx, nxt = retrive_index[b].tolist(), retrive_next_token[b].tolist()
        sib, cand = retrive_next_sibling[b].tolist(), candidates[b].tolist()
        last, num, cur = ridx[0], 0, 0
        accept_index[b, 0] = last
        for _ in range(1, steps):
            cur = nxt[cur]
            while cur != -1 and cand[cur] != flat_target[last]:
                cur = sib[cur]
            if cur == -1:
                break
            predicts[last] = flat_target[last]
            num += 1
            accept_index[b, num] = ridx[cur]
            last = ridx[cur]
        accept_token_num[b] = num
        predicts[last] = flat_target[last]


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride: int) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1]``: the token
    after the accepted drafts (``accept_lens`` counts it). Mirrors the Triton ``fill_bonus_tokens``
    (``sglang/kernels/ops/speculative/eagle.py``, from ``eagle_worker_common.py``: ``:759`` in
    0.5.23, ``:777`` in 0.5.22). Called at ``sglang/kernels/ops/speculative/eagle.py:40`` in
    0.5.23 and 0.5.22 alike."""
    flat = accept_tokens.reshape(-1)
    for b, a in enumerate(accept_lens.tolist()):
        bonus_tokens[b] = flat[int(accept_stride) * b + int(a) - 1]
