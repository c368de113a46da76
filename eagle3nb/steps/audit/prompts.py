"""06_audit's prompts: the held-out prompts 03 never trained on, and ``eval_dataset``'s benchmark
turns as 04 renders them (:func:`eagle3nb.steps.evaluate.bench.bench_prompts`, the target's own
greedy answers in the history), so the audit measures where 04 measures."""

from __future__ import annotations

from eagle3nb.params import RunParams
from eagle3nb.repo_paths import resolve_path
from eagle3nb.steps.evaluate.bench import HELDOUT, bench_prompts, read_eval_dataset

__all__ = ["audit_prompts"]


def audit_prompts(p: RunParams, target) -> dict[str, list[list[int]]]:
    """``{"heldout": ids, p.eval_dataset: ids}``: the first ``max_eval_prompts`` held-out prompts of
    ``prompts_file`` (:func:`eagle3nb.audit.core.heldout_prompt_ids`, 0: all) and, when
    ``eval_dataset`` is set, every turn of its records (at most ``eval_max_records``, stratified by
    category), later turns holding the target's greedy answers of ``eval_max_new_tokens`` tokens
    (as 04's simulator answers them, ``eagle3nb/steps/evaluate/simulator.py``).

    Args:
        target: ``(model, tokenizer, path)`` (:func:`eagle3nb.target.models.load_target`).

    Raises:
        ValueError: no held-out prompt; ``eval_dataset`` missing, empty or without a valid record
            (named, :func:`eagle3nb.steps.evaluate.bench.read_eval_dataset`).
    """
    from eagle3nb.audit.core import heldout_prompt_ids
    from eagle3nb.drafter.acceptance import greedy_generate
    from eagle3nb.target import models

    model, tok, _ = target
    n = p.max_eval_prompts or 10**9
    out = {HELDOUT: heldout_prompt_ids(tok, resolve_path(p.prompts_file), p.heldout_fraction, n)}
    if p.eval_dataset:
        records, _ = read_eval_dataset(p)
        eos = models.stop_token_ids(model, tok)

        def answer(qs):
            return [greedy_generate(model, q, p.eval_max_new_tokens, eos) for q in qs]

        out[p.eval_dataset] = bench_prompts(p, tok, records, answer)[0]
    return out
