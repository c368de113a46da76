"""Acceptance for every k' = 1..k from one pass: drafts at every position of the greedy output.

Why not from one set of k-cycles: a k-cycle at a state drafts the same first k' tokens a k'-cycle
would draft there (greedy chain drafting is sequential), so ``min(accepted, k')`` is what a k'-cycle
would accept *at that state*. But the runs then move apart: a k-cycle that accepts m > k' drafts
jumps m + 1 tokens ahead, the k'-cycle only k' + 1, and the next cycles start from different
states. Truncating the k-cycles therefore measures a k'-drafter on the states a k-run happens to
visit (biased towards the starts of easy runs), not the k'-run itself.

What is exact: the drafts at a state depend only on the verified tokens (the drafter reads the
target's aux states of the verified prefix and the newest token; nothing carries over from the
cycle boundaries), and greedy verification always emits the target's greedy continuation. So,
with ``m(j)`` = how many of k drafts made after j emitted tokens equal the greedy continuation,
a k'-run is the walk ``j -> j + min(m(j), k') + 1`` from j = 1 (the prefill's own token), and
every k' <= k is read off the same ``m``. :func:`accepted_at_every_position` computes ``m`` for
every j with one target forward per prompt (instead of one per cycle);
:func:`sweep_from_positions` walks it. The only difference from the simulator is floating point:
the simulator's aux states come from forwards over other lengths (tests compare tau at k).
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch

from eagle3nb.drafter.acceptance import AcceptanceStats, accepted_counts
from eagle3nb.drafter.model import Eagle3Drafter
from eagle3nb.target.capture import capture_boundaries
from eagle3nb.target.models import as_stop_list

__all__ = [
    "greedy_unstopped",
    "accepted_at_every_position",
    "accepted_from_states",
    "sweep_from_positions",
    "k_sweep",
]


@torch.no_grad()
def greedy_unstopped(target, prompt_ids: Sequence[int], n: int) -> list[int]:
    """The target's greedy continuation of ``n`` tokens, not stopped at EOS (drafts are compared
    with the tokens after a stop too, as the simulator's verify forward does)."""
    dev = next(target.parameters()).device
    # transformers >= 5.2x names the KV cache ``cache``; older ones ``past_key_values``
    name = "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=dev)
    out = target(ids, use_cache=True)
    new = []
    for _ in range(n):
        tok = out.logits[0, -1].argmax()
        new.append(int(tok))
        out = target(tok.view(1, 1), use_cache=True, **{name: getattr(out, name)})
    return new


_greedy_unstopped = greedy_unstopped  # the name the tests use


@torch.no_grad()
def accepted_at_every_position(
    target,
    drafter: Eagle3Drafter,
    prompt_ids: Sequence[int],
    boundaries: Sequence[int],
    k: int,
    max_new_tokens: int,
    eos_token_id=None,
) -> dict:
    """Draft k tokens after every emitted token of one prompt's greedy output.

    Returns:
        ``{"m": [m(1) .. m(n_out - 1)] (index 0 = after one token), "n_out": tokens the
        speculative run emits (up to the first stop token or ``max_new_tokens``)}``.
    """
    g = greedy_unstopped(target, prompt_ids, max_new_tokens + k)
    stops = set(as_stop_list(eos_token_id))
    n_out = max_new_tokens
    for i, t in enumerate(g[:max_new_tokens]):
        if t in stops:
            n_out = i + 1
            break
    dev = next(target.parameters()).device
    full = torch.tensor(list(prompt_ids) + g, dtype=torch.long, device=dev)
    bnds = list(boundaries)
    st = capture_boundaries(target, full[None], sorted(set(bnds)))
    aux_all = torch.cat([st[b][0] for b in bnds], dim=-1)  # [T, n_aux*Ht]
    return {
        "m": accepted_from_states(drafter, full, aux_all, len(prompt_ids), k, n_out),
        "n_out": n_out,
    }


@torch.no_grad()
def accepted_from_states(
    drafter: Eagle3Drafter, full: torch.Tensor, aux_all: torch.Tensor, p: int, k: int, n_out: int
) -> list[int]:
    """``m(j)`` for j = 1 .. n_out - 1 from states already captured (by any engine).

    Args:
        full: ``[p + n_gen]`` int64: the prompt (``p`` tokens) and the target's greedy
            continuation, unstopped, at least ``n_out - 1 + k`` tokens long.
        aux_all: ``[>= p + n_out - 2, n_aux*Ht]`` the target's aux states over ``full`` (in the
            order of the boundaries the drafter reads), on the drafter's device.

    Returns:
        ``[m(1) .. m(n_out - 1)]``: how many of the k drafts made after j emitted tokens equal
        the continuation (see the module docstring). The states may come from an engine other
        than HF (eagle3nb.steps.drift.step: vLLM's own capture of a quantized target).
    """
    # after j emitted tokens the drafter drafts from origin p + j - 2 (one forward for all j)
    stop = max(p - 1, p + n_out - 2)
    return accepted_counts(drafter, full.to(aux_all.device), aux_all, p - 1, stop, k).tolist()


def sweep_from_positions(positions: Sequence[dict], k_max: int) -> dict:
    """Walk each prompt's ``m`` (from :func:`accepted_at_every_position`) as a k'-run would.

    Returns:
        ``{k': AcceptanceStats.summary()}`` for k' = 1..k_max, each the exact greedy chain run
        with k' drafts per cycle over the same prompts.
    """
    out = {}
    for kk in range(1, k_max + 1):
        total = AcceptanceStats(kk)
        for pos in positions:
            st = AcceptanceStats(kk)
            j = 1
            while j < pos["n_out"]:
                acc = min(pos["m"][j - 1], kk)
                st.add(acc)
                j += acc + 1
            st.emitted_tokens = pos["n_out"]
            total.merge(st)
        out[kk] = total.summary()
    return out


def k_sweep(
    target,
    drafter: Eagle3Drafter,
    prompts_ids: Sequence[Sequence[int]],
    boundaries: Sequence[int],
    k: int,
    max_new_tokens: int,
    eos_token_id=None,
    progress=None,
) -> dict:
    """tau, a_i, c_i and the draft acceptance rate for every k' = 1..k (see the module docstring).

    Returns:
        ``{k': summary}`` as :func:`sweep_from_positions`.
    """
    it = progress(prompts_ids) if progress else prompts_ids
    pos = [
        accepted_at_every_position(target, drafter, q, boundaries, k, max_new_tokens, eos_token_id)
        for q in it
    ]
    return sweep_from_positions(pos, k)
