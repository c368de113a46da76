"""Which boundaries each engine feeds a drafter, the candidate boundary sets, and their acceptance
measured by the simulator (one target forward per prompt shared by every candidate).

The same weights are evaluated with the target's states at each candidate set of boundaries
(:func:`eagle3nb.drafter.shared_eval.evaluate_shared`); the set it was trained on is the one where
its drafts are accepted most (a drafter fed states one layer off loses most of its acceptance:
vLLM issue 50170, tau 1.04 against 2.77).
"""

from __future__ import annotations

import itertools
from math import comb
from typing import Callable, Sequence

from eagle3nb.boundaries.engine_read import read_as_engine
import torch

from eagle3nb.drafter.acceptance import AcceptanceStats
from eagle3nb.drafter.shared_eval import accepted_memo, greedy_states, walk
from eagle3nb.target.models import as_stop_list
from eagle3nb.boundaries.rules import engine_rule, known_versions

__all__ = ["ENGINES", "engine_readings", "candidate_sets", "measure_candidates", "verdict"]

ENGINES = ("sglang", "vllm")


def engine_readings(cfg: dict, n_layers: int, arch: str, versions: dict) -> dict:
    """Per engine: the boundaries its version's rule for the target class ``arch`` makes it feed
    the drafter whose config.json is ``cfg`` (:func:`eagle3nb.boundaries.engine_read.read_as_engine`
    with :func:`eagle3nb.boundaries.rules.engine_rule`).

    Args:
        versions: ``{engine: installed version or None}`` (None: not installed; the newest version
            the rule table holds is read instead and ``installed`` is False).

    Returns:
        ``{engine: {"version", "installed", "rule", "source", "boundaries", "ids_source"}}``, or
        with ``"refused"`` (why; no ``boundaries``) where the rule table refuses the class or
        lacks the version, or the ids name no boundary that engine can capture.
    """
    out = {}
    for engine in ENGINES:
        v = versions.get(engine)
        rec = {"version": v or known_versions(engine)[-1], "installed": bool(v)}
        try:
            rule = engine_rule(engine, rec["version"], arch)
            rec.update(rule=rule.kind, source=rule.source)
            if rule.refused:
                raise ValueError(rule.refused)
            r = read_as_engine(cfg, engine, n_layers, rule)
            rec.update(boundaries=r["boundaries"], ids_source=r["ids_source"])
        except ValueError as e:
            rec["refused"] = str(e)
        out[engine] = rec
    return out


def _valid(bs: Sequence[int], n: int) -> bool:
    return all(0 <= b <= n for b in bs) and all(a < b for a, b in zip(bs, bs[1:]))


def candidate_sets(
    declared: Sequence[int] | None,
    extra: Sequence[Sequence[int]],
    n_layers: int,
    n_aux: int,
    radius: int = 1,
    exhaustive_up_to: int = 64,
) -> list[list[int]]:
    """The boundary sets to measure: every increasing set with each boundary within ``radius`` of
    the declared one (the engines' defaults 2, N//2, N-3 stand in when nothing is declared), plus
    ``extra`` (each engine's reading, defaults; :func:`eagle3nb.audit.core.run_audit` passes only
    increasing sets: a repeated boundary is one captured state, :mod:`eagle3nb.audit.servable`), or every increasing set of ``n_aux`` boundaries in 0..N when there are
    at most ``exhaustive_up_to`` of them. Sorted, without repeats, declared first.

    Raises:
        ValueError: ``radius`` < 0; a declared set of another length than ``n_aux``.
    """
    if radius < 0:
        raise ValueError(f"radius={radius}: must be >= 0")
    if declared is not None and len(declared) != n_aux:
        raise ValueError(f"declared boundaries {list(declared)}: the drafter reads {n_aux} states")
    centre = list(declared) if declared is not None else [2, n_layers // 2, n_layers - 3][:n_aux]
    if comb(n_layers + 1, n_aux) <= exhaustive_up_to:
        near = [list(c) for c in itertools.combinations(range(n_layers + 1), n_aux)]
    else:
        steps = range(-radius, radius + 1)
        near = [
            [b + d for b, d in zip(centre, ds)] for ds in itertools.product(steps, repeat=n_aux)
        ]
        near = [bs for bs in near if _valid(bs, n_layers)]
    out = [list(declared)] if declared is not None and _valid(declared, n_layers) else []
    for bs in near + [list(x) for x in extra]:
        if len(bs) == n_aux and all(0 <= b <= n_layers for b in bs) and list(bs) not in out:
            out.append(list(bs))
    return out


def _label(bs: Sequence[int]) -> str:
    return "[" + ", ".join(str(b) for b in bs) + "]"


@torch.no_grad()
def draft_nll(drafter, full: torch.Tensor, aux: torch.Tensor, start: int, stop: int) -> tuple:
    """The drafter's first-draft negative log-likelihood of the target's own next tokens, teacher
    forced over origins [start, stop) (the step-0 forward of
    :func:`eagle3nb.drafter.acceptance.accepted_counts`, the first term of the TTT loss the drafter
    was trained to lower); tokens outside the draft vocabulary are left out.

    Returns:
        ``(sum of nats, tokens counted)``.
    """
    dev = aux.device
    idx = torch.arange(stop, device=dev)
    _, logits, _ = drafter.step(full[None, 1 : stop + 1], aux[None, :stop], idx[None], [], idx)
    lp = torch.log_softmax(logits[0, start:].float(), -1)  # [n, draft_vocab]
    dv = lp.shape[-1]
    inv = torch.full((drafter.t2d.numel(),), -1, dtype=torch.long, device=dev)
    inv[torch.arange(dv, device=dev) + drafter.d2t] = torch.arange(dv, device=dev)
    want = inv[full[start + 2 : stop + 2]]  # [n] draft id of the token after each origin
    ok = want >= 0
    n = int(ok.sum())
    return (-lp[ok].gather(-1, want[ok][:, None]).sum().item() if n else 0.0), n


def measure_candidates(
    target,
    drafter,
    candidates: Sequence[Sequence[int]],
    prompts_ids: Sequence[Sequence[int]],
    k: int,
    max_new_tokens: int,
    eos_token_id,
    progress: Callable | None = None,
    groups: Sequence[str] | None = None,
) -> list[dict]:
    """tau of ``drafter`` fed the target's states at each candidate set (greedy chain, ``k`` drafts
    per cycle, ``max_new_tokens`` per prompt) and its first-draft NLL there (:func:`draft_nll`),
    one target forward per prompt for all of them: the building blocks of
    :func:`eagle3nb.drafter.shared_eval.evaluate_shared` (states, then each set's replayed run).

    Args:
        groups: the prompt set each prompt belongs to (e.g. ``heldout``, a benchmark's name), one
            per prompt; each row then also holds ``by_set`` (None: no breakdown).

    Returns:
        ``[{"boundaries", "label", "tau", "draft_acceptance_rate", "cycles", "accepted_per_pos"
        (cycles whose draft i was accepted, [k], the engines' counter of that name),
        "per_position_acceptance", "nll" (nats per token), "by_set": {set: {"tau", "cycles",
        "accepted_per_pos"}} with ``groups``}]``, best tau first.

    Raises:
        ValueError: no candidate or no prompt; ``groups`` of another length than the prompts.
    """
    if not candidates or not prompts_ids:
        raise ValueError(
            f"{len(candidates)} candidate sets and {len(prompts_ids)} prompts: need at least one each"
        )
    if groups is not None and len(groups) != len(prompts_ids):
        raise ValueError(f"{len(groups)} group labels for {len(prompts_ids)} prompts")
    sets = {_label(bs): list(bs) for bs in candidates}
    stats = {label: AcceptanceStats(k) for label in sets}
    names = list(dict.fromkeys(groups or []))
    per = {label: {g: AcceptanceStats(k) for g in names} for label in sets}
    nll = {label: [0.0, 0] for label in sets}
    stops = set(as_stop_list(eos_token_id))
    bnds = sorted({b for bs in sets.values() for b in bs})
    dev = next(drafter.parameters()).device
    order = list(zip(prompts_ids, groups or [None] * len(prompts_ids)))
    for q, g in progress(order) if progress else order:
        full, st, _ = greedy_states(target, q, max_new_tokens + k, bnds)
        fd, p = full.to(dev), len(q)
        for label, bs in sets.items():
            aux = torch.cat([st[b] for b in bs], dim=-1).to(dev)  # [p + n, n_aux*Ht]
            memo = accepted_memo(drafter, fd, aux, p, k, max_new_tokens)
            one = walk(drafter, fd, aux, p, k, max_new_tokens, stops, None, memo)[1]
            stats[label].merge(one)
            if g is not None:
                per[label][g].merge(one)
            s, n = draft_nll(drafter, fd, aux, p - 1, p + max_new_tokens - 2)
            nll[label][0] += s
            nll[label][1] += n
    rows = []
    for label, bs in sets.items():
        r = stats[label].summary()
        rows.append(
            {
                "boundaries": bs,
                "label": label,
                "tau": r["tau"],
                "draft_acceptance_rate": r["draft_acceptance_rate"],
                "cycles": r["cycles"],
                "accepted_per_pos": list(stats[label].accepted_per_pos),
                "per_position_acceptance": r["per_position_acceptance"],
                "nll": nll[label][0] / max(nll[label][1], 1),
            }
        )
        if groups is not None:
            rows[-1]["by_set"] = {
                g: {
                    "tau": acc.summary()["tau"],
                    "cycles": acc.cycles,
                    "accepted_per_pos": list(acc.accepted_per_pos),
                }
                for g, acc in per[label].items()
            }
    return sorted(rows, key=lambda r: -r["tau"])


def verdict(rows: list[dict], declared: Sequence[int] | None) -> dict:
    """What the measurements say against the declared set.

    ``trained_on``: the set where the drafter's first-draft NLL is lowest (the objective it was
    trained to lower; continuous, so it separates sets whose tau ties within a few cycles);
    ``best``: the set of highest tau (what serving gets).

    ``recommended``: the set the corrected copy writes (:func:`_recommend`), ``why``: in words.

    Returns:
        ``{"recommended", "why", "trained_on", "trained_nll", "nll_next", "nll_next_set",
        "nll_margin" (nats/token),
        "trained_tau", "best", "best_tau", "next_best", "next_tau", "margin" (best - next tau,
        tokens/cycle), "declared", "declared_tau", "declared_nll" (None when undeclared or not
        measured), "declared_is_trained"}``.
    """
    best, nxt = rows[0], (rows[1] if len(rows) > 1 else None)
    by_nll = sorted(rows, key=lambda r: r["nll"])
    tr, tr2 = by_nll[0], (by_nll[1] if len(by_nll) > 1 else None)
    dec = next(
        (r for r in rows if declared is not None and r["boundaries"] == list(declared)), None
    )
    rec, why = _recommend(tr, dec)
    return {
        "recommended": rec,
        "why": why,
        "trained_on": tr["boundaries"],
        "trained_nll": tr["nll"],
        "trained_tau": tr["tau"],
        "nll_next_set": tr2["boundaries"] if tr2 else None,
        "nll_next": tr2["nll"] if tr2 else None,
        "nll_margin": tr2["nll"] - tr["nll"] if tr2 else None,
        "best": best["boundaries"],
        "best_tau": best["tau"],
        "next_best": nxt["boundaries"] if nxt else None,
        "next_tau": nxt["tau"] if nxt else None,
        "margin": best["tau"] - nxt["tau"] if nxt else None,
        "declared": list(declared) if declared is not None else None,
        "declared_tau": dec["tau"] if dec else None,
        "declared_nll": dec["nll"] if dec else None,
        "declared_is_trained": declared is not None and tr["boundaries"] == list(declared),
    }


def _recommend(tr: dict, dec: dict | None) -> tuple[list[int], str]:
    """The set the corrected copy makes the engines feed: the NLL's set when nothing is declared,
    when it is the declared set, or when it also accepts more than the declared set (both measures
    agree); otherwise the declared set is kept (a weakly trained drafter's NLL can prefer states
    nearer the output over the ones it was trained on: the smoke run's drafter, trained at
    [1, 2, 4], has its lowest NLL at [1, 2, 5] but accepts less there)."""
    if dec is None:
        return tr["boundaries"], "no ids declared: the set of lowest first-draft NLL"
    if tr["boundaries"] == dec["boundaries"]:
        return dec["boundaries"], "the declared set has the lowest first-draft NLL"
    if tr["tau"] > dec["tau"]:
        return tr["boundaries"], (
            f"{tr['boundaries']} has a lower first-draft NLL ({tr['nll']:.4f} < {dec['nll']:.4f}) "
            f"and a higher tau ({tr['tau']:.3f} > {dec['tau']:.3f}) than the declared set"
        )
    return dec["boundaries"], (
        f"inconclusive, the declared set is kept: {tr['boundaries']} has a lower first-draft NLL "
        f"({tr['nll']:.4f} < {dec['nll']:.4f}) but not a higher tau ({tr['tau']:.3f} <= "
        f"{dec['tau']:.3f}); measure on more prompts (max_eval_prompts) to decide"
    )
