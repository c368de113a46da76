"""What the training loop does after each optimizer step besides training: the history entry,
progress lines and tracker scalars, the held-out evaluation and the ``best`` decision.

:class:`TrainMonitor` is called by :func:`eagle3nb.training.loop.train_drafter` on every rank
(the numbers of a line are all-reduced, so every rank takes part when one is due; rank 0 alone
prints, writes and tracks). It never touches the weights, the optimizer or the RNG streams.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from eagle3nb.training.progress import ProgressLog, Tracker

__all__ = ["TrainMonitor"]


class TrainMonitor:
    """Logging, tracking and held-out evaluation of one training call.

    Args:
        cfg: the :class:`eagle3nb.training.loop.TrainConfig` (max_steps, log_every, eval_every,
            ttt_steps); ctx: the :class:`eagle3nb.training.distributed.DistContext`.
        out_dir: the training folder (``train.log``, ``tensorboard/``); its parent's name is the
            run name given to trackers.
        start: the step this call starts from; progress: a tqdm-like factory or None.
        evaluate: ``() -> dict`` running one held-out evaluation on every rank (``tau`` on every
            rank, the whole result on rank 0), or None for no evaluation.
        tracking: tracker names; stream: ``auto`` (stdout without a bar), a text stream or None.
        clock: monotonic seconds (progress lines at least every 60 s of it).
        best: the committed ``best.json`` of a resumed run, or None.
    """

    def __init__(
        self,
        cfg,
        ctx,
        out_dir: str | os.PathLike,
        start: int,
        progress=None,
        evaluate: Optional[Callable[[], dict]] = None,
        tracking: Sequence[str] = ("tensorboard",),
        stream="auto",
        clock: Callable[[], float] = time.monotonic,
        best: Optional[dict] = None,
    ):
        self.cfg, self.ctx, self.evaluate, self.best = cfg, ctx, evaluate, best
        bar = progress(total=cfg.max_steps, initial=start) if progress and ctx.is_main else None
        self.log = ProgressLog(
            cfg.max_steps,
            start,
            cfg.log_every,
            stream=(None if progress else sys.stdout) if stream == "auto" else stream,
            log_file=Path(out_dir) / "train.log",
            bar=bar,
            clock=clock,
            enabled=ctx.is_main,
        )
        run = Path(out_dir).resolve().parent.name
        self.tracker = Tracker(tracking, out_dir, run, cfg.identity(), ctx.is_main)
        for b, why in self.tracker.skipped.items():
            self.log.write(f"[train] tracking: {b} skipped: {why}")
        self.eval_seconds = 0.0
        self.status = None  # () -> str appended to progress lines (an online source's queue)

    def after_step(self, step: int, r, lr: float, tokens: int, history: list) -> list[str]:
        """Account for optimizer step ``step`` (1-based) with TTT result ``r`` (this rank's
        shares), learning rate ``lr`` and ``tokens`` (global loss-token-steps of this call so
        far): append the history entry when due (every ``log_every`` steps, the last step, an
        evaluated step), print a line when due or when 60 s passed, evaluate when due. Every rank
        must call it. Returns the checkpoint pointers this step earns besides ``latest``:
        ``["best"]`` after a new best held-out tau, else ``[]``."""
        cfg, ctx = self.cfg, self.ctx
        last = step == cfg.max_steps
        evaluate = (
            self.evaluate is not None
            and cfg.eval_every > 0
            and (step % cfg.eval_every == 0 or last)
        )
        due = step % cfg.log_every == 0 or last or evaluate
        timed = self.log.time_due()
        if ctx.world > 1:  # rank 0's clock decides for all (the line needs a collective)
            timed = bool(ctx.sum(torch.tensor([float(timed)]))[0] > 0)
        self.last_loss = None
        if not (due or timed):
            return []
        v = ctx.sum(
            torch.tensor([float(r.loss.detach())] + r.step_loss + r.step_acc, dtype=torch.float64)
        )
        k = cfg.ttt_steps
        entry = {
            "step": step,
            "loss": v[0].item(),
            "lr": lr,
            "step_loss": v[1 : 1 + k].tolist(),
            "step_acc": v[1 + k :].tolist(),
        }
        self.last_loss = entry["loss"]
        if due:
            history.append(entry)
        self.log.step_line(entry, tokens, self.status() if self.status is not None else "")
        tps = tokens / max(self.log.clock() - self.log.t0, 1e-9)
        self.tracker.scalars(step, _train_scalars(entry, tps))
        if not evaluate:
            return []
        t0 = time.time()
        res = self.evaluate()
        self.eval_seconds += time.time() - t0
        new = self.best is None or res["tau"] > self.best["tau"]
        if new:
            self.best = {"step": step, "tau": res["tau"]}
        if ctx.is_main:
            entry["heldout"] = res
            self.tracker.scalars(step, _heldout_scalars(res))
            self.log.heldout_line(step, res, self.best)
        return ["best"] if new else []

    def bar_step(self) -> None:
        """Advance the bar (rank 0) with the last logged loss in its postfix."""
        self.log.bar_step(self.last_loss)

    def close(self) -> None:
        """Close the bar, the log file and the trackers."""
        self.log.close()
        self.tracker.close()


def _train_scalars(e: dict, tokens_per_s: float) -> dict:
    """Tracker scalars of a history entry."""
    out = {"train/loss": e["loss"], "train/lr": e["lr"], "train/tokens_per_s": tokens_per_s}
    out.update({f"train/acc_ttt{j}": a for j, a in enumerate(e["step_acc"])})
    return out


def _heldout_scalars(res: dict) -> dict:
    """Tracker scalars of a held-out evaluation."""
    out = {"heldout/tau": res["tau"], "heldout/loss": res["loss"]}
    out.update({f"heldout/acc_ttt{j}": a for j, a in enumerate(res["step_acc"])})
    pos = res["per_position_acceptance"]
    out.update({f"heldout/accept_pos{i + 1}": a for i, a in enumerate(pos)})
    return out
