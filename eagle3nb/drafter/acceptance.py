"""Acceptance of a drafter: greedy chain speculative decoding with a real target (the simulator).

One *cycle*: the drafter proposes k tokens from the target's aux states and the newest token; the
target scores context + drafts in one forward, accepts the longest prefix of drafts that equals its
own greedy choices, and adds one token of its own (the bonus token). Output therefore equals the
target's plain greedy output token for token (checked by :func:`evaluate_acceptance`).

Definitions (as in ``../shared/reference/conventions.md`` section 4, vLLM ``spec_decode`` metrics):
- per-position acceptance a_i (i = 1..k) = fraction of cycles whose draft position i was accepted
  (vLLM ``spec_decode_num_accepted_tokens_per_pos`` / ``num_drafts``); non-increasing in i.
- acceptance length tau = mean tokens emitted per cycle = 1 + mean accepted drafts = 1 + sum a_i
  (SGLang: ``completion_tokens / spec_verify_ct``); at most k + 1.
- draft acceptance rate = accepted drafts / drafted tokens = (tau - 1) / k (vLLM's name).
- conditional acceptance c_i = P(position i accepted | position i-1 accepted) = a_i / a_{i-1}
  (a_0 = 1, so c_1 = a_1); None where a_{i-1} = 0. tau = 1 + c_1 + c_1 c_2 + ... .
Cycles cut short by ``max_new_tokens`` or EOS are counted with what the target accepted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

from eagle3nb.target.capture import capture_boundaries, decoder_of, n_layers_of
from eagle3nb.drafter.model import Eagle3Drafter
from eagle3nb.target.models import as_stop_list

__all__ = [
    "AcceptanceStats",
    "draft_chain",
    "accepted_counts",
    "emit_tokens",
    "speculative_generate",
    "greedy_generate",
    "evaluate_acceptance",
    "conditional_acceptance",
]


def conditional_acceptance(per_position: Sequence[float]) -> list[float | None]:
    """c_i = a_i / a_{i-1} with a_0 = 1: the chance that draft position i is accepted given that
    position i-1 was (a_i is non-increasing because a cycle stops at its first rejection).

    Returns:
        ``[c_1 .. c_k]``; None where a_{i-1} = 0 (no cycle reached position i-1).
    """
    prev, out = 1.0, []
    for a in per_position:
        out.append(a / prev if prev > 0 else None)
        prev = a
    return out


@dataclass
class AcceptanceStats:
    """Counters over cycles; :meth:`summary` gives a_i, tau and the draft acceptance rate."""

    k: int
    cycles: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    accepted_total: int = 0
    emitted_tokens: int = 0

    def __post_init__(self):
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.k

    def add(self, n_accepted: int) -> None:
        """Count one cycle whose first ``n_accepted`` drafts (0..k) were accepted."""
        self.cycles += 1
        self.accepted_total += n_accepted
        for i in range(n_accepted):
            self.accepted_per_pos[i] += 1

    def merge(self, other: "AcceptanceStats") -> None:
        """Add another prompt's counters (same k) into these."""
        self.cycles += other.cycles
        self.accepted_total += other.accepted_total
        self.emitted_tokens += other.emitted_tokens
        self.accepted_per_pos = [
            a + b for a, b in zip(self.accepted_per_pos, other.accepted_per_pos)
        ]

    def summary(self) -> dict:
        """``per_position_acceptance`` [k] fractions, ``conditional_acceptance`` [k] (c_i),
        ``tau`` (tokens/cycle), ``draft_acceptance_rate`` (accepted/drafted), ``cycles``,
        ``emitted_tokens``; see the module docstring."""
        c = max(self.cycles, 1)
        a = [x / c for x in self.accepted_per_pos]
        return {
            "k": self.k,
            "cycles": self.cycles,
            "per_position_acceptance": a,
            "conditional_acceptance": conditional_acceptance(a),
            "tau": 1.0 + self.accepted_total / c,
            "draft_acceptance_rate": self.accepted_total / (c * self.k),
            "emitted_tokens": self.emitted_tokens,
        }

    def to_dict(self) -> dict:
        """The raw counters as a dict."""
        return asdict(self)


@torch.no_grad()
def emit_tokens(new: list[int], emit: Sequence[int], max_new_tokens: int, stops) -> bool:
    """Append one cycle's emitted tokens to ``new`` up to the budget or a stop token (which is
    kept); True when generation ends there. The stopping rule of every speculative loop here, so
    the per-cycle simulator and :mod:`eagle3nb.drafter.shared_eval` stop on the same token."""
    for t in emit:
        new.append(t)
        if len(new) >= max_new_tokens or t in stops:
            return True
    return False


def draft_chain(
    drafter: Eagle3Drafter, tokens: torch.Tensor, aux: torch.Tensor, k: int
) -> list[int]:
    """Propose k target-vocab tokens greedily.

    Args:
        tokens: ``[n+1]`` int64 context x_0..x_n (x_n = newest token, not yet seen by the target).
        aux: ``[n, n_aux*Ht]`` aux states of positions 0..n-1.

    Returns:
        k target ids d_1..d_k (d_1 drafts x_{n+1}).

    Mirrors the serve-time flow of SGLang ``eagle_worker.py`` (draft extend over the verified
    tokens with the target's states, then k-1 chained steps on the drafter's own outputs), with
    top-k = 1.
    """
    n = aux.shape[0]
    dev = aux.device
    idx = torch.arange(n, device=dev)
    out, logits, kv = drafter.step(
        tokens[None, 1 : n + 1], aux[None], idx[None], [], idx
    )  # out: [1, n, H]
    cache = [kv]
    d = drafter.draft_to_target(logits[0, -1].argmax())  # scalar
    drafts = [int(d)]
    hidden = out[:, -1:]  # [1, 1, H] pre-norm output at the last position
    last = idx[-1:]
    for j in range(1, k):
        out, logits, kv = drafter.step(d.view(1, 1), hidden, (last + j)[None], cache, last)
        cache.append(kv)
        d = drafter.draft_to_target(logits[0, -1].argmax())
        drafts.append(int(d))
        hidden = out
    return drafts


@torch.no_grad()
def accepted_counts(
    drafter: Eagle3Drafter, full: torch.Tensor, aux: torch.Tensor, start: int, stop: int, k: int
) -> torch.Tensor:
    """How many of the k greedy drafts made at each origin t in [start, stop) equal the
    continuation ``full``, for all origins in one k-step forward.

    Origin t is the state :func:`draft_chain` drafts from when called as
    ``draft_chain(drafter, full[: t + 2], aux[: t + 1], k)``: tokens up to ``full[t + 1]``, the
    target's states of positions 0..t; its drafts d_1..d_k are compared with
    ``full[t + 2 .. t + 1 + k]`` and counted up to the first miss. ``draft_chain`` feeds each step
    its own previous draft; here step s is fed the continuation token ``full[t + 1 + s]`` instead
    (the training-time-test layout of :func:`eagle3nb.training.objective.ttt_loss`, queries only
    at the origins). The two feeds are equal while every earlier draft was accepted, and the count
    stops at the first miss, so the counts are ``draft_chain``'s, up to floating point (one forward
    over ``stop`` positions instead of one per prefix; tests/drafter/test_shared_eval.py compares
    them). Cost: k drafter steps in all, instead of k per origin, each with a prefill of the prefix.

    Args:
        full: ``[L]`` int64 token ids (prompt + continuation).
        aux: ``[>= stop, n_aux*Ht]`` the target's aux states over ``full``, on the drafter's device.
        start, stop: the origins, ``0 <= start <= stop <= L - 1``. k: drafts per origin, >= 1.

    Returns:
        ``[stop - start]`` int64 in 0..k on ``aux``'s device; drafts past the end of ``full``
        count as misses.

    Raises:
        ValueError: origins outside ``full`` or ``aux``.
    """
    dev, L = aux.device, int(full.shape[0])
    if not (0 <= start <= stop <= L - 1 and stop <= aux.shape[0]):
        raise ValueError(
            f"origins [{start}, {stop}) for {L} tokens and {aux.shape[0]} aux rows: need "
            "0 <= start <= stop <= tokens - 1 and stop <= aux rows"
        )
    if stop == start:
        return torch.zeros(0, dtype=torch.long, device=dev)
    # continuation tokens, padded past the end (fed there but never counted)
    seq = torch.cat([full.to(dev), full.new_zeros(k + 1, device=dev)])  # [L + k + 1]
    idx = torch.arange(stop, device=dev)  # step-0 positions 0..stop-1
    org = idx[start:]  # [n] origins
    out, logits, kv = drafter.step(seq[None, 1 : stop + 1], aux[None, :stop], idx[None], [], idx)
    hidden = out[:, start:]  # [1, n, H] what each origin's step 1 reads
    drafts = [drafter.draft_to_target(logits[0, start:].argmax(-1))]  # d_1 per origin: [n]
    cache = [kv]
    for s in range(1, k):
        tok = seq[org + 1 + s][None]  # [1, n] d_s where accepted
        out, logits, kv = drafter.step(tok, hidden, (org + s)[None], cache, org)
        cache.append(kv)
        hidden = out  # [1, n, H]
        drafts.append(drafter.draft_to_target(logits[0].argmax(-1)))
    want = org[None] + 2 + torch.arange(k, device=dev)[:, None]  # [k, n] index of d_(s+1)'s token
    hit = (torch.stack(drafts) == seq[want]) & (want < L)  # [k, n]
    return hit.long().cumprod(0).sum(0)  # leading hits per origin


@torch.no_grad()
def speculative_generate(
    target,
    drafter: Eagle3Drafter,
    prompt_ids: Sequence[int],
    boundaries: Sequence[int],
    k: int,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    trace: list | None = None,
):
    """Greedy chain speculative decoding of one prompt.

    Args:
        target: HF causal LM; boundaries: aux boundaries fed to the drafter (may differ from the ones
            it was trained on, to measure a mismatch); k: drafts per cycle.
        trace: if a list, one ``(accepted, emitted_token_ids)`` per cycle is appended (the first
            entry, accepted = -1, is the prefill's own token).

    Returns:
        ``(new_token_ids list[int], AcceptanceStats)``.
    """
    n_layers = n_layers_of(target)
    bnds = list(boundaries)
    dec = decoder_of(target)
    stats = AcceptanceStats(k)
    stops = set(as_stop_list(eos_token_id))
    dev = next(target.parameters()).device
    seq = torch.tensor(list(prompt_ids), dtype=torch.long, device=dev)
    new: list[int] = []
    drafts: list[int] = []
    while True:
        full = torch.cat([seq, torch.tensor(drafts, dtype=torch.long, device=dev)])
        st = capture_boundaries(target, full[None], sorted(set(bnds + [n_layers])))
        logits = target.get_output_embeddings()(dec.norm(st[n_layers][0]))  # [L, vocab]
        n = seq.numel() - 1  # index of the newest verified token
        greedy = (
            logits[n:].argmax(-1).tolist()
        )  # target choices for positions n+1 .. n+len(drafts)+1
        m = 0
        while m < len(drafts) and drafts[m] == greedy[m]:
            m += 1
        if drafts:
            stats.add(m)
        emit = drafts[:m] + [greedy[m]]
        if trace is not None:
            trace.append((m if drafts else -1, emit[: max_new_tokens - len(new)]))
        if emit_tokens(new, emit, max_new_tokens, stops):
            break
        seq = torch.cat([seq, torch.tensor(emit, dtype=torch.long, device=dev)])
        aux = torch.cat([st[b][0, : seq.numel() - 1] for b in bnds], dim=-1)  # [n', n_aux*Ht]
        drafts = draft_chain(drafter, seq, aux, k)
    stats.emitted_tokens = len(new)
    return new, stats


@torch.no_grad()
def greedy_generate(
    target, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: int | list[int] | None
) -> list[int]:
    """The target's plain greedy continuation (HF ``generate``, unpadded, KV cache); stops after
    any id in ``eos_token_id`` (an int or a list)."""
    ids = torch.tensor(
        [list(prompt_ids)], dtype=torch.long, device=next(target.parameters()).device
    )
    stops = as_stop_list(eos_token_id)
    out = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stops or None,
        pad_token_id=stops[0] if stops else 0,
    )
    return out[0, ids.shape[1] :].cpu().tolist()


def evaluate_acceptance(
    target,
    drafter,
    prompts_ids: Sequence[Sequence[int]],
    boundaries,
    k: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    check_greedy: bool = True,
    progress=None,
    n_traces: int = 3,
) -> dict:
    """Run :func:`speculative_generate` over prompts and aggregate.

    Returns:
        ``summary`` of :class:`AcceptanceStats` plus ``greedy_mismatches`` (prompts whose output
        differs from plain greedy; must be 0) and ``traces``: per-cycle (accepted, tokens) of the
        first ``n_traces`` prompts, for the token-level view.
    """
    total = AcceptanceStats(k)
    mismatches, traces = [], []
    it = progress(prompts_ids) if progress else prompts_ids
    for i, p in enumerate(it):
        tr = [] if i < n_traces else None
        new, st = speculative_generate(
            target, drafter, p, boundaries, k, max_new_tokens, eos_token_id, tr
        )
        if tr is not None:
            traces.append({"prompt_ids": list(p), "cycles": tr})
        total.merge(st)
        if check_greedy and new != greedy_generate(target, p, max_new_tokens, eos_token_id):
            mismatches.append(i)
    out = total.summary()
    out["greedy_mismatches"] = mismatches
    out["boundaries"] = list(boundaries)
    out["traces"] = traces
    return out
