"""Offline training of the EAGLE-3 drafter with training-time test (single process, CPU or GPU).

AdamW with linear warmup then cosine decay, gradient clipping, seeded shuffling; a checkpoint
(model, optimizer, scheduler, RNG, step) is written atomically every ``checkpoint_every`` steps and
at the end, and a rerun resumes from it.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .dataset import AuxDataset, collate
from .drafter import DrafterConfig, Eagle3Drafter
from .objective import ttt_loss
from .vocab import build_draft_vocab, count_loss_tokens, coverage

__all__ = ["TrainConfig", "build_drafter", "init_head_from_target", "train_drafter", "lr_lambda"]


@dataclass
class TrainConfig:
    """Training settings (units: steps = optimizer steps; lr in 1/step-size units of AdamW)."""

    draft_vocab_size: int = 256
    draft_num_heads: int = 0  # 0 = the target's head count
    draft_num_kv_heads: int = 0  # 0 = min(heads, target's kv heads)
    draft_intermediate_size: int = 0  # 0 = the target's MLP width
    ttt_steps: int = 7
    loss_decay: float = 0.8
    batch_size: int = 16
    max_steps: int = 400
    lr: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    aux_noise: float = 0.0  # std of Gaussian noise added to aux states, relative to their std
    init_head_from_target: bool = True  # lm_head rows and final norm start from the target's
    seed: int = 0
    checkpoint_every: int = 200
    log_every: int = 10

    def __post_init__(self):
        for name in ("ttt_steps", "batch_size", "max_steps", "checkpoint_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr}: must be > 0")


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
    d.norm.weight.data.copy_(target.model.norm.weight.detach().float().cpu())
    return True


def build_drafter(ds: AuxDataset, target, cfg: TrainConfig) -> tuple[Eagle3Drafter, dict]:
    """A fresh seeded drafter for ``target`` with its draft vocab built from the dataset's
    loss-bearing tokens. Returns ``(drafter, vocab_info)``."""
    torch.manual_seed(cfg.seed)
    n_aux = len(ds.manifest["aux_boundaries"])
    c = DrafterConfig.for_target(target.config, cfg.draft_vocab_size, n_aux, cfg.draft_num_heads or None, cfg.draft_num_kv_heads or None, cfg.draft_intermediate_size or None)
    d = Eagle3Drafter(c, target.get_input_embeddings().weight.detach().float().cpu())
    counts = count_loss_tokens(((x["input_ids"], x["loss_mask"]) for x in ds.items), c.vocab_size)
    d2t, t2d = build_draft_vocab(counts, cfg.draft_vocab_size)
    d.set_vocab(d2t, t2d)
    if cfg.init_head_from_target:
        init_head_from_target(d, target)
    return d, {"distinct_loss_tokens": int((counts > 0).sum()), "coverage": coverage(counts, t2d), "loss_tokens": int(counts.sum())}


def _batch(ds, idx: list[int], dev) -> dict:
    """One training batch on ``dev``: a source's own ``batch`` (online: the target captures it now,
    see :class:`eagle3nb.online.OnlineSource`), else the stored samples collated."""
    if hasattr(ds, "batch"):
        return ds.batch(idx, dev)
    return {k: v.to(dev) for k, v in collate([ds[i] for i in idx]).items()}


def _save_ckpt(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train_drafter(ds: AuxDataset, target, cfg: TrainConfig, out_dir: str | os.PathLike, progress=None) -> tuple[Eagle3Drafter, dict]:
    """Train a drafter on ``ds`` and return ``(drafter, report)``.

    ``report`` holds ``history`` (per logged step: step, loss, lr, per-TTT-step loss and accuracy),
    ``vocab`` info, ``tokens_per_s`` (loss-bearing tokens x TTT steps / s), ``seconds`` (of the
    whole training, summed over resumed runs) and
    ``empty_batches`` (batches with no loss-bearing position: counted, no optimizer update).
    Resumes from ``out_dir/checkpoints/last.pt`` when it exists with the same config.

    Raises:
        ValueError: the dataset has fewer samples than one batch; a checkpoint with another config.
    """
    if len(ds) < 1:
        raise ValueError("dataset has no samples; check 02b's skipped counts")
    bs = min(cfg.batch_size, len(ds))
    out = Path(out_dir)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoints" / "last.pt"
    drafter, vocab = build_drafter(ds, target, cfg)
    dev = next(target.parameters()).device  # train where the target lives (its norm/lm_head give the labels)
    drafter.to(dev)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio))
    gen = torch.Generator().manual_seed(cfg.seed)
    noise_gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, history, order, pos = 0, [], [], 0
    prev_secs, prev_tokens = 0.0, 0  # training time and token-steps of earlier (interrupted) runs
    if ckpt.exists():
        st = torch.load(ckpt, weights_only=False, map_location=dev)
        if st["config"] != asdict(cfg) or st.get("data") != ds.fingerprint():
            raise ValueError(f"checkpoint {ckpt} was made with another training config or dataset; delete {ckpt.parent} or use another run_name")
        drafter.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        gen.set_state(st["rng"].cpu())
        noise_gen.set_state(st["noise_rng"].cpu())
        step, history, order, pos = st["step"], st["history"], st["order"], st["pos"]
        prev_secs, prev_tokens = st.get("seconds", 0.0), st.get("token_steps", 0)
    norm, head = target.model.norm, target.lm_head
    drafter.train()
    t0, tokens, empty_batches = time.time(), 0, 0
    bar = progress(total=cfg.max_steps, initial=step) if progress else None
    while step < cfg.max_steps:
        if pos + bs > len(order):
            order, pos = torch.randperm(len(ds), generator=gen).tolist(), 0
        b = _batch(ds, order[pos : pos + bs], dev)
        pos += bs
        aux = b["aux"]
        if cfg.aux_noise > 0:  # feature noise, as EAGLE's training adds to hidden states
            aux = aux + cfg.aux_noise * aux.std() * torch.randn(aux.shape, generator=noise_gen).to(dev)  # CPU rng: same noise on any device
        r = ttt_loss(drafter, b["input_ids"], aux, b["final"], b["loss_mask"], b["attn_mask"], norm, head, cfg.ttt_steps, cfg.loss_decay)
        opt.zero_grad(set_to_none=True)
        if sum(r.step_count) == 0:
            empty_batches += 1  # nothing loss-bearing: no update (AdamW would still decay and drift)
            with warnings.catch_warnings():  # the schedule still advances: one step = one batch
                warnings.simplefilter("ignore", UserWarning)
                sched.step()
        else:
            r.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            sched.step()
        step += 1
        tokens += sum(r.step_count)
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            history.append({"step": step, "loss": float(r.loss.detach()), "lr": sched.get_last_lr()[0], "step_loss": r.step_loss, "step_acc": r.step_acc})
        if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
            _save_ckpt(ckpt, {"config": asdict(cfg), "data": ds.fingerprint(), "model": drafter.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": gen.get_state(), "noise_rng": noise_gen.get_state(), "step": step, "history": history, "order": order, "pos": pos, "seconds": prev_secs + time.time() - t0, "token_steps": prev_tokens + tokens})
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    secs, tokens = prev_secs + time.time() - t0, prev_tokens + tokens  # whole training, across resumes
    drafter.eval()
    return drafter, {"history": history, "vocab": vocab, "seconds": secs, "tokens_per_s": tokens / secs if secs > 0 else None, "steps": step, "empty_batches": empty_batches}
