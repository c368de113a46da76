"""Progress, tracking and held-out evaluation during training (eagle3nb.training.progress, monitor,
heldout): a headless run prints a line at most 60 s (of a controlled clock) apart, to stdout and
train.log; the bar's postfix carries the loss; tensorboard files hold loss and held-out tau equal to
the history's (read back with EventAccumulator); evaluation leaves the trained weights unchanged;
``best`` is the argmax of held-out tau and the returned drafter re-evaluates to it; checkpoint
rotation keeps the last keep_last folders plus best."""

import io
import re

import pytest
import torch

from eagle3nb.training import distributed
from eagle3nb.training.heldout import HeldoutEval, isolated_rng
from eagle3nb.training.loop import TrainConfig, make_source, train_drafter

HELD = ["Lily found a small bird in the garden.", "The dog jumped over the fence and ran."]


def heldout(target, ttt_steps):
    model, tok, _ = target
    ids = [tok(t).input_ids for t in HELD]
    samples = [(i, [0] * 3 + [1] * (len(i) - 3)) for i in ids]
    prompts = [i[:4] for i in ids]
    return HeldoutEval(model, samples, prompts, [1, 2, 4], 3, 12, None, ttt_steps, 0.8, "tests")


def cfg(**kw):
    base = dict(
        batch_size=2,
        max_steps=8,
        warmup_steps=2,
        ttt_steps=3,
        draft_vocab_size=128,
        draft_num_heads=0,
        draft_num_kv_heads=0,
        draft_intermediate_size=0,
    )
    return TrainConfig(**{**base, **kw})


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class TimedSource:
    """A batch source whose every step takes ``secs`` seconds of ``clock``."""

    def __init__(self, src, clock, secs):
        self.src, self.clock, self.secs = src, clock, secs
        self.n_aux, self.plan = src.n_aux, src.plan

    def fingerprint(self):
        return self.src.fingerprint()

    def token_masks(self):
        return self.src.token_masks()

    def batches(self, *a, **kw):
        for b in self.src.batches(*a, **kw):
            self.clock.t += self.secs
            yield b


class Stamped(io.StringIO):
    """A stream recording the clock time of every line."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.times = clock, []

    def write(self, s):
        if s.strip():
            self.times.append(self.clock.t)
        return super().write(s)


def test_headless_run_prints_a_line_at_most_every_60_s(target, tiny_ds, tmp_path):
    model, _, _ = target
    c = cfg(max_steps=12, log_every=100)  # lines from the clock alone (and the last step)
    clock = FakeClock()
    src = TimedSource(make_source(tiny_ds, c), clock, 25.0)  # 25 s per step: 300 s in all
    out = Stamped(clock)
    _, rep = train_drafter(src, model, c, tmp_path, stream=out, tracking=[], clock=clock)
    lines = out.getvalue().splitlines()
    assert all(x.startswith("[train] step ") for x in lines)
    gaps = [b - a for a, b in zip([0.0] + out.times, out.times + [clock.t])]
    assert max(gaps) <= 60.0, gaps
    assert len(lines) >= int(12 * 25 / 60)
    steps = [int(re.match(r"\[train\] step (\d+)/12 ", x).group(1)) for x in lines]
    assert steps[-1] == 12 and rep["history"][-1]["step"] == 12
    last = rep["history"][-1]
    assert f"loss {last['loss']:.4f}" in lines[-1] and "ETA 0s" in lines[-1]
    assert (tmp_path / "train.log").read_text().splitlines() == lines


class Bar:
    def __init__(self, total, initial):
        self.post, self.n = [], initial

    def set_postfix(self, refresh=True, **kw):
        self.post.append(kw)

    def update(self, k):
        self.n += k

    def close(self):
        pass


def test_interactive_bar_shows_loss_and_prints_nothing(target, tiny_ds, tmp_path, capsys):
    model, _, _ = target
    bars = []

    def factory(total, initial):
        bars.append(Bar(total, initial))
        return bars[-1]

    c = cfg(log_every=4)
    _, rep = train_drafter(tiny_ds, model, c, tmp_path, progress=factory, tracking=[])
    assert capsys.readouterr().out == ""
    assert bars[0].n == 8
    assert bars[0].post[-1]["loss"] == f"{rep['history'][-1]['loss']:.4f}"
    assert len((tmp_path / "train.log").read_text().splitlines()) == 2  # steps 4, 8


def test_eval_leaves_weights_unchanged_and_best_is_argmax_tau(target, tiny_ds, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model, _, _ = target
    off, rep_off = train_drafter(
        tiny_ds, model, cfg(export_from="last"), tmp_path / "off", tracking=[], stream=None
    )
    ev = heldout(target, 3)
    c = cfg(export_from="last", eval_every=2, checkpoint_every=3, keep_last=2)
    on, rep_on = train_drafter(tiny_ds, model, c, tmp_path / "on", heldout=ev, stream=None)
    for k, v in off.state_dict().items():
        assert torch.equal(v, on.state_dict()[k]), k
    evals = [e for e in rep_on["history"] if "heldout" in e]
    assert [e["step"] for e in evals] == [2, 4, 6, 8]
    plain = {e["step"]: e["loss"] for e in rep_off["history"]}
    assert all(e["loss"] == plain[e["step"]] for e in rep_on["history"] if e["step"] in plain)
    taus = [e["heldout"]["tau"] for e in evals]
    best = rep_on["best"]
    assert best["step"] == evals[taus.index(max(taus))]["step"] and best["tau"] == max(taus)
    assert rep_on["returned"] == {"from": "last", "step": 8}
    # rotation: the last two committed steps (6, 8) plus best
    ck = tmp_path / "on" / "checkpoints"
    kept = sorted(p.name for p in ck.glob("step-*"))
    want = {"step-00000006", "step-00000008", f"step-{best['step']:08d}"}
    assert kept == sorted(want)
    assert distributed.latest_checkpoint(ck)["recent"] == ["step-00000006", "step-00000008"]
    # tensorboard holds the history's loss and the held-out tau
    ea = EventAccumulator(str(tmp_path / "on" / "tensorboard"))
    ea.Reload()
    tb_loss = {e.step: e.value for e in ea.Scalars("train/loss")}
    assert all(tb_loss[e["step"]] == pytest.approx(e["loss"], rel=1e-6) for e in evals)
    tb_tau = [(e.step, e.value) for e in ea.Scalars("heldout/tau")]
    assert tb_tau == [(e["step"], pytest.approx(e["heldout"]["tau"], rel=1e-6)) for e in evals]
    # export_from best: the returned drafter re-evaluates to the best tau
    c2 = cfg(export_from="best", eval_every=2)
    d2, rep2 = train_drafter(tiny_ds, model, c2, tmp_path / "best", heldout=ev, tracking=[])
    assert rep2["best"]["step"] == best["step"] and rep2["returned"]["step"] == best["step"]
    with isolated_rng():
        assert ev(d2)["tau"] == pytest.approx(best["tau"])


def test_heldout_eval_does_not_consume_the_rng(target):
    ev = heldout(target, 3)
    from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter

    model = target[0]
    c = DrafterConfig.for_target(model.config, 128, 3, None, None, None)
    d = Eagle3Drafter(c, model.get_input_embeddings().weight.detach().float())
    d.set_vocab(torch.arange(128) * 0, torch.ones(model.config.vocab_size, dtype=torch.bool))
    torch.manual_seed(5)
    before = torch.get_rng_state()
    with isolated_rng():
        res = ev(d)
        torch.randn(3)
    assert torch.equal(torch.get_rng_state(), before)
    assert len(res["step_acc"]) == 3 and 1.0 <= res["tau"] <= 4.0


def test_unknown_tracker_is_refused(target, tiny_ds, tmp_path):
    with pytest.raises(ValueError, match="unknown"):
        train_drafter(tiny_ds, target[0], cfg(), tmp_path, tracking=["neptune"])


class SlowSource(TimedSource):
    """A batch source that sleeps ``secs`` of real time before each batch (a slow loader)."""

    def batches(self, *a, **kw):
        import time

        for b in self.src.batches(*a, **kw):
            time.sleep(self.secs)
            yield b


def test_step_wait_seconds_is_the_time_the_loader_took(target, tiny_ds, tmp_path):
    """The loop's per-step batch wait holds at least the loader's own sleep, and is part of the step."""
    model, _, _ = target
    c = cfg(max_steps=3, log_every=100)
    src = SlowSource(make_source(tiny_ds, c), None, 0.3)
    _, rep = train_drafter(src, model, c, tmp_path, stream=None, tracking=[])
    w, s = rep["step_wait_seconds"], rep["step_seconds"]
    assert len(w) == len(s) == 3
    assert all(x >= 0.3 for x in w), w
    assert all(a <= b for a, b in zip(w, s)), (w, s)


def test_loader_workers_auto_takes_4_on_cuda_and_0_on_cpu():
    from eagle3nb.training.loop import loader_workers_for

    assert loader_workers_for(cfg(loader_workers=-1), "cpu") == 0
    assert loader_workers_for(cfg(loader_workers=-1), torch.device("cuda")) == 4
    assert loader_workers_for(cfg(loader_workers=2), "cuda:0") == 2
    with pytest.raises(ValueError, match="loader_workers=-2"):
        cfg(loader_workers=-2)


def test_heldout_tau_equals_the_literal_simulator(target, monkeypatch):
    """Held-out tau (replayed on the target's greedy states, cached after the first call) equals
    the literal per-cycle simulator's, counter for counter, for a drafter with planted misses (a
    fake draft chain, tests only: long accepted runs) and for a random-init drafter; a second call
    (cached states) gives the same."""
    from eagle3nb.drafter import acceptance, ksweep, shared_eval
    from eagle3nb.drafter.acceptance import evaluate_acceptance
    from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
    from testkit import counts_by_chains, planted_draft_chain

    model, tok, _ = target
    ev = heldout(target, 3)
    greedy = {tuple(p): ksweep.greedy_unstopped(model, p, 12 + 3 + 2) for p in ev.prompts}

    # misses at 3, 0, 2, 4, 1, ...: the counts vary with the state
    fake_draft_chain = planted_draft_chain(greedy, lambda j, k: (j * 7 + 3) % (k + 2))

    torch.manual_seed(0)
    c = DrafterConfig.for_target(model.config, 512)
    d = Eagle3Drafter(c, model.get_input_embeddings().weight.detach().float()).eval()
    keys = ("tau", "per_position_acceptance", "cycles")
    with monkeypatch.context() as m:
        m.setattr(acceptance, "draft_chain", fake_draft_chain)
        m.setattr(shared_eval, "accepted_counts", counts_by_chains(fake_draft_chain))
        lit = evaluate_acceptance(model, d, ev.prompts, [1, 2, 4], 3, 12, None, check_greedy=False)
        assert lit["tau"] > 2  # the planted drafter accepts long runs
        for _ in range(2):
            r = ev(d)
            assert [r[x] for x in keys] == [lit[x] for x in keys]
    lit = evaluate_acceptance(model, d, ev.prompts, [1, 2, 4], 3, 12, None, check_greedy=False)
    r = ev(d)
    assert [r[x] for x in keys] == [lit[x] for x in keys]
