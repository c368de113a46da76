"""04's held-out prompts rendered with the template 04 is given, and acceptance per turn index of
held-out conversation prefixes."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir
from eagle3nb.steps.shared.checks import read_generation_manifest, template_of
from eagle3nb.text import chat
from eagle3nb.text.generation import read_jsonl

__all__ = ["heldout_prompts", "per_turn_acceptance"]


def heldout_prompts(p: RunParams, rd: RunDir, tok) -> tuple[list[list[int]], list, dict]:
    """01's held-out prompts (at most ``max_eval_prompts``) as 04 serves them.

    Chat mode: each prompt is rendered again with the template of this run (``chat_template``,
    ``chat_template_kwargs``) from what was asked (a chat dataset's prefix: the history served
    at that turn, ending at a user turn; a prompt file: the one user prompt), so a run with another
    template (``allow_template_mismatch``) evaluates that template's ids, not 01's. Completion
    mode: 01's prompt ids (``tokenizer(prompt)``).

    Returns:
        ``(prompt ids per prompt, turn index per prompt (None outside chat datasets), template
        block)``: the block records the template used here (mode, sha256, kwargs, file), 01's
        template sha256, and how many prompts render to other ids than 01 served.

    Raises:
        ValueError: no held-out prompt.
    """
    held = [r for r in read_jsonl(rd.generated) if r["split"] == "heldout"]
    if p.max_eval_prompts:
        held = held[: p.max_eval_prompts]
    if not held:
        raise ValueError(
            "no held-out prompt to evaluate; raise heldout_fraction or max_eval_prompts"
        )
    template = template_of(p, tok)
    kwargs = dict(p.chat_template_kwargs)
    if p.mode == "chat":
        prompts = [_render(r, tok, template, kwargs) for r in held]
    else:
        prompts = [r["prompt_ids"] for r in held]
    gm = read_generation_manifest(rd)
    block = {
        "mode": p.mode,
        "sha256": chat.template_hash(template),
        "kwargs": kwargs,
        "file": p.chat_template if p.mode == "chat" else None,
        "generation_sha256": gm["template"]["sha256"],
        "same_as_generation": gm["template"]["sha256"] == chat.template_hash(template)
        and gm.get("template_kwargs", {}) == kwargs,
        "prompts_rendered_differently": sum(a != r["prompt_ids"] for a, r in zip(prompts, held)),
    }
    turns = [r.get("turn") for r in held]
    return prompts, (turns if any(t is not None for t in turns) else None), block


def _render(r: dict, tok, template: str, kwargs: dict) -> list[int]:
    """A held-out record's prompt ids under ``template``: the served history of a chat dataset's
    prefix, or a prompt file's one user prompt; a preformatted text record is served as written."""
    if "messages" in r:
        return chat.render_ids(tok, r["messages"], template, True, r.get("tools"), kwargs)
    if "turn" in r:
        return r["prompt_ids"]
    return chat.render_ids(
        tok, [{"role": "user", "content": r["prompt"]}], template, True, None, kwargs
    )


def per_turn_acceptance(traces: Sequence[dict], turns: Sequence[int], k: int) -> dict:
    """Acceptance per turn index from per-prompt traces of
    :func:`eagle3nb.drafter.acceptance.evaluate_acceptance` (one trace per prompt, in order).

    Returns:
        ``{turn: {"n_prompts", "cycles", "tau", "per_position_acceptance": [k]}}`` with a_i =
        cycles whose draft position i was accepted / cycles with drafts, tau = 1 + accepted /
        cycles.

    Raises:
        ValueError: fewer traces than turns.
    """
    if len(traces) < len(turns):
        raise ValueError(
            f"{len(traces)} traces for {len(turns)} prompts: call evaluate_acceptance with "
            "n_traces=len(prompts)"
        )
    acc: dict = defaultdict(list)
    n: dict = defaultdict(int)
    for tr, t in zip(traces, turns):
        n[t] += 1
        acc[t] += [m for m, _ in tr["cycles"] if m >= 0]
    out = {}
    for t in sorted(acc):
        c = len(acc[t])
        out[t] = {
            "n_prompts": n[t],
            "cycles": c,
            "tau": round(1 + sum(acc[t]) / c, 4) if c else None,
            "per_position_acceptance": [
                round(sum(m > i for m in acc[t]) / c, 4) if c else None for i in range(k)
            ],
        }
    return out
