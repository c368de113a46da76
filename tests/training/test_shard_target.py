"""Online training with the target sharded over 2 gloo processes on CPU (FSDP2,
``online_target_shard: fsdp``): each rank captures the same aux states as the unsharded target,
holds half of its parameters, trains the drafter weights of a 1-process online run (and bit for
bit those of 2 ranks each holding the whole target), and resumes after a rank is killed.

Tolerances:
- capture: float32, rtol 1e-5 / atol 1e-5 against plain HF ``output_hidden_states`` of each sample
  alone (the ranks capture padded batches: the same matmuls on other batch shapes round differently
  by a few ulp; measured: aux <= 7.2e-7, normed final <= 1.4e-6 absolute, on states up to ~12).
- bfloat16 capture, sharded (bf16 all-gathers over gloo) vs unsharded, same batches: bit for bit.
- sharded vs whole target on the same 2 ranks: bit for bit (the all-gathered weights are the same
  tensors, every float operation runs in the same order; measured: 0).
- 2 ranks vs 1 process: |w1 - w2| <= 1e-5 absolute after 4 AdamW steps at lr 1e-3, as
  tests/training/test_distributed.py (capture of each rank's slice instead of the whole batch and
  sums in another order; AdamW turns such noise on near-zero gradients into updates of up to lr;
  measured: 2.3e-6, the same with the whole target on each rank).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from testkit import ONLINE_TEXTS, train_killed

from eagle3nb import params
from eagle3nb.rundir import RunDir
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.steps.train.step import train_step
from eagle3nb.target import models
from eagle3nb.training.online import OnlineSource
from eagle3nb.training.shard_target import (
    TARGET_SHARD_AUTO_PARAMS,
    resolve_target_shard,
    target_param_count,
)

TEXTS = ONLINE_TEXTS
STEPS = 3  # 7 samples in global batches of 3: 3, 3, then 1 (rank 1 captures a stand-in row)
BOUNDARIES = [1, 2, 4]  # sglang ids [0, 1, 3] of the 5-layer target
WORKER = Path(__file__).with_name("shard_worker.py")


def _env():
    paths = [str(Path(__file__).resolve().parents[2])]
    paths += [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, target):
    """Run shard_worker.py under torchrun (2 processes); returns each rank's saved dict."""
    _, tok, _ = target
    out = tmp_path_factory.mktemp("shard")
    samples = []
    for i, t in enumerate(TEXTS):
        ids = tok(t).input_ids
        samples.append([i, ids, [0] * 3 + [1] * (len(ids) - 3)])
    (out / "samples.json").write_text(json.dumps(samples))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    r = subprocess.run(
        cmd + [str(WORKER), str(out), str(STEPS)], env=_env(), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    load = lambda k, d: torch.load(out / f"rank-{k}-{d}.pt", weights_only=False)  # noqa: E731
    return [load(k, "float32") for k in (0, 1)], samples, [load(k, "bfloat16") for k in (0, 1)]


def test_sharded_capture_equals_unsharded_hf(ranks, target):
    """(a) Each rank's captured aux/final states of its own rows equal plain HF
    ``output_hidden_states`` of the unsharded target, sample by sample."""
    model = target[0]
    got, samples, _ = ranks
    seen = []
    for rank in got:
        assert len(rank["batches"]) == STEPS
        for b in rank["batches"]:
            for row, s in enumerate(b["sample_index"].tolist()):
                if s < 0:  # the stand-in row of a rank left without samples: no loss
                    assert b["loss_mask"][row].sum() == 0
                    continue
                seen.append(s)
                ids = torch.tensor([samples[s][1]])
                L = ids.shape[1]
                with torch.no_grad():
                    hs = model(input_ids=ids, output_hidden_states=True).hidden_states
                want = torch.cat([hs[k][0] for k in BOUNDARIES], dim=-1)  # [L, 3*H]
                aux, final = b["aux"][row], b["final"][row]
                torch.testing.assert_close(aux[:L], want, rtol=1e-5, atol=1e-5)
                # HF's last hidden state is after the final norm; the captured one is before it
                with torch.no_grad():
                    normed = model.model.norm(final[:L])
                torch.testing.assert_close(normed, hs[5][0], rtol=1e-5, atol=1e-5)
                assert aux[L:].abs().sum() == 0 and final[L:].abs().sum() == 0  # padding zeroed
                shifted = torch.cat([hs[k][0] for k in (0, 1, 3)], dim=-1)  # one boundary off
                assert (aux[:L] - shifted).abs().max() > 0.1  # the comparison can fail
    assert sorted(seen) == list(range(len(TEXTS)))  # every sample once over the two ranks


def test_each_rank_holds_half_the_target(ranks, target):
    """(b) Every parameter is a DTensor; each rank's local shard is its ``torch.chunk`` of dim 0
    (FSDP2's rule), the shards add up to the full model, and each rank holds about half of it."""
    model = target[0]
    full = dict(model.named_parameters())  # a tied embedding once, as the sharded model
    n_full = sum(p.numel() for p in full.values())
    got, _, _ = ranks
    totals = []
    for r, rank in enumerate(got):
        local = rank["local"]
        assert local.keys() == full.keys()
        for name, (is_dtensor, n_local, n_logical) in local.items():
            p = full[name]
            assert is_dtensor and n_logical == p.numel(), name
            rows = torch.chunk(torch.arange(p.shape[0]), 2)[r].numel()
            assert n_local == rows * (p.numel() // p.shape[0]), name
        totals.append(sum(v[1] for v in local.values()))
        rep = rank["report"]
        assert rep["mode"] == "fsdp" and rep["world"] == 2 and rep["full_params"] == n_full
    assert sum(totals) == n_full
    assert all(abs(t / n_full - 0.5) < 0.01 for t in totals), totals
    assert got[0]["report"]["rank_params"] == totals == got[1]["report"]["rank_params"]
    assert got[0]["report"]["rank_bytes"] == [4 * t for t in totals]  # float32


def test_sharded_bf16_capture_equals_unsharded_bf16(ranks):
    """bfloat16 (all-gathered in bf16 over gloo): each rank's batches equal bit for bit the same
    batches captured by the unsharded bf16 target (OnlineSource, same rows, same padding)."""
    _, samples, got = ranks
    model = models.load_target("stories260K-hd32", "bfloat16")[0]
    whole = OnlineSource(samples, model, [0, 1, 3], "sglang", {})
    for rank in got:
        assert {p: v[0] for p, v in rank["local"].items()} == dict.fromkeys(rank["local"], True)
        for b in rank["batches"]:
            idx = b["sample_index"].tolist()
            if idx == [-1]:  # the stand-in row (another sample's states, no loss): see test above
                continue
            ref = whole.batch(idx, "cpu")
            for k in ("input_ids", "attn_mask", "aux", "final"):
                assert torch.equal(b[k], ref[k]), k


RUN = dict(
    max_train_prompts=7,
    max_new_tokens=12,
    batch_size=3,
    max_steps=4,
    warmup_steps=1,
    ttt_steps=2,
    checkpoint_every=2,
    interactive=False,
    draft_intermediate_size=64,
    training_mode="online",
    eval_every=0,
    lr=1e-3,
)


def _copy(p, name, **kw):
    q = p.model_copy(update=dict(run_name=name, **kw))
    src, dst = RunDir(p), RunDir(q)
    dst.root.mkdir(parents=True)
    shutil.copytree(src.generated.parent, dst.generated.parent)
    shutil.copy(src.metrics, dst.metrics)
    return q


@pytest.fixture(scope="module")
def online_runs(tmp_path_factory):
    """01 once, then 03 online three times on its output: one process with the whole target,
    2 processes with the whole target on each rank, 2 processes with the target sharded."""
    p = params.RunParams(outputs_dir=str(tmp_path_factory.mktemp("runs")), run_name="base", **RUN)
    generate_step(p, progress=False)
    runs = {"base": {"params": p}}
    for name, kw in [
        ("one", {}),
        ("two_whole", dict(nproc_per_node=2, online_target_shard="none")),
        ("two_sharded", dict(nproc_per_node=2, online_target_shard="fsdp")),
    ]:
        q = _copy(p, name, **kw)
        out = train_step(q, progress=False)  # 2 processes: launches torchrun, as 03 does
        w = load_file(str(RunDir(q).drafter / "model.safetensors"))
        hist = json.loads((RunDir(q).train / "history.json").read_text())
        runs[name] = {"params": q, "stats": out["stats"], "weights": w, "history": hist}
    return runs


def test_sharded_target_trains_the_bits_of_the_whole_target(online_runs):
    """(c) 2 ranks with the target sharded train bit for bit the drafter of 2 ranks each holding
    the whole target (same batches, same order of every float operation: the all-gathered weights
    are the same tensors), and the choice is recorded in metrics and the drafter manifest."""
    whole, sharded = online_runs["two_whole"], online_runs["two_sharded"]
    for k, v in whole["weights"].items():
        assert torch.equal(sharded["weights"][k], v), k
    assert sharded["history"] == whole["history"]
    st = sharded["stats"]
    assert st["world_size"] == 2 and st["steps"] == RUN["max_steps"]
    sh, sw = st["online"]["target_shard"], whole["stats"]["online"]["target_shard"]
    n_full = sum(p.numel() for p in models.load_target("stories260K-hd32")[0].parameters())
    assert sw["mode"] == "none" and sw["rank_params"] == [n_full, n_full]
    assert sh["mode"] == "fsdp" and sh["world"] == 2 and sh["full_params"] == n_full
    assert sum(sh["rank_params"]) == n_full and max(sh["rank_params"]) < 0.51 * n_full
    dman = json.loads((RunDir(sharded["params"]).drafter / "manifest.json").read_text())
    assert dman["dataset_engine"]["target_shard"] == sh


def test_sharded_target_trains_the_weights_of_one_process(online_runs):
    """(c) ... and the weights of one process with the whole target on the same global batch, to
    1e-5 absolute (the 2-rank runs capture each rank's slice, a batch of another shape, and sum
    in another order; measured: 2-rank whole and sharded alike, see the module docstring)."""
    one, two = online_runs["one"], online_runs["two_sharded"]
    assert one["stats"]["online"]["target_shard"]["mode"] == "none"
    w1, w2 = one["weights"], two["weights"]
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=1e-5, msg=k)
    for a, b in zip(one["history"], two["history"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    emb = models.load_target("stories260K-hd32")[0].lm_head.weight.detach()
    head0 = emb[torch.arange(w1["d2t"].numel()) + w1["d2t"]]  # lm_head's initial rows
    assert (w1["lm_head.weight"] - head0).abs().max() > 100 * 1e-5  # training moved the weights


def test_sharded_run_killed_resumes_to_the_uninterrupted_weights(online_runs):
    """A rank SIGKILLed mid-run with the target sharded: the rerun resumes from the last committed
    checkpoint (the drafter's state only; the target is reloaded and resharded) and ends with the
    uninterrupted sharded run's weights, bit for bit."""
    q = _copy(online_runs["base"]["params"], "killed", nproc_per_node=2, online_target_shard="fsdp")
    train_killed(q, "1:3")  # rank 1 kills itself after step 3 (last checkpoint: step 2)
    ck = RunDir(q).train / "checkpoints"
    assert json.loads((ck / "latest.json").read_text())["step"] == 2
    out = train_step(q, progress=False)
    assert out["stats"]["steps"] == RUN["max_steps"]
    assert out["stats"]["online"]["target_shard"]["mode"] == "fsdp"
    w = load_file(str(RunDir(q).drafter / "model.safetensors"))
    for k, v in online_runs["two_sharded"]["weights"].items():
        assert torch.equal(w[k], v), k


def test_target_param_count_reads_the_headers(target):
    """The parameter count auto compares with the threshold, from the safetensors headers, equals
    the loaded model's (the tied embedding once)."""
    model, _, path = target
    assert target_param_count(path) == sum(p.numel() for p in model.parameters())


def test_auto_and_bad_values():
    big, small = TARGET_SHARD_AUTO_PARAMS + 1, TARGET_SHARD_AUTO_PARAMS
    assert resolve_target_shard("auto", 2, "online", big, 0) == "fsdp"
    assert resolve_target_shard("auto", 2, "online", small, 0) == "none"
    assert resolve_target_shard("auto", 1, "online", big, 0) == "none"
    assert resolve_target_shard("auto", 2, "offline", big, 10) == "none"
    assert resolve_target_shard("none", 8, "online", big, 10) == "none"
    with pytest.raises(ValueError, match="auto: .* eval_every=10"):
        resolve_target_shard("auto", 2, "online", big, 10)
    with pytest.raises(ValueError, match="online_target_shard='shard'"):
        resolve_target_shard("shard", 2)
    bad = [  # (run parameters, what the message must say)
        (dict(training_mode="online", eval_every=0), "world size 1.*nproc_per_node"),
        (dict(nproc_per_node=2, eval_every=0), "training_mode='offline'.*online_target_shard"),
        (dict(nproc_per_node=2, training_mode="online"), "eval_every=10.*eval_every: 0"),
    ]
    for kw, msg in bad:
        with pytest.raises(ValueError, match=f"online_target_shard=fsdp.*{msg}"):
            params.RunParams(online_target_shard="fsdp", **kw)
    assert params.RunParams(
        online_target_shard="fsdp", nproc_per_node=2, training_mode="online", eval_every=0
    )
