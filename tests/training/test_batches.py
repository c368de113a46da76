"""The streaming loader: memory-mapped reads equal the in-memory dataset, the batch plan is
deterministic, disjoint across ranks, covers every sample once per epoch, and bucketing cuts
padding."""

import pytest
import torch
from testkit import write_tiny_dataset

from eagle3nb.dataset.read import AuxDataset
from eagle3nb.training.batches import BatchPlan, OfflineSource, padding_stats, plan_padding

TEXTS = [
    "Once upon a time there was a cat.",
    "Tom had a big red ball and a dog. The dog ran after it all day long.",
    "The sun was warm.",
    "Mia liked to sing songs with her mom and dad every night.",
    "Ben ran.",
    "A bird sat on a tree and sang a happy song.",
]


@pytest.fixture(scope="module")
def ds_dir(target, tmp_path_factory):
    d = tmp_path_factory.mktemp("ds")
    return write_tiny_dataset(target, d, TEXTS, n_prompt=2, shard_size=4)  # 2 shards


def test_mmap_reads_what_the_in_memory_dataset_loads(ds_dir):
    mem, st = AuxDataset(ds_dir), AuxDataset(ds_dir, mmap=True)
    assert len(st) == len(mem) == len(TEXTS) and len(st.files) == 2
    assert st.fingerprint() == mem.fingerprint()
    for i in range(len(mem)):
        a, b = mem[i], st[i]
        assert a["sample_id"] == b["sample_id"] and st.lengths[i] == a["input_ids"].numel()
        for k in ("input_ids", "loss_mask", "aux", "final"):
            assert torch.equal(a[k], b[k]), (i, k)
    assert mem.lengths == st.lengths
    for (ia, ma), (ib, mb) in zip(mem.token_masks(), st.token_masks(), strict=True):
        assert torch.equal(ia, ib) and torch.equal(ma, mb)


def test_mmap_dataset_pickles_for_loader_workers(ds_dir):
    import pickle

    st = AuxDataset(ds_dir, mmap=True)
    first = st[5]  # opens a safe_open handle, which must not travel
    copy = pickle.loads(pickle.dumps(st))
    assert copy._open == {} and len(copy) == len(st)
    for k in ("input_ids", "loss_mask", "aux", "final"):
        assert torch.equal(copy[5][k], first[k]), k


@pytest.mark.parametrize("mmap", [False, True])
def test_either_mode_names_a_corrupt_shard(ds_dir, tmp_path, mmap):
    import shutil

    d = tmp_path / "c"
    shutil.copytree(ds_dir, d)
    f = d / "shard-00001.safetensors"
    b = bytearray(f.read_bytes())
    b[-3] ^= 0xFF
    f.write_bytes(bytes(b))
    with pytest.raises(ValueError, match="shard-00001.safetensors is corrupt"):
        AuxDataset(d, mmap=mmap)


@pytest.mark.parametrize("bucket", [True, False])
def test_plan_is_deterministic_disjoint_and_covers_each_epoch(bucket):
    lengths = [
        int(x) for x in torch.randint(3, 90, (103,), generator=torch.Generator().manual_seed(1))
    ]
    G, world = 10, 3
    plan, again = (
        BatchPlan(lengths, G, seed=5, bucket=bucket, bucket_window=4),
        BatchPlan(lengths, G, seed=5, bucket=bucket, bucket_window=4),
    )
    assert plan.steps_per_epoch == 11  # ceil(103 / 10): the short last batch is kept
    for epoch in range(3):
        seen = []
        for i in range(plan.steps_per_epoch):
            step = epoch * plan.steps_per_epoch + i
            b = plan.global_batch_at(step)
            assert b == again.global_batch_at(step)  # same (seed, epoch) -> same order
            parts = [plan.rank_slice(b, r, world) for r in range(world)]
            flat = [x for p in parts for x in p]
            assert sorted(flat) == sorted(b) and len(set(flat)) == len(
                flat
            )  # disjoint, union = batch
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
            seen += b
        assert sorted(seen) == list(range(103))  # every sample exactly once per epoch
    assert plan.epoch(0) != plan.epoch(1)  # reshuffled each epoch
    assert BatchPlan(lengths, G, seed=6, bucket=bucket).epoch(0) != plan.epoch(0)


def test_bucketing_cuts_padding_counted_by_hand():
    lengths = [
        int(x) for x in torch.randint(3, 90, (200,), generator=torch.Generator().manual_seed(2))
    ]
    plan, plain = (
        BatchPlan(lengths, 8, seed=0, bucket=True),
        BatchPlan(lengths, 8, seed=0, bucket=False),
    )
    for p in (plan, plain):  # padded = sum over rank batches of samples x longest, recomputed here
        real = padded = 0
        for s in range(p.steps_per_epoch):
            for r in range(2):
                L = [lengths[i] for i in p.rank_slice(p.global_batch_at(s), r, 2)]
                real, padded = real + sum(L), padded + len(L) * max(L)
        st = padding_stats(p, world=2)
        assert (st["real_tokens"], st["padded_tokens"]) == (real, padded) and real == sum(lengths)
    assert (
        padding_stats(plan, 2)["padding_fraction"]
        < 0.5 * padding_stats(plain, 2)["padding_fraction"]
    )
    # what a source reports: the plan against a plain shuffle of the same lengths, batch and seed
    want = {"this_plan": padding_stats(plan, 2), "plain_shuffle": padding_stats(plain, 2)}
    assert plan_padding(plan, 2) == want


def test_source_batches_resume_at_a_step_and_fill_empty_ranks(ds_dir):
    # 6 samples: batches of 4 and 2
    src = OfflineSource(AuxDataset(ds_dir, mmap=True), global_batch=4, seed=3)
    full = list(src.batches(0, 6, rank=0, world=1))
    assert [b["input_ids"].shape[0] for b in full] == [
        len(src.plan.global_batch_at(s)) for s in range(6)
    ]
    tail = list(src.batches(3, 6, rank=0, world=1))  # a resumed run restarts at its step
    for a, b in zip(full[3:], tail):
        assert all(torch.equal(a[k], b[k]) for k in a)
    short = next(s for s in range(2) if len(src.plan.global_batch_at(s)) == 2)
    parts = [next(iter(src.batches(short, short + 1, rank=r, world=3))) for r in range(3)]
    assert [p["sample_index"].tolist() == [-1] for p in parts] == [False, False, True]
    assert parts[2]["loss_mask"].sum() == 0  # the stand-in row of the empty rank scores nothing
