"""SGLang 0.5.23 serves an EAGLE-3 drafter on CPU: torch stand-ins for the CUDA-only kernel ops of
its chain-drafting path, and the install that puts them (and :mod:`sglang_spec_attn`'s attention
pieces) in place, only where they are missing.

Why: the PyPI ``sglang-kernel`` wheel SGLang 0.5.23 installs is a CUDA build with no ``*_cpu`` op
(``hasattr(torch.ops.sgl_kernel, name)`` is False after ``import sgl_kernel``), yet with any
speculative algorithm SGLang's CPU path calls them (``../shared/reference/sglang_cpu_serving.md``).
The Python wrappers in ``sgl_kernel/speculative.py`` and ``sgl_kernel/kvcacheio.py`` look the op up
in ``torch.ops.sgl_kernel`` at call time, so an op registered there under the same schema is what
SGLang runs. :data:`OPS` lists them in the order the chain path calls them, each with the SGLang
caller its docstring names; not reached with ``speculative_eagle_topk = 1``:
``fill_accept_out_cache_loc_cpu`` (topk > 1), ``build_draft_decode_metadata_cpu`` (the AMX
backend), ``rotate_input_ids_cpu`` (multi-layer EAGLE).

Where it runs: in SGLang's scheduler child (the process that runs the model). The backend sets
:data:`ENV` to ``"1"`` before it starts a speculative engine; the worker module, imported as
``__mp_main__`` in every SGLang child, calls :func:`hook_scheduler`, which wraps SGLang's
``run_scheduler_process`` so that, at the scheduler's start, :data:`ENV` is read (from the
environment the parent had then: :mod:`sglang_forkserver`'s children restore it before their
target runs) and :func:`install` runs with the scheduler's own ``server_args``. Gated on SGLang
:data:`VERSION`, device cpu and ``speculative_eagle_topk == 1``; anything else is refused by name.
On GPU nothing is patched. Imports only stdlib at module level; torch and SGLang inside functions.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = [
    "ENV",
    "VERSION",
    "OPS",
    "check",
    "install",
    "register_ops",
    "enabled",
    "hook_scheduler",
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "build_tree_kernel_efficient_cpu",
    "assign_extend_cache_locs_cpu",
    "verify_tree_greedy_cpu",
    "fill_bonus_tokens_cpu",
]

ENV = "EAGLE3NB_SGLANG_SPEC_CPU"
VERSION = "0.5.23"  # the SGLang whose sources the stand-ins mirror


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """Copy KV rows ``src_loc[i] -> tgt_loc[i]`` in every buffer, all reads before the writes.

    Mirrors ``copy_all_layer_kv_cache_tiled`` / ``copy_all_layer_kv_cache_func``
    (``sglang/kernels/ops/kvcache/cache_move.py``); called once per KV pool at start
    (``memory_pool.py`` ``_init_kv_copy_and_warmup``: slot 0 -> slot 0).

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
    (``sglang/srt/mem_cache/allocation.py``, ``assign_req_to_token_pool_func``).

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
    ``assign_extend_cache_locs_func``: the verify pass's slots)."""
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
    on CPU, ``assign_draft_cache_locs_contiguous_func`` asserts so)."""
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
    spec_tree.py``; called by ``eagle_utils.py`` ``build_tree_kernel_efficient``). Node 0 is the
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
    (``sglang/kernels/ops/speculative/eagle.py``, from ``eagle_worker_common.py``)."""
    flat = accept_tokens.reshape(-1)
    for b, a in enumerate(accept_lens.tolist()):
        bonus_tokens[b] = flat[int(accept_stride) * b + int(a) - 1]


# name -> (schema arguments, stand-in), in the order the chain path calls them
OPS = {
    "copy_all_layer_kv_cache_cpu": (
        "Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc",
        copy_all_layer_kv_cache_cpu,
    ),
    "assign_req_to_token_pool_cpu": (
        "Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor out_cache_loc, int pool_len",
        assign_req_to_token_pool_cpu,
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, Tensor(a!) out_cache_loc, "
        "int pool_len, int topk, int num_steps",
        assign_draft_cache_locs_contiguous_cpu,
    ),
    "build_tree_kernel_efficient_cpu": (
        "Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, "
        "Tensor(a!) tree_mask, Tensor(b!) positions, Tensor(c!) retrive_index, "
        "Tensor(d!) retrive_next_token, Tensor(e!) retrive_next_sibling, int topk, int depth, "
        "int draft_token_num, int tree_mask_mode",
        build_tree_kernel_efficient_cpu,
    ),
    "assign_extend_cache_locs_cpu": (
        "Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor(a!) out_cache_loc, int pool_len",
        assign_extend_cache_locs_cpu,
    ),
    "verify_tree_greedy_cpu": (
        "Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, "
        "Tensor retrive_next_sibling, Tensor target_predict",
        verify_tree_greedy_cpu,
    ),
    "fill_bonus_tokens_cpu": (
        "Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, int accept_stride",
        fill_bonus_tokens_cpu,
    ),
}
_LIBS: dict = {}  # namespace -> torch.library.Library (kept alive: dropping it unregisters)


def register_ops(namespace: str = "sgl_kernel") -> list[str]:
    """Register each :data:`OPS` stand-in as ``torch.ops.<namespace>.<name>`` (CPU) where no op of
    that name exists; for ``sgl_kernel``, ``import sgl_kernel`` first (it registers its own).

    Returns:
        The names registered now (an op already there, SGLang's own or an earlier call's, is kept).
    """
    import torch

    if namespace == "sgl_kernel":
        import sgl_kernel  # noqa: F401  (its ops first: a real CPU build keeps its own)
    space = getattr(torch.ops, namespace)
    missing = [name for name in OPS if not hasattr(space, name)]
    if missing:
        lib = _LIBS.setdefault(namespace, torch.library.Library(namespace, "FRAGMENT"))
        for name in missing:
            args, fn = OPS[name]
            lib.define(f"{name}({args}) -> ()")
            lib.impl(name, fn, "CPU")
    return missing


def check(version: str, device: str, topk: int) -> None:
    """Refuse, by name, what the stand-ins were not written for.

    Raises:
        RuntimeError: ``version`` is not :data:`VERSION` (the ops' schemas and the patched
            methods are read from that source), or ``device`` is not ``cpu`` (GPUs have SGLang's
            own kernels: nothing is patched there).
        ValueError: ``topk`` is not 1 (tree drafting would need the tree mask in the verify
            attention and ``fill_accept_out_cache_loc_cpu``).
    """
    if str(version) != VERSION:
        raise RuntimeError(
            f"SGLang {version}: eagle3nb's CPU speculative stand-ins are written for SGLang "
            f"{VERSION} only (op schemas and patched methods read from that source); install "
            f"sglang=={VERSION} (bash .ci/setup_engines.sh) or serve on a GPU"
        )
    if str(device) != "cpu":
        raise RuntimeError(
            f"device={device!r}: the CPU speculative stand-ins are for device cpu only; on a GPU "
            "SGLang's own kernels serve the drafter and nothing is patched"
        )
    if int(topk) != 1:
        raise ValueError(
            f"speculative_eagle_topk={topk}: the CPU stand-ins serve chain drafting only "
            "(topk 1: the verify attention is causal); use speculative_eagle_topk=1"
        )


def install(version: str, device: str, topk: int) -> dict:
    """:func:`check`, then register the missing ops (:func:`register_ops`) and patch SGLang's
    ``torch_native`` attention for speculative decoding (:func:`sglang_spec_attn.install`), in
    this process. Idempotent.

    Returns:
        ``{"ops": names registered now, "attention": what was patched now}``.
    """
    check(version, device, topk)
    from eagle3nb.engines import sglang_spec_attn

    return {"ops": register_ops(), "attention": sglang_spec_attn.install()}


def enabled() -> bool:
    """Whether this process's environment asks for the stand-ins (:data:`ENV` is ``"1"``)."""
    return os.environ.get(ENV) == "1"


def hook_scheduler() -> bool:
    """Wrap ``sglang.srt.managers.scheduler.run_scheduler_process`` in this process (an SGLang
    child, before it unpickles its target, which pickle resolves by name) so that the scheduler
    runs :func:`install` with its own ``server_args`` first when :data:`ENV` is ``"1"`` at its
    start. Imports the scheduler module only when it is already imported (the forkserver's
    children) or :data:`ENV` is set now (spawned children).

    Returns:
        True when the hook is in place.
    """
    name = "sglang.srt.managers.scheduler"
    if name not in sys.modules and not enabled():
        return False
    import importlib

    mod = importlib.import_module(name)
    orig = mod.run_scheduler_process
    if getattr(orig, "_eagle3nb_spec_cpu", False):
        return True

    def run_scheduler_process(server_args, *args, **kwargs):
        if enabled():
            import sglang

            install(sglang.__version__, server_args.device, server_args.speculative_eagle_topk)
        return orig(server_args, *args, **kwargs)

    run_scheduler_process._eagle3nb_spec_cpu = True
    mod.run_scheduler_process = run_scheduler_process
    return True
