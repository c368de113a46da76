"""04's simulator (eagle3nb's greedy chain speculative decoding over an HF float32 copy of the
target: held-out prompts, baselines, the k sweep, a benchmark per category) and the assembly of
04's result and metrics.json["eval"] from the simulator's and the serving engines' numbers."""

from __future__ import annotations

import torch

from eagle3nb.drafter.acceptance import conditional_acceptance, greedy_generate
from eagle3nb.drafter.export import load_drafter
from eagle3nb.drafter.ksweep import sweep_from_positions
from eagle3nb.drafter.model import swapped_drafter
from eagle3nb.drafter.shared_eval import evaluate_shared
from eagle3nb.boundaries.rules import rule_known
from eagle3nb.manifest import read_json
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.steps.evaluate import chat as eval_chat
from eagle3nb.steps.shared.checks import merge_engine_metrics, progress_bar, record_checks
from eagle3nb.steps.evaluate.bench import HELDOUT, bench_prompts
from eagle3nb.steps.evaluate.served import (
    ENGINE_NAMES,
    FLAVOUR,
    LATENCY_NOTE,
    OFFSET,
    SPEED_NOTE,
    offset_boundaries,
    served_block,
)
from eagle3nb.steps.evaluate.publish import write_serving_files
from eagle3nb.target import models
from eagle3nb.training.loop import init_head_from_target
from eagle3nb.viz.served import served_table

__all__ = ["SIMULATOR", "SIMULATOR_METHOD", "simulate", "assemble", "card_eval"]

SIMULATOR = "eagle3nb simulator on hf-transformers target"
SIMULATOR_METHOD = (
    "one target forward per prompt over its greedy continuation (the verify forward's argmax at "
    "every position), every drafter's cycles replayed on its states; equals the per-cycle "
    "simulator up to floating point (eagle3nb.drafter.shared_eval)"
)


def simulate(
    p, rd, path, device, prompts, turns, eos, served, bnds, n, dman, records, progress, tok
):
    """The simulator over the held-out prompts (trained, as served, baselines; the k sweep) and,
    with ``records``, over the benchmark's prompts turn by turn (histories: HF greedy answers),
    rendered with ``tok`` (the tokenizer 04 already loaded).

    Returns:
        ``{"results", "shared", "sweep", "bench_prompts": (ids, categories, keys), "bench":
        {label: per-category summaries}}``.
    """
    model, _, _ = models.load_target(p.model, "float32", device)
    emb = model.get_input_embeddings().weight.detach().float().cpu()
    drafter, _ = load_drafter(rd.drafter, emb)
    drafter.to(model.device)
    runs = _runs(p, model, drafter, dman, bnds, n, served)
    bar = (lambda xs: progress_bar()(xs, desc="speculative decoding")) if progress else None
    # one target forward per prompt over its greedy continuation, shared by every drafter and
    # the k sweep (eagle3nb.drafter.shared_eval; the literal per-cycle simulator is its test)
    shared = evaluate_shared(
        model,
        runs,
        prompts,
        p.k,
        p.eval_max_new_tokens,
        eos,
        check_label="trained",
        n_traces={"trained": len(prompts) if turns else 3},
        sweep_label="trained" if p.k_sweep else None,
        progress=bar,
    )
    out = {"results": shared["results"], "shared": shared, "bench_prompts": ([], [], [])}
    out["sweep"] = sweep_from_positions(shared["positions"], p.k) if p.k_sweep else None
    if records:

        def ans(qs):
            return [greedy_generate(model, q, p.eval_max_new_tokens, eos) for q in qs]

        ids, cats, keys = bench_prompts(p, tok, records, ans)
        both = {k: v for k, v in runs.items() if k in ("trained", OFFSET, FLAVOUR)}
        b = evaluate_shared(
            model,
            both,
            ids,
            p.k,
            p.eval_max_new_tokens,
            eos,
            check_label=None,
            n_traces={k: len(ids) for k in both},
        )
        out["bench_prompts"] = (ids, cats, keys)
        out["bench"] = {
            label: eval_chat.per_turn_acceptance(r["traces"], cats, p.k)
            for label, r in b["results"].items()
        }
    return out


def _runs(p: RunParams, model, drafter, dman: dict, bnds, n: int, served: dict) -> dict:
    """``{label: (drafter, boundaries)}`` to evaluate: the trained drafter, as served where an
    engine reads other boundaries from the exported ids, and with ``baselines`` an untrained
    drafter, the trained one at the other engine's reading of the same ids
    (:func:`eagle3nb.steps.evaluate.served.offset_boundaries`) and, for an EAGLE-3.1 flavour, the
    trained one read as the other flavour (:func:`eagle3nb.drafter.model.swapped_drafter`)."""
    runs = {"trained": (drafter, bnds)}
    for sb in served.values():
        if sb != list(bnds) and f"trained, as served (ids -> {sb})" not in runs:
            runs[f"trained, as served (ids -> {sb})"] = (drafter, sb)
    if p.baselines:
        torch.manual_seed(p.seed + 1234)
        emb = model.get_input_embeddings().weight.detach().float().cpu()
        fresh = type(drafter)(drafter.config, emb)  # the same head (Llama or MLA)
        fresh.set_vocab(drafter.d2t.cpu(), drafter.t2d.cpu())
        if dman["train_config"].get("init_head_from_target"):
            init_head_from_target(fresh, model)  # the trained drafter's starting point
        runs["untrained"] = (fresh.eval().to(model.device), bnds)
        moved = offset_boundaries(dman.get("convention", "sglang"), list(bnds), n)
        if moved is not None and moved not in [list(x) for _, x in runs.values()]:
            runs[OFFSET] = (drafter, moved)
        swapped = swapped_drafter(drafter)
        if swapped is not None:
            runs[FLAVOUR] = (swapped.eval(), bnds)
    return runs


def _sim_label(served: dict, engine: str, bnds) -> str:
    """The simulator's label for what ``engine`` reads from the exported ids."""
    sb = served[engine]
    return "trained" if sb == list(bnds) else f"trained, as served (ids -> {sb})"


def _sim_runs(p, sim: dict) -> list[dict]:
    """The simulator's numbers as rows of the served table (engine "simulator")."""
    rows = []
    for label in ("trained", OFFSET, FLAVOUR):
        r = sim["results"].get(label)
        if r:
            rows.append(
                _row(p, label, HELDOUT, r["tau"], r["per_position_acceptance"], r["cycles"])
            )
        for cat, a in (sim.get("bench") or {}).get(label, {}).items():
            if a["tau"] is not None:
                rows.append(
                    _row(p, label, cat, a["tau"], a["per_position_acceptance"], a["cycles"])
                )
    return rows


def _row(p, label, cat, tau, per_pos, cycles) -> dict:
    return dict(
        engine="simulator",
        engine_version=None,
        drafter=label,
        k=p.k,
        batch_size=None,
        category=cat,
        tau=round(tau, 4),
        per_position_acceptance=[round(a, 4) for a in per_pos],
        cycles=cycles,
        tokens_per_s=None,
        plain_tokens_per_s=None,
        speedup=None,
        latency_s=None,
        plain_latency_s=None,
    )


def _engine_results(p, runs, served, bnds, results, engines_of, blocks, sim, held_n, outs):
    """One served label per engine and drafter (held-out prompts, k, first batch size) into
    ``results`` (the notebook's figure and table) and each engine's block into ``blocks``."""
    b0 = p.eval_batch_sizes[0]
    for engine in dict.fromkeys(r["engine"] for r in runs):
        mine = [r for r in runs if r["engine"] == engine]
        label_sim = _sim_label(served, engine, bnds)
        simr = {"trained": sim["results"][label_sim]} if sim else None
        block = served_block(mine, simr, p.k, b0, HELDOUT)
        block["boundaries"] = served[engine]
        block["compared_with"] = label_sim if sim else None
        if sim and sim["shared"]["hf_greedy"] is not None:
            got = outs[engine]["trained", p.k, b0][:held_n]
            hf = sim["shared"]["hf_greedy"]
            block["mismatches_vs_hf_greedy"] = sum(list(a) != list(h) for a, h in zip(got, hf))
        name = f"{ENGINE_NAMES[engine]} {block['engine_version']}"
        for r in mine:
            if r["k"] == p.k and r["batch_size"] == b0 and r["category"] == HELDOUT:
                label = f"{r['drafter']}, served by {name}"
                c = r["counters"]  # unrounded, from the engine's own counters
                nd = max(c["num_drafts"], 1)
                results[label] = dict(
                    r,
                    tau=1 + c["num_accepted_tokens"] / nd,
                    per_position_acceptance=[a / nd for a in c["accepted_per_pos"][: p.k]],
                    traces=[],
                    greedy_mismatches=[],
                    draft_acceptance_rate=c["num_accepted_tokens"] / nd / p.k,
                )
                engines_of[label] = (
                    f"{engine} {block['engine_version']} (its own EAGLE-3 serving and counters)"
                )
        blocks[engine] = block


def assemble(
    *,
    p,
    rd,
    dman,
    sim,
    runs,
    outs,
    prompt_set,
    engines,
    left_out,
    served,
    bnds,
    dblock,
    template_block,
    turns,
    secs,
    tok,
) -> dict:
    """04's result and metrics.json["eval"] from the simulator (``sim`` or None) and the engines'
    served ``runs``; writes metrics, checks and the serving files (model card with the table).
    Keyword-only: sixteen inputs, several of the same type (dicts, lists), are too easy to swap
    by position."""
    held_n = len(eval_chat_held(prompt_set))
    results = dict(sim["results"]) if sim else {}
    engines_of = {label: SIMULATOR for label in results}
    blocks: dict = {}
    _engine_results(p, runs, served, bnds, results, engines_of, blocks, sim, held_n, outs)
    arch = (dman.get("target") or {}).get("architecture")
    for e, blk in blocks.items():  # the rule its ids rest on: read from source or measured
        blk.update(rule_known(e, blk["engine_version"], arch))
    if not results:
        raise RuntimeError(
            f"eval_engines={p.eval_engines}: nobody measured acceptance here ({left_out}); list "
            "an engine that runs here, or the simulator"
        )
    sim_rows = _sim_runs(p, sim) if sim else []
    table_rows = sim_rows + runs
    stats = _stats(p, rd, dman, results, engines_of, served, bnds, held_n, secs)
    stats["served_by"] = blocks
    stats["served"] = {
        "engines": engines,
        "left_out": left_out,
        "dataset": dblock,
        "runs": runs,
        "simulator_runs": sim_rows,
        "table": served_table(table_rows),
        "batch_sizes": list(p.eval_batch_sizes),
        "ks": sorted({r["k"] for r in runs} | {p.k}),
        "speed_note": SPEED_NOTE,
        "latency_note": LATENCY_NOTE,
    }
    stats["template"] = template_block
    if sim:
        stats["boundaries_fed"] = {lb: list(r["boundaries"]) for lb, r in sim["results"].items()}
        stats.update(simulator_method=SIMULATOR_METHOD, greedy_fixes=sim["shared"]["fixes"])
        if turns:
            stats["per_turn"] = eval_chat.per_turn_acceptance(
                sim["results"]["trained"]["traces"], turns, p.k
            )
        if sim["sweep"]:
            stats["k_sweep"] = _k_sweep_block(p, sim["sweep"], stats)
    for engine, b in blocks.items():
        merge_engine_metrics(
            rd,
            engine,
            {
                "eagle3_served_tokens_per_s": b["served_tokens_per_s"],
                "eagle3_tau": b["tau"],
                "plain_served_tokens_per_s": b["plain_tokens_per_s"],
            },
        )
    update_metrics(rd.metrics, "eval", stats)
    _record_checks(p, rd, held_n, stats, blocks)
    serving = write_serving_files(p, rd, card_eval(stats))
    out = {"results": results, "stats": stats, "tokenizer": tok}
    return dict(out, k_sweep=sim["sweep"] if sim else None, serving=serving)


def eval_chat_held(prompt_set) -> list:
    """The held-out prompts of a prompt set (category ``heldout``)."""
    return [q for q, c in zip(prompt_set[0], prompt_set[1]) if c == HELDOUT]


def _k_sweep_block(p, sw: dict, stats: dict) -> dict:
    """metrics.json["eval"]["k_sweep"]: the trained drafter's tau and acceptance rate for every
    k' = 1..k (exact: drafts at every position, :mod:`eagle3nb.drafter.ksweep`)."""
    ks = list(range(1, p.k + 1))
    return {
        "k": ks,
        "tau": [round(sw[k]["tau"], 4) for k in ks],
        "draft_acceptance_rate": [round(sw[k]["draft_acceptance_rate"], 4) for k in ks],
        "cycles": [sw[k]["cycles"] for k in ks],
        "tau_at_k_equals_simulator": round(sw[p.k]["tau"], 4) == stats["tau"]["trained"],
        "method": "trained drafter, greedy: k drafts after every emitted token of each held-out "
        "greedy output (on the simulator's shared target forward per prompt, its draft chains "
        "reused); the run with k' drafts per cycle is the walk j -> j + min(accepted(j), k') "
        "+ 1 (exact; truncating one set of k-cycles is not: a k'-run visits other states)",
    }


def card_eval(stats: dict) -> dict:
    """The trained drafter's acceptance as the model card shows it: the simulator's where it ran,
    else the first serving engine's; and the served table."""
    label = "trained" if "trained" in stats["tau"] else next(iter(stats["tau"]))
    return {
        "k": stats["k"],
        "n_prompts": stats["n_prompts"],
        "engine": stats["engines"][label],
        "tau": stats["tau"][label],
        "draft_acceptance_rate": stats["draft_acceptance_rate"][label],
        "per_position_acceptance": stats["per_position_acceptance"][label],
        "conditional_acceptance": stats["conditional_acceptance"][label],
        "served_table": stats["served"]["table"],
    }


def _record_checks(p: RunParams, rd: RunDir, n_prompts: int, stats: dict, blocks: dict) -> None:
    """metrics.json["checks"]["04_eval_acceptance"]."""
    matched = "drafter's template and target sha256 match this run"
    unchecked = "template/target NOT checked (allow_template_mismatch)"
    checks = [
        "drafter loads: required tensors present, d2t offsets consistent with t2d",
        unchecked if p.allow_template_mismatch else matched,
    ]
    if "trained" in stats["tau"]:
        checks.append(
            f"speculative output == plain greedy output on {n_prompts} prompts: "
            f"{stats['greedy_mismatches']} mismatches"
        )
    for b in blocks.values():
        n_cmp = b.get("greedy_compared_vs_engine_plain")  # the timed prompts (serve_loop.py)
        line = (
            f"{ENGINE_NAMES[b['engine']]} {b['engine_version']} served the exported drafter "
            f"(boundaries {b['boundaries']}): output vs its plain greedy on {n_cmp} "
            f"prompts: {b['greedy_mismatches_vs_engine_plain']} mismatches"
        )
        if b.get("rule_known_by") == "measured":
            line += f" [ids by a measured rule: {b['rule_source']}]"
        if "abs_diff_per_position" in b:
            line += (
                f", vs HF greedy: {b.get('mismatches_vs_hf_greedy')}; per-position |engine - "
                f"simulator| {b['abs_diff_per_position']}"
            )
        checks.append(line)
    record_checks(rd, "04_eval_acceptance", checks)


def _stats(p: RunParams, rd: RunDir, dman, results, engines_of, served, bnds, n_prompts, secs):
    """metrics.json["eval"]: tau, per-position acceptance and counts per run, with what the data
    and the training budget were."""
    gm = read_json(rd.generation_manifest)
    tc = dman["train_config"]
    tm = read_json(rd.metrics).get("train", {})
    budget = (
        f"{gm['n_train']} train prompts x <= {gm['decoding']['max_new_tokens']} greedy tokens "
        f"({gm['generated_tokens']} tokens); {tc['max_steps']} steps of batch "
        f"{tc['batch_size']}, TTT {tc['ttt_steps']} ({tm.get('seconds', '?')} s of training); "
        f"{n_prompts} held-out prompts x <= {p.eval_max_new_tokens} tokens"
    )
    mism = results["trained"]["greedy_mismatches"] if "trained" in results else []
    return {
        "engine": ", ".join(dict.fromkeys(engines_of.values())),
        "engines": engines_of,
        "k": p.k,
        "n_prompts": n_prompts,
        "max_new_tokens": p.eval_max_new_tokens,
        "tau": {k: round(v["tau"], 4) for k, v in results.items()},
        "per_position_acceptance": {
            k: [round(a, 4) for a in v["per_position_acceptance"]] for k, v in results.items()
        },
        "draft_acceptance_rate": {
            k: round(v["draft_acceptance_rate"], 4) for k, v in results.items()
        },
        "conditional_acceptance": {
            k: [
                None if c is None else round(c, 4)
                for c in conditional_acceptance(v["per_position_acceptance"])
            ]
            for k, v in results.items()
        },
        "cycles": {k: v["cycles"] for k, v in results.items()},
        "drafted_tokens": {k: v["cycles"] * p.k for k, v in results.items()},
        "emitted_tokens": {k: v["emitted_tokens"] for k, v in results.items()},
        "greedy_mismatches": len(mism),
        "trained_boundaries": list(bnds),
        "served_boundaries": served,
        "definitions": "tau = mean tokens emitted per draft-verify cycle (1 + accepted drafts); "
        "a_i = fraction of cycles whose draft position i was accepted; draft_acceptance_rate = "
        "accepted / drafted = (tau - 1) / k; conditional_acceptance c_i = a_i / a_(i-1) "
        "(a_0 = 1) = P(position i accepted | position i-1 accepted)",
        "data_and_budget": budget,
        "seconds": round(secs, 2),
    }
