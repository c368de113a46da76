"""eagle3nb.drafter.vocab: the draft vocabulary from loss-bearing token counts, d2t offsets and the t2d
mask checked by hand."""

import pytest
import torch

from eagle3nb.drafter.vocab import build_draft_vocab, check_draft_vocab, count_loss_tokens, coverage


def test_counts_only_loss_bearing_tokens():
    counts = count_loss_tokens(
        [
            (torch.tensor([1, 5, 5, 7]), torch.tensor([0, 1, 1, 1])),
            (torch.tensor([5, 9]), torch.tensor([1, 0])),
        ],
        10,
    )
    assert counts.tolist() == [0, 0, 0, 0, 0, 3, 0, 1, 0, 0]


def test_d2t_t2d_hand_example():
    # vocab 8; counts: id 6 x5, id 2 x3, id 7 x3, id 4 x1 -> top 3 = {6, 2, 7} (2 before 7 on ties)
    counts = torch.tensor([0, 0, 3, 0, 1, 0, 5, 3])
    d2t, t2d = build_draft_vocab(counts, 3)
    # chosen sorted: [2, 6, 7] -> offsets [2-0, 6-1, 7-2]
    assert d2t.tolist() == [2, 5, 5] and d2t.dtype == torch.int64
    assert t2d.tolist() == [False, False, True, False, False, False, True, True]
    assert ((torch.arange(3) + d2t).tolist()) == [2, 6, 7]
    check_draft_vocab(d2t, t2d)
    assert coverage(counts, t2d) == pytest.approx(11 / 12)


def test_pads_with_unused_ids_when_few_distinct_tokens():
    counts = torch.tensor([0, 0, 0, 4, 0, 2])  # 2 distinct, draft vocab 4 -> add lowest unseen 0, 1
    d2t, t2d = build_draft_vocab(counts, 4)
    assert (torch.arange(4) + d2t).tolist() == [0, 1, 3, 5]
    check_draft_vocab(d2t, t2d)


def test_identity_when_full_vocab():
    d2t, t2d = build_draft_vocab(torch.tensor([1, 0, 2, 0]), 4)
    assert d2t.tolist() == [0, 0, 0, 0] and t2d.all()


def test_check_rejects_absolute_ids_and_mismatch():
    counts = torch.tensor([0, 0, 3, 0, 1, 0, 5, 3])
    d2t, t2d = build_draft_vocab(counts, 3)
    absolute = torch.arange(3) + d2t  # the failure kind: d2t stored as target ids
    with pytest.raises(ValueError, match="offsets"):
        check_draft_vocab(absolute, t2d)
    bad_t2d = t2d.clone()
    bad_t2d[0] = True
    with pytest.raises(ValueError, match="t2d"):
        check_draft_vocab(d2t, bad_t2d)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_draft_vocab(counts, 9)
