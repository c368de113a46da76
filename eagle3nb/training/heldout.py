"""Held-out evaluation during training: teacher-forced accuracy per TTT step and the simulator's
acceptance length tau on a few samples the drafter never trains on.

The samples are 01's held-out prompts with the target's own continuations (not a slice of the
training samples, so the training batches are the same with evaluation on or off). Their aux
states are captured once by the HF target at the trained boundaries (the capture the simulator
uses; for an SGLang- or vLLM-captured dataset the alignment checks of 02 make them the same
boundaries). tau is the greedy chain run with k drafts per cycle over the same prompts, replayed
on one target forward per prompt (:mod:`eagle3nb.drafter.shared_eval`: the target's greedy
continuation and its states are computed at the first evaluation and reused, since the target does
not change during training; each evaluation runs only the drafter). It equals
:func:`eagle3nb.drafter.acceptance.evaluate_acceptance`'s up to floating point.

An evaluation never touches the training state: it runs on a copy of the drafter, inside a forked
torch RNG (CPU and the training GPU) with Python's ``random`` state restored, so a run with
evaluation on trains the same weights as one with it off (``tests/training/test_heldout.py``).
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Sequence

import torch

from eagle3nb.drafter.acceptance import AcceptanceStats
from eagle3nb.drafter.shared_eval import greedy_states, walk
from eagle3nb.drafter.model import Eagle3Drafter
from eagle3nb.drafter.mla import make_drafter
from eagle3nb.padding import pad_right
from eagle3nb.target.capture import capture_boundaries, final_norm_of, n_layers_of
from eagle3nb.target.models import as_stop_list
from eagle3nb.training.objective import ttt_loss

__all__ = ["HeldoutEval", "isolated_rng", "plain_copy"]


@contextlib.contextmanager
def isolated_rng(device: torch.device | str = "cpu"):
    """Run the block on forked torch RNG states (CPU, and ``device`` when it is a GPU) and with
    Python's ``random`` state restored afterwards: the training RNG stream is left as it was."""
    dev = torch.device(device)
    devices = [dev.index or 0] if dev.type == "cuda" else []
    state = random.getstate()
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(state)


def plain_copy(drafter: Eagle3Drafter, device, state: dict | None = None) -> Eagle3Drafter:
    """An unwrapped copy of ``drafter`` on ``device``, in eval mode, with ``state`` (a full state
    dict, e.g. gathered from FSDP shards; None: the drafter's own). Consumes RNG (the fresh
    module's init): call it inside :func:`isolated_rng`."""
    sd = drafter.state_dict() if state is None else state
    c = make_drafter(drafter.config)  # the same head class (Llama or MLA)
    c.load_state_dict({k: v.detach().clone() for k, v in sd.items()})
    return c.to(device).eval()


def evaluate_during_training(heldout, model, drafter, mode: str, ctx, device) -> dict:
    """One held-out evaluation inside the training loop; every rank must call it.

    Args:
        heldout: a :class:`HeldoutEval` (used on rank 0 only); model: the wrapped training module
            (:class:`eagle3nb.training.objective.TTTObjective`, maybe DDP/FSDP); drafter: the
            drafter inside it; mode: single, ddp or fsdp; ctx: the
            :class:`eagle3nb.training.distributed.DistContext`; device: the training device.

    Returns:
        :meth:`HeldoutEval.__call__`'s dict on rank 0; on every rank ``tau`` (broadcast from rank
        0, so all ranks take the same best-checkpoint decision). The training state (weights,
        optimizer, RNG streams, train/eval mode) is untouched.
    """
    from eagle3nb.training import distributed

    with isolated_rng(device):
        full = distributed.unwrap_full_state(model) if mode == "fsdp" else None
        res = {"tau": 0.0}
        if ctx.is_main:
            sd = {k.removeprefix("drafter."): v for k, v in full.items()} if full else None
            res = heldout(plain_copy(drafter, device, sd))
        tau = ctx.sum(torch.tensor([float(res["tau"])], dtype=torch.float64))
    res["tau"] = float(tau[0])
    return res


class HeldoutEval:
    """Held-out metrics of a drafter.

    Args:
        target: the HF target (float32; on the training device); its final norm and lm_head give
            the teacher-forced labels, its forward the aux states and the verification.
        samples: ``(input_ids, loss_mask)`` per held-out sample (prompt + the target's continuation;
            loss on the continuation), lists of ints.
        prompts: the prompt ids of the same samples (for tau).
        boundaries: the trained aux boundaries (residual-stream indices, ascending as trained).
        k: drafts per cycle for tau; max_new_tokens: tokens generated per prompt;
        eos_token_id: stop id(s); ttt_steps, loss_decay: the training objective's (accuracy per
            TTT step 0..ttt_steps-1).
        source: a sentence saying where the samples come from (reported with the results).

    Raises:
        ValueError: no sample, or none with a loss-bearing token.
    """

    def __init__(
        self,
        target,
        samples: Sequence[tuple[list[int], list[int]]],
        prompts: Sequence[list[int]],
        boundaries: Sequence[int],
        k: int,
        max_new_tokens: int,
        eos_token_id,
        ttt_steps: int,
        loss_decay: float,
        source: str = "",
    ):
        if not samples or not any(any(m) for _, m in samples):
            raise ValueError(
                "no held-out sample with a loss-bearing token: raise heldout_fraction or set "
                "eval_every: 0"
            )
        self.target, self.prompts, self.boundaries = (
            target,
            [list(p) for p in prompts],
            list(boundaries),
        )
        self.k, self.max_new_tokens, self.eos = k, max_new_tokens, eos_token_id
        self.ttt_steps, self.loss_decay, self.source = ttt_steps, loss_decay, source
        self.samples = [(list(i), list(m)) for i, m in samples]
        self._batch = None
        self._greedy = None  # [(full, aux, p)] per prompt, computed at the first evaluation

    @torch.no_grad()
    def batch(self) -> dict:
        """The held-out samples as one right-padded batch on the target's device (captured once):
        ``input_ids, loss_mask, attn_mask [B, T]`` int64, ``aux [B, T, n_aux*H]``, ``final
        [B, T, H]`` float32, zero at padding."""
        if self._batch is None:
            dev = next(self.target.parameters()).device
            ids, attn = pad_right([torch.tensor(i) for i, _ in self.samples], dtype=torch.long)
            loss = pad_right([torch.tensor(m) for _, m in self.samples], dtype=torch.long)[0]
            ids, attn, loss = ids.to(dev), attn.to(dev), loss.to(dev)
            n = n_layers_of(self.target)
            st = capture_boundaries(self.target, ids, sorted(set(self.boundaries + [n])), attn)
            real = attn[..., None].float()
            aux = torch.cat([st[b].float() for b in self.boundaries], dim=-1) * real
            final = st[n].float() * real
            self._batch = {
                "input_ids": ids,
                "loss_mask": loss,
                "attn_mask": attn,
                "aux": aux,
                "final": final,
            }
        return self._batch

    @torch.no_grad()
    def __call__(self, drafter: Eagle3Drafter) -> dict:
        """Evaluate ``drafter`` (a plain, unwrapped drafter on the target's device; left in eval
        mode). Returns ``{"loss", "step_loss" [ttt_steps], "step_acc" [ttt_steps]`` (teacher
        forced, fractions of scored positions), ``"tau"`` (tokens per cycle),
        ``"per_position_acceptance" [k]``, ``"k"``, ``"cycles"``, ``"prompts"``, ``"seconds"``
        (wall time of this evaluation)}``. Use it inside :func:`isolated_rng`."""
        t0 = time.perf_counter()
        drafter.eval()
        b = self.batch()
        r = ttt_loss(
            drafter,
            b["input_ids"],
            b["aux"],
            b["final"],
            b["loss_mask"],
            b["attn_mask"],
            final_norm_of(self.target),
            self.target.get_output_embeddings(),
            self.ttt_steps,
            self.loss_decay,
        )
        acc = self._acceptance(drafter)
        return {
            "loss": float(r.loss),
            "step_loss": list(r.step_loss),
            "step_acc": list(r.step_acc),
            "tau": acc["tau"],
            "per_position_acceptance": acc["per_position_acceptance"],
            "k": self.k,
            "cycles": acc["cycles"],
            "prompts": len(self.prompts),
            "seconds": time.perf_counter() - t0,
        }

    @torch.no_grad()
    def _acceptance(self, drafter: Eagle3Drafter) -> dict:
        """The greedy chain run's summary (AcceptanceStats.summary) over the held-out prompts,
        replayed on the target's greedy states (computed once, reused by later evaluations)."""
        dev = next(drafter.parameters()).device
        if self._greedy is None:
            n = self.max_new_tokens + self.k
            self._greedy = []
            for q in self.prompts:
                full, st, _ = greedy_states(self.target, q, n, self.boundaries)
                aux = torch.cat([st[b] for b in self.boundaries], dim=-1)  # [p + n, n_aux*Ht]
                self._greedy.append((full.to(dev), aux.to(dev), len(q)))
        total, stops = AcceptanceStats(self.k), set(as_stop_list(self.eos))
        for full, aux, p in self._greedy:  # walk counts every state's drafts in one forward
            total.merge(walk(drafter, full, aux, p, self.k, self.max_new_tokens, stops)[1])
        return total.summary()
