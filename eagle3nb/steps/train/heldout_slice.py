"""03's held-out evaluation during training: 01's held-out prompts (01 stores no continuation or
state for them) with the HF target's greedy continuations made here, their aux states captured by
the HF target at the trained boundaries; never a slice of the training samples, so the training
batches do not depend on it."""

from __future__ import annotations

from eagle3nb.drafter.acceptance import greedy_generate
from eagle3nb.manifest import check_compatible, read_json, rendered_kwargs, template_kwargs_of
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir
from eagle3nb.target import models
from eagle3nb.text import chat
from eagle3nb.text.generation import read_jsonl
from eagle3nb.training.heldout import HeldoutEval


def heldout_eval(p: RunParams, rd: RunDir, model, tok, boundaries) -> HeldoutEval | None:
    """The :class:`eagle3nb.training.heldout.HeldoutEval` of this run: the LAST ``eval_prompts``
    held-out records of 01 with generated tokens (04 evaluates the first ``max_eval_prompts``, so
    the two are disjoint when the split holds enough prompts; ``source`` says how many overlap),
    tau with ``k`` drafts per cycle over ``eval_max_new_tokens`` tokens. None when
    ``eval_every`` is 0 or 01 held out no prompt with generated tokens (training goes on without
    held-out evaluation; the caller reports it).

    The prompts are 01's ids as 01 rendered them (its template with the ``chat_template_kwargs``
    its manifest records); 03 renders none itself.

    Raises:
        ManifestMismatch: 01 rendered them with other template kwargs than this run's (the
            evaluation would measure another rendering than the one trained; a manifest without
            them counts as {}), unless ``allow_manifest_mismatch``.
    """
    if p.eval_every == 0:
        return None
    kw = _rendered_by_01(p, rd)
    held = [r for r in read_jsonl(rd.generated) if r["split"] == "heldout"]
    in_04 = {r["id"] for r in (held[: p.max_eval_prompts] if p.max_eval_prompts else held)}
    recs = held[-p.eval_prompts :]
    eos = models.stop_token_ids(model, tok)
    outs = [  # 01 generates for train prompts only: the target's greedy continuation, here
        r.get("output_ids") or greedy_generate(model, r["prompt_ids"], p.eval_max_new_tokens, eos)
        for r in recs
    ]
    samples = [chat.generated_sample(r["prompt_ids"], o) for r, o in zip(recs, outs) if o]
    if not samples:
        return None
    overlap = sum(r["id"] in in_04 for r in recs)
    source = (
        f"01's last {len(recs)} held-out prompts (of {len(held)}) with the target's greedy "
        f"continuations of {p.eval_max_new_tokens} tokens, aux states captured by the HF target "
        f"at boundaries {list(boundaries)}; {overlap} of them also among 04's evaluation prompts; "
        f"prompts rendered by 01 with template kwargs {kw}"
    )
    return HeldoutEval(
        model,
        samples,
        [r["prompt_ids"] for r in recs],
        boundaries,
        p.k,
        p.eval_max_new_tokens,
        eos,
        p.ttt_steps,
        p.loss_decay,
        source,
    )


def _rendered_by_01(p: RunParams, rd: RunDir) -> dict:
    """The template kwargs 01 rendered its prompts with (its manifest), checked against the run's
    (see :func:`heldout_eval`)."""
    gman = read_json(rd.generation_manifest, "generation manifest (from 01_generate)")
    kw = template_kwargs_of(gman)
    if not p.allow_manifest_mismatch:
        check_compatible(
            {"template_kwargs": kw},
            {"template_kwargs": rendered_kwargs(p.mode, p.chat_template_kwargs)},
            ["template_kwargs"],
            f"held-out prompts {rd.generated} (rendered by 01)",
            "allow_manifest_mismatch",
        )
    return kw


def heldout_stats(p: RunParams, rep: dict, ev: HeldoutEval | None) -> dict:
    """metrics.json["train"]["heldout"]: where the held-out slice comes from, the best step by
    held-out tau, which weights were exported, the last evaluation and the time spent."""
    if ev is None:
        why = "eval_every is 0" if p.eval_every == 0 else "01 held out no prompt with output"
        return {"evaluated": False, "why": why, "exported_from": rep["returned"]}
    evals = [e for e in rep["history"] if "heldout" in e]
    last = evals[-1]["heldout"] if evals else None
    return {
        "evaluated": True,
        "source": ev.source,
        "k": ev.k,
        "max_new_tokens": ev.max_new_tokens,
        "best": rep["best"],
        "exported_from": rep["returned"],
        "last": {k: last[k] for k in ("tau", "step_acc", "per_position_acceptance")}
        if last
        else None,
        "eval_seconds_this_call": round(rep["eval_seconds"], 3),
        "evaluations": [{"step": e["step"], "tau": e["heldout"]["tau"]} for e in evals],
    }
