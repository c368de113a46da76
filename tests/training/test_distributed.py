"""Data parallel training on CPU (gloo, 2 processes under torchrun, launched the way 03_train does):
same trained weights as one process with the same global batch and seed, and a rank killed with
SIGKILL mid-epoch resumes to the uninterrupted run's weights.

Tolerance (1 vs 2 processes): |w1 - w2| <= 1e-5 absolute on every exported tensor after 9 AdamW
steps (measured: <= 1e-6). Float32 sums run in another order (one 5-sample batch vs 3 + 2 samples
and an all-reduce); nothing else differs. 11 samples in batches of 5 leave a 1-sample batch each
epoch, so rank 1 also runs its loss-free stand-in row. Resume under the same 2 ranks is bit-exact.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from testkit import requires_engine, train_killed

from eagle3nb import params
from eagle3nb.rundir import RunDir
from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.steps.train.step import train_step

BASE = dict(
    max_train_prompts=11,
    max_new_tokens=12,
    batch_size=5,
    max_steps=9,
    warmup_steps=2,
    ttt_steps=3,
    checkpoint_every=3,
    interactive=False,
    draft_intermediate_size=64,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny generated + extracted run; each test copies it under another run_name."""
    out = tmp_path_factory.mktemp("runs")
    p = params.RunParams(outputs_dir=str(out), run_name="base", **BASE)
    generate_step(p, progress=False)
    extract_sglang_step(p, progress=False)
    return p


def _copy(p, name, **kw):
    import shutil

    q = p.model_copy(update=dict(run_name=name, **kw))
    src, dst = RunDir(p), RunDir(q)
    dst.root.mkdir(parents=True)
    shutil.copytree(src.dataset, dst.dataset)
    shutil.copytree(src.generated.parent, dst.generated.parent)
    shutil.copy(src.metrics, dst.metrics)
    return q


def _weights(q):
    return load_file(str(RunDir(q).drafter / "model.safetensors"))


def _history(q):
    """history.json without wall-clock fields (held-out evaluation records its own seconds)."""
    hist = json.loads((RunDir(q).train / "history.json").read_text())
    for h in hist:
        if isinstance(h.get("heldout"), dict):
            h["heldout"].pop("seconds", None)
    return hist


@pytest.fixture(scope="module")
def one_and_two(run):
    one = _copy(run, "one")
    train_step(one, progress=False)  # in this process, as 03 with nproc_per_node 1
    two = _copy(run, "two", nproc_per_node=2)
    out = train_step(two, progress=False)  # launches torchrun, as 03 with nproc_per_node 2
    return one, two, out


@requires_engine("sglang")  # the run fixture extracts through SGLang
def test_two_processes_train_the_weights_of_one(one_and_two, target):
    one, two, out = one_and_two
    assert out["stats"]["world_size"] == 2 and out["stats"]["parallel"] == "ddp"
    w1, w2 = _weights(one), _weights(two)
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=1e-5, msg=k)
    h1, h2 = _history(one), _history(two)
    assert [h["step"] for h in h1] == [h["step"] for h in h2]
    for a, b in zip(h1, h2):  # global-batch loss and per-step accuracy, all-reduced over ranks
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["step_acc"] == pytest.approx(a["step_acc"], abs=1e-6)
    head0 = target[0].lm_head.weight.detach()[
        torch.arange(w1["d2t"].numel()) + w1["d2t"]
    ]  # lm_head's init
    assert (
        w1["lm_head.weight"] - head0
    ).abs().max() > 100 * 1e-5  # training moved weights far beyond the tolerance


@requires_engine("sglang")  # the run fixture extracts through SGLang
def test_fsdp_two_processes_train_the_weights_of_one(run, one_and_two):
    one = one_and_two[0]
    q = _copy(run, "fsdp", nproc_per_node=2, fsdp="on")
    out = train_step(q, progress=False)
    assert out["stats"]["parallel"] == "fsdp"
    w1, w2 = _weights(one), _weights(q)
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=1e-5, msg=k)


@requires_engine("sglang")  # the run fixture extracts through SGLang
def test_rank_killed_mid_epoch_resumes_to_the_uninterrupted_weights(run, one_and_two):
    two = one_and_two[1]
    q = _copy(run, "killed", nproc_per_node=2)
    train_killed(q, "1:7")  # rank 1 SIGKILLs itself after step 7 (last checkpoint: step 6)
    ck = RunDir(q).train / "checkpoints"
    assert json.loads((ck / "latest.json").read_text())["step"] == 6
    assert sorted(x.name for x in (ck / "step-00000006").glob("rank-*.pt")) == [
        "rank-00000.pt",
        "rank-00001.pt",
    ]
    st = torch.load(ck / "step-00000006" / "rank-00001.pt", weights_only=False)
    n = json.loads((RunDir(q).dataset / "manifest.json").read_text())["n_samples"]
    assert st["step"] == 6 and st["position"] == divmod(
        6, -(-n // 5)
    )  # (epoch, batch) = mid-epoch data position
    out = train_step(q, progress=False)  # rerun: resumes at step 6
    assert out["stats"]["steps"] == 9
    w_res, w_full = _weights(q), _weights(two)
    for k in w_full:
        assert torch.equal(w_res[k], w_full[k]), k
    assert _history(q) == _history(two)


@requires_engine("sglang")  # the run fixture extracts through SGLang
def test_resume_on_another_number_of_processes_continues_the_run(run, one_and_two):
    """Issue 15's resume on fewer ranks (8 -> 4 on GPUs), here 2 -> 1 gloo processes: the step-6
    checkpoint written by 2 ranks (DCP, one file per rank) is resharded into 1 process, which
    trains steps 7-9 on the same global batches: the weights and losses of the uninterrupted
    1-process run, within the 1-vs-2-process tolerance (float32 sums in another order)."""
    one = one_and_two[0]
    q = _copy(run, "shrink", nproc_per_node=2)
    train_killed(q, "1:7")  # rank 1 SIGKILLs itself after step 7 (last checkpoint: step 6)
    ck = RunDir(q).train / "checkpoints"
    assert json.loads((ck / "latest.json").read_text())["world_size"] == 2
    q1 = q.model_copy(update={"nproc_per_node": 1})
    out = train_step(q1, progress=False)  # in this process: resumes the 2-rank checkpoint
    assert out["stats"]["steps"] == 9 and out["stats"]["world_size"] == 1
    w_res, w_one = _weights(q1), _weights(one)
    for k in w_one:
        torch.testing.assert_close(w_res[k], w_one[k], rtol=0, atol=1e-5, msg=k)
    h_res, h_one = _history(q1), _history(one)
    assert [h["step"] for h in h_res] == [h["step"] for h in h_one]
    for a, b in zip(h_one[6:], h_res[6:]):  # the steps trained after the resume
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)


def test_cli_refuses_bad_input_before_work(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "eagle3nb.steps.train.step", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
    )
    assert r.returncode == 2 and "params file" in r.stderr and "does not exist" in r.stderr
    f = tmp_path / "p.yaml"
    f.write_text("nproc_per_node: 2\nnode_rank: 1\n")
    r = subprocess.run(
        [sys.executable, "-m", "eagle3nb.steps.train.step", str(f)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
    )
    assert r.returncode == 2 and "node_rank=1 must be below nnodes=1" in r.stderr


@requires_engine("sglang")  # the run fixture extracts through SGLang
def test_best_and_rotation_under_two_processes(run):
    """Held-out evaluation on rank 0 under torchrun: best.json names the step with the highest
    held-out tau in the history, rotation keeps the newest ``keep_last`` steps plus best, and
    ``export_from: best`` exports that step (its tau re-measured by 04's simulator)."""
    from eagle3nb.drafter.export import load_drafter
    from eagle3nb.steps.train.heldout_slice import heldout_eval
    from eagle3nb.target import models
    from eagle3nb.training.heldout import isolated_rng

    q = _copy(
        run,
        "best2",
        nproc_per_node=2,
        eval_every=3,
        eval_prompts=2,
        keep_last=1,
        export_from="best",
    )
    out = train_step(q, progress=False)
    assert out["stats"]["world_size"] == 2
    hist = _history(q)
    evals = [h for h in hist if isinstance(h.get("heldout"), dict)]
    assert [h["step"] for h in evals] == [3, 6, 9]
    taus = [h["heldout"]["tau"] for h in evals]
    ck = RunDir(q).train / "checkpoints"
    best = json.loads((ck / "best.json").read_text())
    assert best["step"] == evals[taus.index(max(taus))]["step"]
    assert best["tau"] == pytest.approx(max(taus))
    kept = {p.name for p in ck.glob("step-*")}
    assert kept == {"step-00000009", f"step-{best['step']:08d}"}
    # the exported drafter is the best step's: the same held-out evaluation of the exported files
    # gives best's tau (the last step's tau differs, else this proves nothing)
    model, tok, _ = models.load_target(q.model, "float32", "cpu")
    emb = model.get_input_embeddings().weight.detach().float()
    d, _ = load_drafter(RunDir(q).drafter, emb)
    bnds = json.loads((RunDir(q).dataset / "manifest.json").read_text())["aux_boundaries"]
    ev = heldout_eval(q, RunDir(q), model, tok, bnds)
    with isolated_rng():
        assert ev(d.eval())["tau"] == pytest.approx(best["tau"])
