"""04's simulator with one target forward per prompt, shared by every drafter and the k sweep.

The literal simulator (:func:`eagle3nb.drafter.acceptance.speculative_generate`) runs a target
forward over context + drafts in every cycle of every drafter: one forward per cycle, about
``max_new_tokens / tau`` per prompt and drafter (an untrained drafter: one per token). But greedy
verification always emits the target's greedy continuation, and the drafts at a state depend only on
the verified prefix (tokens and the target's aux states there; see
:mod:`eagle3nb.drafter.ksweep`). So one forward over prompt + greedy continuation gives every state
any drafter's run visits: :func:`greedy_states` computes it once per prompt (all boundaries any
drafter reads, plus N for the logits), :func:`walk` replays a drafter's cycles on it (only the
drafter runs; its drafts at every visited state come from one k-step forward,
:func:`eagle3nb.drafter.acceptance.accepted_counts`), and :func:`evaluate_shared` does this for
all drafters (and the k sweep's every-position drafts of one of them) over the held-out prompts.

Equal to the literal simulator in exact arithmetic. In floating point, a row of a forward over T
tokens can differ in the last bits from the same row in a forward over T' tokens (CPU float32:
~1e-6 relative on the embedded target, measured in tests/drafter/test_shared_eval.py), so a draft
or a target choice at a near-tie could flip; the test compares both simulators' counters on the
embedded target and a drafter with planted misses, and on a random-init drafter.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from eagle3nb.drafter.acceptance import (
    AcceptanceStats,
    accepted_counts,
    emit_tokens,
    greedy_generate,
)
from eagle3nb.drafter.ksweep import greedy_unstopped
from eagle3nb.target.capture import capture_boundaries, decoder_of, n_layers_of
from eagle3nb.target.models import as_stop_list

__all__ = ["greedy_states", "walk", "evaluate_shared"]


@torch.no_grad()
def greedy_states(
    target,
    prompt_ids: Sequence[int],
    n: int,
    boundaries: Sequence[int],
    start: Sequence[int] = (),
) -> tuple[torch.Tensor, dict[int, torch.Tensor], int]:
    """The target's greedy continuation of ``n`` tokens (not stopped at EOS) as one forward over
    prompt + continuation defines it, with that forward's states.

    A candidate (``start``, e.g. HF generate's output, continued by
    :func:`eagle3nb.drafter.ksweep.greedy_unstopped` with its KV cache to ``n`` tokens); the
    forward over prompt + candidate must choose each candidate token (argmax of the logits from
    boundary N through the final norm and the output embeddings, as the simulator's verify forward);
    at the first token it does not, that token is replaced by the forward's choice and the rest
    regenerated (each pass fixes one more prefix token: at most ``n`` passes, usually none).

    Args:
        prompt_ids: ``p`` token ids; n: continuation length; boundaries: 0..N to capture.
        start: the candidate's first tokens (at most ``n``; checked like the rest).

    Returns:
        ``(full [p + n] int64, {b: [p + n, H]} for b in boundaries and N (model dtype), fixes)``.

    Raises:
        RuntimeError: no consistent continuation after ``n + 1`` passes (cannot happen with a
            causal forward that is deterministic for a fixed length).
    """
    N, dec = n_layers_of(target), decoder_of(target)
    bs = sorted(set(int(b) for b in boundaries) | {N})
    prompt, p = list(prompt_ids), len(prompt_ids)
    dev = next(target.parameters()).device
    g = [int(t) for t in start][:n]
    if len(g) < n:
        g += greedy_unstopped(target, prompt + g, n - len(g))
    for fixes in range(n + 1):
        full = torch.tensor(prompt + g, dtype=torch.long, device=dev)
        st = capture_boundaries(target, full[None], bs)
        rows = st[N][0, p - 1 : p - 1 + n]
        choice = target.get_output_embeddings()(dec.norm(rows)).argmax(-1).tolist()
        i = next((i for i in range(n) if choice[i] != g[i]), None)
        if i is None:
            return full, {b: st[b][0] for b in bs}, fixes
        g = g[:i] + [choice[i]]
        if len(g) < n:
            g += greedy_unstopped(target, prompt + g, n - len(g))
    raise RuntimeError(f"no consistent greedy continuation of {n} tokens after {n + 1} passes")


@torch.no_grad()
def walk(
    drafter,
    full: torch.Tensor,
    aux: torch.Tensor,
    p: int,
    k: int,
    max_new_tokens: int,
    stops: set,
    trace: list | None = None,
    memo: dict | None = None,
) -> tuple[list[int], AcceptanceStats]:
    """One prompt's greedy chain run of ``drafter`` replayed on shared states: the cycles of
    :func:`eagle3nb.drafter.acceptance.speculative_generate` without its target forwards.

    Args:
        full: ``[p + n]`` int64 prompt + greedy continuation, ``n >= max_new_tokens + k``
            (:func:`greedy_states`).
        aux: ``[>= p + max_new_tokens - 1, n_aux*Ht]`` the target's states at the drafter's
            boundaries over ``full``, on the drafter's device.
        stops: stop token ids. trace: as ``speculative_generate``'s (one ``(accepted, emitted)``
            per cycle, the prefill's first with accepted = -1).
        memo: ``{j: accepted drafts after j emitted tokens}`` (:func:`accepted_memo`; None:
            computed here), shared with the k sweep of the same drafter and states.

    Returns:
        ``(new_token_ids, AcceptanceStats)`` as ``speculative_generate``.
    """
    g = full[p:].tolist()
    memo = accepted_memo(drafter, full, aux, p, k, max_new_tokens) if memo is None else memo
    stats, new, j, m = AcceptanceStats(k), [], 0, None
    while True:
        if m is not None:
            stats.add(m)
        emit = g[j : j + (m or 0) + 1]
        if trace is not None:
            trace.append((-1 if m is None else m, emit[: max_new_tokens - len(new)]))
        if emit_tokens(new, emit, max_new_tokens, stops):
            break
        j += len(emit)
        m = memo[j]  # j < max_new_tokens here: the memo holds it
    stats.emitted_tokens = len(new)
    return new, stats


def accepted_memo(drafter, full, aux, p: int, k: int, max_new_tokens: int) -> dict:
    """``{j: accepted drafts after j emitted tokens}`` for every j a run of at most
    ``max_new_tokens`` visits (1 .. max_new_tokens - 1), from one k-step forward
    (:func:`eagle3nb.drafter.acceptance.accepted_counts`; after j tokens the origin is
    ``p + j - 2``, the position of the newest token the target has verified)."""
    start, stop = p - 1, max(p - 1, p + max_new_tokens - 2)
    m = accepted_counts(drafter, full, aux, start, stop, k).tolist()
    return {j: m[j - 1] for j in range(1, len(m) + 1)}


def evaluate_shared(
    target,
    runs: Mapping[str, tuple],
    prompts_ids: Sequence[Sequence[int]],
    k: int,
    max_new_tokens: int,
    eos_token_id,
    check_label: str | None = "trained",
    n_traces: Mapping[str, int] | None = None,
    sweep_label: str | None = None,
    progress: Callable | None = None,
) -> dict:
    """Every drafter of ``runs`` (``{label: (drafter, boundaries)}``) over the prompts, one target
    forward per prompt (see the module docstring).

    Returns:
        ``{"results": {label: dict as evaluate_acceptance's}, "hf_greedy": [HF generate's greedy
        output per prompt] (None without ``check_label``), "positions": [{"m", "n_out"}] per
        prompt for ``sweep_label`` (input of :func:`eagle3nb.drafter.ksweep.sweep_from_positions`)
        or None, "fixes": continuation tokens the verify forward corrected}``. Only
        ``check_label``'s ``greedy_mismatches`` are checked (prompts whose output differs from HF
        generate's greedy output; others ``[]``).
    """
    stops = set(as_stop_list(eos_token_id))
    bnds_all = sorted({int(b) for _, bs in runs.values() for b in bs})
    totals = {label: AcceptanceStats(k) for label in runs}
    traces = {label: [] for label in runs}
    mismatches, hf, positions, fixes = [], [], [] if sweep_label else None, 0
    n_traces = dict(n_traces or {})
    it = progress(prompts_ids) if progress else prompts_ids
    for i, q in enumerate(it):
        if check_label in runs:  # HF generate's greedy output: the check, and the candidate
            hf.append(greedy_generate(target, q, max_new_tokens, eos_token_id))
        start = hf[-1] if check_label in runs else ()
        full, st, fx = greedy_states(target, q, max_new_tokens + k, bnds_all, start)
        fixes += fx
        p = len(q)
        for label, (drafter, bs) in runs.items():
            dev = next(drafter.parameters()).device
            aux = torch.cat([st[b] for b in bs], dim=-1).to(dev)  # [p + n, n_aux*Ht]
            tr = [] if i < n_traces.get(label, 3) else None
            fd = full.to(dev)
            memo = accepted_memo(drafter, fd, aux, p, k, max_new_tokens)
            new, s = walk(drafter, fd, aux, p, k, max_new_tokens, stops, tr, memo)
            totals[label].merge(s)
            if tr is not None:
                traces[label].append({"prompt_ids": list(q), "cycles": tr})
            if label == check_label and new != hf[-1]:
                mismatches.append(i)
            if label == sweep_label:
                n_out = len(new)
                ms = [memo[j] for j in range(1, n_out)]
                positions.append({"m": ms, "n_out": n_out})
    results = {}
    for label, (_, bs) in runs.items():
        out = totals[label].summary()
        out["greedy_mismatches"] = mismatches if label == check_label else []
        out["boundaries"] = list(bs)
        out["traces"] = traces[label]
        results[label] = out
    return {
        "results": results,
        "hf_greedy": hf if check_label in runs else None,
        "positions": positions,
        "fixes": fixes,
    }
