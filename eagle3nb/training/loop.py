"""Training of the EAGLE-3 drafter with training-time test, in one process or data parallel under
torchrun (DDP, or FSDP for large drafters), CPU or GPU.

AdamW with linear warmup then cosine decay, gradient clipping. Batches come from a batch source
(:class:`BatchSource`): :class:`eagle3nb.training.batches.OfflineSource` streams stored shards; an online
source may compute aux states with the target inside the loop. ``batch_size`` is the GLOBAL batch:
every rank trains on its slice, each step's loss is normalised by the global count of scored
positions, so N processes train the same weights as one (up to float summation order).

A checkpoint (model, optimizer, scheduler, RNG, step = data position; per rank) is written every
``checkpoint_every`` steps and at the end, and a rerun resumes from it.

Command line (one process, or one per GPU under torchrun)::

    python -m eagle3nb.steps.train.step outputs/<run>            # the run's params.yaml
    python -m eagle3nb.steps.train.step params/default.yaml --set max_steps=200
    torchrun --nproc_per_node 2 -m eagle3nb.steps.train.step params/default.yaml
"""

from __future__ import annotations


import math
import os
import signal
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import torch

from eagle3nb import threads
from eagle3nb.training import distributed
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.drafter.mla import MLAConfig, make_drafter
from eagle3nb.training.batches import add_aux_noise, loader_workers_for, make_source  # noqa: F401 (re-exported)
from eagle3nb.training.fastpath import COMPILE, PRECISIONS, resolve
from eagle3nb.training.objective import TTTObjective
from eagle3nb.target.capture import final_norm_of
from eagle3nb.drafter.vocab import build_draft_vocab, count_loss_tokens, coverage


@dataclass
class TrainConfig:
    """Training settings (units: steps = optimizer steps; lr in 1/step-size units of AdamW).

    A field that is also a run parameter has the default of ``eagle3nb.params.RunParams`` (the
    notebooks' smoke run; tests/test_parameter_surface.py checks they agree; this layer does not
    import params). The others (``min_lr_ratio``, ``grad_clip``, ``bucket_window``) are set here
    only. ``log_every``, ``eval_every``, ``keep_last`` and ``export_from`` change what is logged,
    kept and returned, not the weights trained.
    """

    draft_vocab_size: int = 256
    draft_num_heads: int = 2  # 0 = the target's head count
    draft_num_kv_heads: int = 2  # 0 = min(heads, target's kv heads)
    draft_intermediate_size: int = 0  # 0 = the target's MLP width
    norm_before_fc: bool = False  # drafter variant: RMSNorm over the aux concat before fc
    norm_output: bool = False  # drafter variant (EAGLE-3.1): next step reads the normed state
    fc_norm: bool = False  # drafter variant (EAGLE-3.1): one RMSNorm per aux state before fc
    drafter_head: str = "llama"  # llama (GQA attention) or mla (DeepSeek/Kimi: drafter/mla.py)
    ttt_steps: int = 7
    loss_decay: float = 0.8
    batch_size: int = 8
    max_steps: int = 100
    lr: float = 3e-3
    warmup_steps: int = 5
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    aux_noise: float = 0.0  # std of Gaussian noise added to aux states, relative to their std
    init_head_from_target: bool = True  # lm_head rows and final norm start from the target's
    seed: int = 0
    checkpoint_every: int = 200
    log_every: int = 10
    bucket_by_length: bool = (
        True  # global batches of similar lengths (less padding); False = plain shuffle
    )
    bucket_window: int = 16  # global batches per length-sorting window
    loader_workers: int = -1  # DataLoader processes (0 = in this process; -1 = 4 on CUDA, else 0)
    fsdp: str = "auto"  # under torchrun: on, off, or auto (FSDP when the drafter is large)
    attention: str = "auto"  # TTT attention: eager (reference), flex (same function; fast on GPU), auto (flex on CUDA)
    precision: str = (
        "auto"  # float32, bf16-mixed (float32 master weights), auto (bf16-mixed on CUDA)
    )
    torch_compile: str = (
        "auto"  # compiled layer and loss: on, off, auto (on for CUDA); see fastpath
    )
    eval_every: int = 10  # steps between held-out evaluations (0 = none; needs a HeldoutEval)
    keep_last: int = 1  # step checkpoints kept (the best one is kept besides)
    export_from: str = "best"  # the drafter returned: best (highest held-out tau) or last

    def __post_init__(self):
        for name in (
            "ttt_steps",
            "batch_size",
            "max_steps",
            "checkpoint_every",
            "log_every",
            "bucket_window",
            "keep_last",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr}: must be > 0")
        if self.precision not in PRECISIONS or self.torch_compile not in COMPILE:
            raise ValueError(
                f"precision={self.precision!r}, torch_compile={self.torch_compile!r}: use one of "
                f"{PRECISIONS} and one of {COMPILE}"
            )
        if self.drafter_head not in ("llama", "mla"):
            raise ValueError(f"drafter_head={self.drafter_head!r}: use llama or mla")
        if self.attention not in ("auto", "eager", "flex"):
            raise ValueError(f"attention={self.attention!r}: use auto, eager or flex")
        if self.fsdp not in ("auto", "on", "off"):
            raise ValueError(f"fsdp={self.fsdp!r}: use auto, on or off")
        if self.export_from not in ("best", "last"):
            raise ValueError(f"export_from={self.export_from!r}: use best or last")
        if self.loader_workers < -1:
            raise ValueError(
                f"loader_workers={self.loader_workers}: use -1 (auto), 0 (load in the training process) or a worker count"
            )
        if self.eval_every < 0:
            raise ValueError(f"eval_every={self.eval_every}: must be >= 0 (0 = no evaluation)")

    def identity(self) -> dict:
        """The settings a checkpoint must share to be resumed (all but loader workers, FSDP,
        attention, precision and compilation, which change how, not what, is computed (master
        weights are float32 either way), and the evaluation, rotation and export settings, which
        change neither). The drafter variant flags count only when set (checkpoints made before
        they existed resume as the plain drafter they are)."""
        how = ("loader_workers", "fsdp", "attention", "precision", "torch_compile")
        how += ("eval_every", "keep_last", "export_from")
        d = {k: v for k, v in asdict(self).items() if k not in how}
        return {
            k: v
            for k, v in d.items()
            if (v or k not in ("norm_before_fc", "norm_output", "fc_norm"))
            and (k, v) != ("drafter_head", "llama")
        }


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the base lr: linear warmup to 1 over ``warmup`` steps, then cosine to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac))


def init_head_from_target(d: Eagle3Drafter, target) -> bool:
    """Start ``lm_head`` (the draft-vocab rows) and the final norm from the target's own readout, as
    speculators does: the drafter then only has to predict the target's next pre-norm state.
    Returns False (and changes nothing) when the hidden sizes differ."""
    head = target.get_output_embeddings().weight.detach().float().cpu()  # [vocab, Ht]
    if head.shape[1] != d.config.hidden_size:
        return False
    d.lm_head.weight.data.copy_(head[torch.arange(d.config.draft_vocab_size) + d.d2t])
    d.norm.weight.data.copy_(final_norm_of(target).weight.detach().float().cpu())
    return True


def build_drafter(ds, target, cfg: TrainConfig) -> tuple[Eagle3Drafter, dict]:
    """A fresh seeded drafter for ``target`` with its draft vocab built from the loss-bearing
    tokens of ``ds`` (an :class:`eagle3nb.dataset.read.AuxDataset` or a :class:`BatchSource`).
    Returns ``(drafter, vocab_info)``."""
    torch.manual_seed(cfg.seed)
    n_aux = getattr(ds, "n_aux", None) or len(ds.manifest["aux_boundaries"])
    heads, mlp = cfg.draft_num_heads or None, cfg.draft_intermediate_size or None
    if cfg.drafter_head == "mla":  # MLA ranks and rope from the target (refuses a non-MLA one)
        c = MLAConfig.for_target(
            target.config.get_text_config(), cfg.draft_vocab_size, n_aux, num_attention_heads=heads,
            intermediate_size=mlp,
        )  # fmt: skip
    else:
        c = DrafterConfig.for_target(
            target.config.get_text_config(),  # wrappers: the text model's widths
            cfg.draft_vocab_size, n_aux, heads, cfg.draft_num_kv_heads or None, mlp,
        )  # fmt: skip
    c = replace(
        c, norm_before_fc=cfg.norm_before_fc, norm_output=cfg.norm_output, fc_norm=cfg.fc_norm
    )
    d = make_drafter(c, target.get_input_embeddings().weight.detach().float().cpu())
    counts = count_loss_tokens(ds.token_masks(), c.vocab_size)
    d2t, t2d = build_draft_vocab(counts, cfg.draft_vocab_size)
    d.set_vocab(d2t, t2d)
    if cfg.init_head_from_target:
        init_head_from_target(d, target)
    return d, {
        "distinct_loss_tokens": int((counts > 0).sum()),
        "coverage": coverage(counts, t2d),
        "loss_tokens": int(counts.sum()),
    }


# fault injection for tests: "RANK:STEP" makes that rank SIGKILL itself right after STEP
FAULT_ENV = "EAGLE3NB_FAULT_AT_STEP"


def train_drafter(
    data,
    target,
    cfg: TrainConfig,
    out_dir: str | os.PathLike,
    progress=None,
    heldout=None,
    tracking: Sequence[str] = ("tensorboard",),
    stream="auto",
    clock=time.monotonic,
    init: dict | None = None,
) -> tuple[Eagle3Drafter, dict]:
    """Train a drafter and return ``(drafter, report)``; under torchrun every rank calls it.

    Args:
        data: a :class:`BatchSource`, or an :class:`eagle3nb.dataset.read.AuxDataset` (either
            mode; read through :func:`make_source`).
        target: the target model (its embeddings, final norm and lm_head; training runs on its device).
        out_dir: holds ``checkpoints/`` (step folders, ``latest.json``, ``best.json``),
            ``train.log`` (the progress lines) and the trackers' files (``tensorboard/``).
        progress: a tqdm-like factory, used on rank 0 (the bar's postfix shows the loss).
        heldout: an :class:`eagle3nb.training.heldout.HeldoutEval`, run every ``cfg.eval_every``
            steps and at the end (None: no held-out evaluation, no ``best`` checkpoint).
        tracking: tracker names (:data:`eagle3nb.training.progress.TRACKERS`).
        stream: where rank 0 prints progress lines; ``auto``: stdout without ``progress``, none
            with it (lines then go to ``train.log`` only).
        clock: monotonic seconds for the progress lines (a line at least every 60 s of it).
        init: start from a drafter someone else trained (03's ``init_from``): the plan of
            :func:`eagle3nb.training.init_from.adoption_plan`, recorded in ``report["init_from"]``
            and in the checkpoints (a checkpoint of another start is not resumed).

    ``report`` holds ``history`` (per logged step: step, loss, lr, per-TTT-step loss and accuracy,
    all over the global batch, and ``heldout`` at evaluated steps), ``vocab`` info,
    ``tokens_per_s`` (loss-bearing tokens x TTT steps / s, all ranks), ``seconds`` (of the whole
    training, summed over resumed runs), ``empty_batches`` (global batches with no loss-bearing
    position: counted, no optimizer update), ``world_size``, ``parallel`` (single, ddp or fsdp),
    ``padding`` (offline sources), ``step_seconds`` / ``step_token_steps`` (wall time and global
    loss-token-steps of each step of this call; the first steps include warm-up, a checkpoint step
    its write, an evaluated step its evaluation), ``step_wait_seconds`` (of each step, the time
    spent in the batch source's ``next()``: the loader's exposed time offline, the target's
    capture online),
    ``best`` (best.json or None), ``returned``
    (``{"from": best|last, "step"}``: the weights returned) and ``eval_seconds``.
    Resumes from the committed checkpoint when it exists with the same config and data.

    Raises:
        ValueError: a checkpoint with another config or dataset (before any step); an unknown
            tracker.
    """
    from eagle3nb.training.heldout import evaluate_during_training
    from eagle3nb.training.monitor import TrainMonitor

    ctx = distributed.current()
    source = (
        data
        if hasattr(data, "batches") and not hasattr(data, "configure")
        else make_source(data, cfg, next(target.parameters()).device)
    )
    ckdir = Path(out_dir) / "checkpoints"
    if ctx.is_main:
        ckdir.mkdir(parents=True, exist_ok=True)
    if init is None:
        drafter, vocab = build_drafter(source, target, cfg)
    else:  # its weights, vocabulary and flags (eagle3nb.training.init_from)
        from eagle3nb.training.init_from import adopt_drafter

        drafter, vocab = adopt_drafter(init, source, target, cfg)
    # train where the target lives (its norm/lm_head give the labels)
    dev = next(target.parameters()).device
    attn = cfg.attention if cfg.attention != "auto" else ("flex" if dev.type == "cuda" else "eager")
    drafter.set_attention(attn)  # same function either way (test_drafter_attention.py)
    fast = resolve(cfg.precision, cfg.torch_compile, dev)
    objective = TTTObjective(
        drafter,
        final_norm_of(target),
        target.get_output_embeddings(),
        cfg.ttt_steps,
        cfg.loss_decay,
    ).to(dev)
    n_trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    sharded = distributed.use_fsdp(cfg.fsdp, n_trainable, ctx)
    fast.setup(objective, sharded)
    model, mode = distributed.wrap(objective, sharded, ctx)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = fast.optimizer(params, cfg.lr, cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_lambda(s, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
    )
    step, history, empty_batches = 0, [], 0
    prev_secs, prev_tokens = 0.0, 0  # training time and token-steps of earlier (interrupted) runs
    expect = {"config": cfg.identity(), "data": source.fingerprint()}
    if init is not None:
        expect["init_from"] = init["sha256"] + (" moved" if init["moved"] else "")
    extra = distributed.load_checkpoint(ckdir, model, opt, ctx, expect)
    if extra is not None:
        sched.load_state_dict(extra["scheduler"])
        step, history, empty_batches = extra["step"], extra["history"], extra["empty_batches"]
        prev_secs, prev_tokens = extra["seconds"], extra["token_steps"]
    best = distributed.best_checkpoint(ckdir) if extra is not None else None
    count_reduce = ctx.sum if ctx.world > 1 else None
    fault = (
        tuple(int(x) for x in os.environ[FAULT_ENV].split(":"))
        if os.environ.get(FAULT_ENV)
        else None
    )
    model.train()
    t0, tokens = time.time(), 0
    step_seconds, step_tokens, t_prev = [], [], t0  # per step of this run (for benchmarks)
    wait_seconds = []  # per step: time in the source's next() (loader, or capture when online)
    evaluate = None
    if heldout is not None:
        evaluate = lambda: evaluate_during_training(heldout, model, drafter, mode, ctx, dev)  # noqa: E731
    mon = TrainMonitor(cfg, ctx, out_dir, step, progress, evaluate, tracking, stream, clock, best)
    mon.status = getattr(source, "progress_status", None)  # engine-fed online: the prefetch queue
    batches = iter(source.batches(step, cfg.max_steps, ctx.rank, ctx.world, dev.type == "cuda"))
    rebalance = threads.Rebalancer(cpu=dev.type == "cpu")  # fewer threads beside other work
    while True:
        rebalance.tick(step)
        w0 = time.time()
        b = next(batches, None)
        if b is None:
            break
        wait_seconds.append(time.time() - w0)
        if cfg.aux_noise > 0:
            b["aux"] = add_aux_noise(b, step, cfg.seed, cfg.aux_noise)
        b = fast.prepare({k: v.to(dev, non_blocking=True) for k, v in b.items()})
        with fast.autocast(dev):
            r = model(b, count_reduce)
        opt.zero_grad(set_to_none=True)
        # DDP and FSDP average gradients over ranks; each rank's loss is its share of the global
        # mean, so scale by the world size to get the one-process gradient of the global batch
        (r.loss * ctx.world if ctx.world > 1 else r.loss).backward()
        if sum(r.step_total) == 0:
            empty_batches += 1  # nothing loss-bearing anywhere: no update (AdamW would drift)
            with warnings.catch_warnings():  # the schedule still advances: one step = one batch
                warnings.simplefilter("ignore", UserWarning)
                sched.step()
        else:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            sched.step()
        step += 1
        tokens += sum(r.step_total)
        t_now = time.time()  # ttt_loss synchronised with the device when it returned its stats
        step_seconds.append(t_now - t_prev)
        step_tokens.append(sum(r.step_total))
        t_prev = t_now
        last = step == cfg.max_steps
        e0 = mon.eval_seconds
        commit = mon.after_step(step, r, sched.get_last_lr()[0], tokens, history)
        t_prev += mon.eval_seconds - e0  # a held-out evaluation is not part of a step's time
        if step % cfg.checkpoint_every == 0 or last:
            commit = ["latest"] + commit
        if commit:
            st = {
                "config": cfg.identity(),
                "data": source.fingerprint(),
                "scheduler": sched.state_dict(),
                "step": step,
                "position": source.plan.position(step) if hasattr(source, "plan") else None,
                "history": history,
                "empty_batches": empty_batches,
                "seconds": prev_secs + time.time() - t0,
                "token_steps": prev_tokens + tokens,
                "world_size": ctx.world,
                **{k: v for k, v in expect.items() if k == "init_from"},
            }
            distributed.save_checkpoint(
                ckdir,
                step,
                model,
                opt,
                st,
                ctx,
                mode,
                commit=tuple(commit),
                keep_last=cfg.keep_last,
                best_tau=mon.best["tau"] if "best" in commit else None,
            )
        if fault == (ctx.rank, step):
            os.kill(os.getpid(), signal.SIGKILL)  # injected kill -9 of this rank (resume tests)
        mon.bar_step()
    mon.close()
    secs, tokens = (
        prev_secs + time.time() - t0,
        prev_tokens + tokens,
    )  # whole training, across resumes
    train_secs = secs - mon.eval_seconds  # throughput without this call's held-out evaluations
    best = distributed.best_checkpoint(ckdir) if heldout is not None else None
    returned = {"from": "last", "step": step}
    if cfg.export_from == "best" and best is not None and best["step"] != step:
        distributed.load_weights(ckdir, best["dir"], model, ctx)  # after the last checkpoint
        returned = {"from": "best", "step": best["step"]}
    elif cfg.export_from == "best" and best is not None:
        returned["from"] = "best"
    if mode == "fsdp":  # gather the shards into a plain drafter (every rank takes part)
        full = distributed.unwrap_full_state(model)  # rank 0 only (the others get {})
        drafter = make_drafter(drafter.config)
        if ctx.is_main:
            drafter.load_state_dict({k.removeprefix("drafter."): v for k, v in full.items()})
    drafter.eval()
    rep = {
        "history": history,
        "init_from": vocab.pop("init_from", None),
        "vocab": vocab,
        "seconds": secs,
        "tokens_per_s": tokens / train_secs if train_secs > 0 else None,
        "steps": step,
        "empty_batches": empty_batches,
        "world_size": ctx.world,
        "parallel": mode,
        "step_seconds": step_seconds,
        "step_token_steps": step_tokens,
        "step_wait_seconds": wait_seconds,
        "thread_changes": rebalance.changes,
        "best": best,
        "returned": returned,
        "eval_seconds": mon.eval_seconds,
        "fast_path": {
            "precision": fast.precision,
            "compile": fast.compile,
            "fused": fast.fused_adamw,
        },
    }
    if hasattr(source, "padding"):
        rep["padding"] = source.padding(ctx.world)
    return drafter, rep
