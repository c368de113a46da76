"""The CPU stand-ins for SGLang's missing ``sgl_kernel`` ops (eagle3nb.engines.sglang_spec_cpu)
against tables written by hand: each table checked on the Python function and through torch's
dispatcher under each SGLang version's schemas (0.5.22 and 0.5.23, registered under test
namespaces); the install gate's refusals; the verify view of sglang_spec_attn. Torch only: no SGLang
needed (the real engine's use of them is tests/engines/test_sglang_serve.py; the schemas and cited
lines against each version's own wheel: tests/engines/test_sglang_spec_sources.py)."""

import pytest
import torch

from eagle3nb.engines import (
    sglang_spec_attn,
    sglang_spec_cpu as spec,
    sglang_spec_ops,
    sglang_spec_versions,
)

NS = "eagle3nb_spec_cpu_test"  # not sgl_kernel: this process has no SGLang


class DispatchedOps:
    """The stand-ins as SGLang calls them: ``torch.ops.<ns>.<name>``, registered under one
    SGLang version's schemas (positional arguments, as the sgl_kernel wrappers pass them)."""

    def __init__(self, version: str):
        self.namespace = f"{NS}_{version.replace('.', '_')}"
        spec.register_ops(self.namespace, version)

    def __getattr__(self, name):
        return getattr(getattr(torch.ops, self.namespace), name)


@pytest.fixture(params=["python", *sglang_spec_versions.VERSIONS])
def ops(request):
    """The Python stand-ins, then the dispatcher's ops under each version's schemas."""
    return sglang_spec_ops if request.param == "python" else DispatchedOps(request.param)


def test_copy_all_layer_kv_cache_reads_every_row_before_writing(ops):
    k = torch.arange(12, dtype=torch.float32).reshape(4, 3)  # rows of 12 bytes
    v = torch.arange(100, 108, dtype=torch.float32).reshape(4, 2)  # rows of 8 bytes
    ptrs = torch.tensor([k.data_ptr(), v.data_ptr()], dtype=torch.int64)
    strides = torch.tensor([12, 8], dtype=torch.int64)
    # slot 3 is both a source and a target: its old row must be the one copied to slot 0
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([3, 0]), torch.tensor([1, 3]))
    assert k.tolist() == [[9, 10, 11], [3, 4, 5], [6, 7, 8], [3, 4, 5]]
    assert v.tolist() == [[106, 107], [102, 103], [104, 105], [102, 103]]


def test_assign_req_to_token_pool_writes_each_requests_slice(ops):
    rtt = torch.zeros(3, 6, dtype=torch.int32)
    ops.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),
        rtt,
        torch.tensor([1, 4]),
        torch.tensor([3, 6]),
        torch.tensor([11, 12, 21, 22]),
        6,
    )
    assert rtt.tolist() == [[0, 0, 0, 0, 21, 22], [0] * 6, [0, 11, 12, 0, 0, 0]]


def _rtt():
    return torch.tensor(
        [[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]]
    ).int()


def test_assign_extend_cache_locs_packs_each_requests_slice(ops):
    out = torch.full((5,), -1, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(
        torch.tensor([1, 2]), _rtt(), torch.tensor([2, 0]), torch.tensor([5, 2]), out, 6
    )
    assert out.tolist() == [12, 13, 14, 20, 21]


def test_assign_draft_cache_locs_contiguous_takes_the_slots_after_seq_lens(ops):
    out = torch.full((4,), -1, dtype=torch.int64)
    ops.assign_draft_cache_locs_contiguous_cpu(
        torch.tensor([2, 0]), _rtt(), torch.tensor([1, 3]), out, 6, 1, 2
    )
    assert out.tolist() == [21, 22, 3, 4]


def _chain_tree(ops, seq_lens, mode, fill):
    """SGLang's chain inputs for 3 steps (base_spec_worker.py: parents arange(-1, 2), selected
    arange(3)), buffers as eagle_utils.build_tree_kernel_efficient allocates them."""
    bs, n = len(seq_lens), 4
    size = n * n * bs + (sum(seq_lens) * n if mode == 0 else 0)
    mask = torch.full((size,), fill, dtype=torch.bool)
    pos = torch.empty(bs * n, dtype=torch.long)
    ri, nt, ns = torch.full((3, bs, n), -1, dtype=torch.long)
    ops.build_tree_kernel_efficient_cpu(
        torch.tensor([[-1, 0, 1]] * bs),
        torch.tensor([[0, 1, 2]] * bs),
        torch.tensor(seq_lens),
        mask,
        pos,
        ri,
        nt,
        ns,
        1,
        3,
        n,
        mode,
    )
    return mask, pos, ri, nt, ns


def test_build_tree_chain_qlen_only_is_causal(ops):
    mask, pos, ri, nt, ns = _chain_tree(ops, [5, 7], 1, True)
    assert pos.tolist() == [5, 6, 7, 8, 7, 8, 9, 10]
    assert ri.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert nt.tolist() == [[1, 2, 3, -1]] * 2
    assert ns.tolist() == [[-1] * 4] * 2
    tri = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert mask.view(2, 4, 4).int().tolist() == [tri, tri]


def test_build_tree_chain_full_mask_writes_only_the_tree_columns(ops):
    # prefix columns are the caller's (filled False here to see they are left alone)
    mask, pos, *_ = _chain_tree(ops, [2, 1], 0, False)
    assert pos.tolist() == [2, 3, 4, 5, 1, 2, 3, 4]
    req0 = [[0, 0, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    req1 = [[0, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert mask[:24].view(4, 6).int().tolist() == req0
    assert mask[24:].view(4, 5).int().tolist() == req1


def test_build_tree_refuses_bitpacked_mask():
    with pytest.raises(NotImplementedError, match="tree_mask_mode=2"):
        _chain_tree(sglang_spec_ops, [2], 2, False)


def _verify(ops, candidates, target, nxt, sib, depth):
    bs, n = len(candidates), len(candidates[0])
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept = torch.full((bs, depth), -1, dtype=torch.int32)
    num = torch.empty(bs, dtype=torch.int32)
    ri = torch.arange(bs * n).view(bs, n)
    ops.verify_tree_greedy_cpu(
        predicts,
        accept,
        num,
        torch.tensor(candidates),
        ri,
        torch.tensor(nxt),
        torch.tensor(sib),
        torch.tensor(target),
    )
    return predicts.tolist(), accept.tolist(), num.tolist()


def test_verify_chain_accepts_the_longest_matching_prefix(ops):
    # request 0: bonus 4, drafts [5, 7, 9]; the target's argmax [5, 7, 2, 3]: 5 and 7 accepted, then
    # 9 != 2, so 2 is the bonus. Request 1: drafts [8, 8, 8] against argmax 3 first: none accepted.
    chain = [[1, 2, 3, -1]] * 2
    predicts, accept, num = _verify(
        ops, [[4, 5, 7, 9], [1, 8, 8, 8]], [[5, 7, 2, 3], [3, 8, 8, 8]], chain, [[-1] * 4] * 2, 4
    )
    assert num == [2, 0]
    assert accept == [[0, 1, 2, -1], [4, -1, -1, -1]]
    assert predicts == [5, 7, 2, 0, 3, 0, 0, 0]


def test_verify_walks_siblings_of_a_tree(ops):
    # root 0 with children 2 then 1 (next_token[0] = 2, sibling[2] = 1), node 3 under node 1;
    # the target's argmax at the root is 6 = node 2's token; node 2 has no child: 1 accepted
    predicts, accept, num = _verify(
        ops, [[4, 5, 6, 8]], [[6, 8, 9, 4]], [[2, 3, -1, -1]], [[-1, -1, 1, -1]], 3
    )
    assert (num, accept, predicts) == ([1], [[0, 2, -1]], [6, 0, 9, 0])


def test_fill_bonus_tokens_takes_the_last_accepted_slot(ops):
    tokens = torch.tensor([[5, 7, 2, 0], [3, 0, 0, 0]], dtype=torch.int32)
    bonus = torch.empty(2, dtype=torch.int32)
    ops.fill_bonus_tokens_cpu(tokens, torch.tensor([3, 1], dtype=torch.int32), bonus, 4)
    assert bonus.tolist() == [2, 3]


def test_registered_ops_run_through_the_dispatcher_and_are_not_replaced():
    assert sorted(spec.register_ops(NS)) == sorted(spec.OPS)
    assert spec.register_ops(NS) == []  # present ops are kept
    bonus = torch.empty(1, dtype=torch.int32)
    getattr(torch.ops, NS).fill_bonus_tokens_cpu(
        torch.tensor([[9, 8, 7]]), torch.tensor([2]), bonus, 3
    )
    assert bonus.tolist() == [8]
    rtt = torch.zeros(1, 4, dtype=torch.int32)
    getattr(torch.ops, NS).assign_req_to_token_pool_cpu(
        torch.tensor([0]), rtt, torch.tensor([1]), torch.tensor([3]), torch.tensor([6, 7]), 4
    )
    assert rtt.tolist() == [[0, 6, 7, 0]]


@pytest.mark.parametrize(
    "args, exc, msg",
    [
        (("0.5.21", "cpu", 1), RuntimeError, r"SGLang 0\.5\.21: .* 0\.5\.22 and 0\.5\.23 only"),
        (("0.5.24", "cpu", 1), RuntimeError, r"SGLang 0\.5\.24: .* 0\.5\.22 and 0\.5\.23 only"),
        (("0.5.23", "cuda", 1), RuntimeError, r"device='cuda': .* nothing is patched"),
        (("0.5.23", "cpu", 2), ValueError, r"speculative_eagle_topk=2: .* chain drafting only"),
    ],
)
def test_install_refuses_by_name(args, exc, msg):
    with pytest.raises(exc, match=msg):
        spec.install(*args)  # refused before SGLang is imported (absent here)


@pytest.mark.parametrize("version", sglang_spec_versions.VERSIONS)
def test_both_versions_pass_the_gate_and_each_op_cites_its_callers(version):
    spec.check(version, "cpu", 1)  # no error: 04 serves this version on CPU
    sites = sglang_spec_versions.table(version)
    assert list(sites) == list(spec.OPS)  # the same ops, in the chain path's order
    for name, site in sites.items():
        doc = " ".join(spec.OPS[name].__doc__.split())
        for caller in site.callers:  # each docstring names the lines it mirrors, per version
            here = doc.split(caller, 1)
            assert len(here) == 2, f"{name}'s docstring lacks {caller} ({version})"
            after = here[1][:60]
            assert version in after or f"{version} alike" in doc, (name, caller, version)


def test_scheduler_hook_is_not_placed_without_sglang_or_the_variable(monkeypatch):
    monkeypatch.delenv(spec.ENV, raising=False)
    assert spec.hook_scheduler() is False


class FakeVerifyBatch:
    """A fake TARGET_VERIFY batch: only what the view reads, plus one passed-through field."""

    class spec_info:
        draft_token_num = 4

    seq_lens = torch.tensor([5, 7])
    req_pool_indices = torch.tensor([3, 1])


def test_verify_view_is_an_extend_of_the_drafts_after_the_verified_prefix():
    view = sglang_spec_attn.VerifyView(FakeVerifyBatch())
    assert view.extend_prefix_lens.tolist() == [5, 7]
    assert view.extend_seq_lens.tolist() == [4, 4]
    assert view.seq_lens.tolist() == [9, 11]
    assert view.req_pool_indices.tolist() == [3, 1]


def test_build_tree_one_step_chain_has_no_parent_columns(ops):
    # k = 1: SGLang passes an empty [bs, 0] parent list; node 1's parent is the root
    mask = torch.full((2 * 4,), True)
    pos = torch.empty(4, dtype=torch.long)
    ri, nt, ns = torch.full((3, 2, 2), -1, dtype=torch.long)
    ops.build_tree_kernel_efficient_cpu(
        torch.empty(2, 0, dtype=torch.long), torch.tensor([[0], [0]]), torch.tensor([3, 6]),
        mask, pos, ri, nt, ns, 1, 1, 2, 1,
    )  # fmt: skip
    assert pos.tolist() == [3, 4, 6, 7] and nt.tolist() == [[1, -1], [1, -1]]
    assert mask.view(2, 2, 2).int().tolist() == [[[1, 0], [1, 1]]] * 2
