"""04_eval_acceptance: greedy chain speculative decoding of held-out prompts (eagle3nb's simulator
over the HF target) and, with vllm_eval, vLLM serving the exported drafter."""

from __future__ import annotations

import time

import torch

from eagle3nb.drafter import engine_read
from eagle3nb.drafter.acceptance import conditional_acceptance
from eagle3nb.drafter.ksweep import sweep_from_positions
from eagle3nb.drafter.shared_eval import evaluate_shared
from eagle3nb.drafter.export import load_drafter
from eagle3nb.drafter.model import Eagle3Drafter
from eagle3nb.engines.vllm_helpers import served_acceptance, start_vllm
from eagle3nb.manifest import check_compatible, read_json
from eagle3nb.params import RunParams, resolve_device
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.steps import eval_chat
from eagle3nb.steps.publish import write_serving_files
from eagle3nb.steps.recorded import run_or_read
from eagle3nb.steps.common import (
    record_engine_threads,
    use_thread_budget,
    merge_engine_metrics,
    progress_bar,
    record_checks,
    template_of,
)
from eagle3nb.target import models
from eagle3nb.target.capture import n_layers_of
from eagle3nb.text import chat
from eagle3nb.training.loop import init_head_from_target

SIMULATOR = "eagle3nb simulator on hf-transformers target"
SIMULATOR_METHOD = (
    "one target forward per prompt over its greedy continuation (the verify forward's argmax at "
    "every position), every drafter's cycles replayed on its states; equals the per-cycle "
    "simulator up to floating point (eagle3nb.drafter.shared_eval)"
)
# label of the layer-offset baseline in metrics.json["eval"]["tau"] (its boundaries: ["offset"])
OFFSET = "trained, layer offset"


def offset_boundaries(convention: str, bnds: list[int], n: int) -> list[int] | None:
    """The boundaries the *other* engine reads from the same numbers (the case eagle3nb exists
    for): SGLang captures id L at boundary L+1, vLLM at boundary L (``conventions.md``), so a
    drafter trained on SGLang's capture and served by vLLM with the same ids gets every boundary
    -1, one trained on vLLM's (or any boundary-named convention) and served by SGLang +1. Falls
    back to the other direction where the shift leaves [0, n]; None when neither fits.

    Args:
        convention: the training data's layer-id convention (drafter manifest ``convention``).
        bnds: trained boundaries, ascending. n: the target's decoder layer count.
    """
    first = -1 if convention == "sglang" else 1
    for shift in (first, -first):
        moved = [b + shift for b in bnds]
        if min(moved) >= 0 and max(moved) <= n:
            return moved
    return None


def eval_step(p: RunParams, progress=True) -> dict:
    """04: greedy chain speculative decoding of held-out prompts; trained drafter vs baselines
    (untrained; the layer offset of :func:`offset_boundaries`) and, where the exported ids make an engine capture other
    boundaries, the drafter as served; with ``vllm_eval``, vLLM serving the exported drafter too.

    Also (additions): the k sweep of the trained drafter (``k_sweep``; metrics.json
    ["eval"]["k_sweep"]), vLLM's tokens/s with and without the drafter, and the serving files
    (``outputs/<run>/serve_commands.md``, the drafter's model card ``README.md``).

    Returns:
        ``{"results": {label: evaluate_acceptance's dict}, "stats": metrics.json["eval"],
        "tokenizer": the target's tokenizer, "k_sweep": {k': summary} or None, "serving":
        write_serving_files' dict}``.

    Raises:
        ManifestMismatch: the drafter was trained for another template or target (unless
            ``allow_template_mismatch``).
        ValueError: no held-out prompt.

    A re-run on unchanged parameters and inputs reads the recorded result (``reuse_results``,
    :mod:`eagle3nb.steps.recorded`; the tokenizer is loaded again) and starts no engine.
    """
    live = {
        "tokenizer": lambda out: models.load_tokenizer(models.resolve_model(p.model)),
        # 03's re-export replaces drafter/ and drops the model card: written again, not recorded
        "serving": lambda out: write_serving_files(p, RunDir(p), _card_eval(out["stats"])),
    }
    drafter = tuple(f"drafter/{f}" for f in ("config.json", "manifest.json", "model.safetensors"))
    root = RunDir(p).root
    return run_or_read(
        p, root, "04_eval_acceptance", ("data", *drafter), lambda: _eval(p, progress), live
    )


def _eval(p: RunParams, progress: bool) -> dict:
    rd = RunDir(p)
    use_thread_budget(p, rd)
    model, tok, path = models.load_target(p.model, "float32", resolve_device(p))
    emb = model.get_input_embeddings().weight.detach().float().cpu()
    drafter, cfg = load_drafter(rd.drafter, emb)
    drafter.to(model.device)
    dman = read_json(rd.drafter / "manifest.json", "drafter manifest")
    if not p.allow_template_mismatch:
        target_sha = models.model_hash(path, rd.root)
        check_drafter_matches(dman, p.mode, template_of(p, tok), target_sha, rd.drafter)
    bnds = cfg["eagle3nb"]["aux_boundaries"]
    n = n_layers_of(model)
    prompts, turns, template_block = eval_chat.heldout_prompts(p, rd, tok)
    eos = models.stop_token_ids(model, tok)
    bar = (lambda xs: progress_bar()(xs, desc="speculative decoding")) if progress else None
    # what SGLang/vLLM capture when they read the exported ids, by each installed version's rule
    # for this class (differs in the mismatch reproductions: params/mismatch.yaml, kimi_case.yaml)
    served = _served(p, cfg, n, dman.get("target", {}).get("architecture"))
    runs = _runs(p, model, drafter, dman, bnds, n, served)
    t0 = time.time()
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
    results = shared["results"]
    secs = time.time() - t0
    engines_of = {label: SIMULATOR for label in results}
    vllm_block = None
    if p.vllm_eval and "vllm" in served:  # not when the export refused vLLM
        label, result, vllm_block = _vllm_served(
            p, rd, path, prompts, eos, served, bnds, results, shared["hf_greedy"]
        )
        results[label] = result
        version = vllm_block["engine_version"]
        engines_of[label] = f"vllm {version} (its own EAGLE-3 serving and spec_decode counters)"
    stats = _stats(p, rd, dman, results, engines_of, served, bnds, len(prompts), secs, vllm_block)
    stats["boundaries_fed"] = {label: list(b) for label, (_, b) in runs.items()}
    stats["template"] = template_block
    if turns:
        stats["per_turn"] = eval_chat.per_turn_acceptance(results["trained"]["traces"], turns, p.k)
    stats.update(simulator_method=SIMULATOR_METHOD, greedy_fixes=shared["fixes"])
    sweep = _k_sweep(p, shared["positions"], stats) if p.k_sweep else None
    update_metrics(rd.metrics, "eval", stats)
    _record_checks(p, rd, len(prompts), stats, vllm_block)
    serving = write_serving_files(p, rd, _card_eval(stats))
    out = {"results": results, "stats": stats, "tokenizer": tok}
    return dict(out, k_sweep=sweep, serving=serving)


def _k_sweep(p: RunParams, positions: list[dict], stats: dict) -> dict:
    """The trained drafter's tau and acceptance rate for every k' = 1..k (exact: drafts at every
    position, see :mod:`eagle3nb.drafter.ksweep`) from ``positions`` (per prompt ``{"m",
    "n_out"}``, :func:`eagle3nb.drafter.shared_eval.evaluate_shared`: the same target forward and
    draft chains as the simulator's), into ``stats["k_sweep"]``; returns it by k'."""
    t0 = time.time()
    sw = sweep_from_positions(positions, p.k)
    ks = list(range(1, p.k + 1))
    stats["k_sweep"] = {
        "k": ks,
        "tau": [round(sw[k]["tau"], 4) for k in ks],
        "draft_acceptance_rate": [round(sw[k]["draft_acceptance_rate"], 4) for k in ks],
        "cycles": [sw[k]["cycles"] for k in ks],
        "tau_at_k_equals_simulator": round(sw[p.k]["tau"], 4) == stats["tau"]["trained"],
        "method": "trained drafter, greedy: k drafts after every emitted token of each held-out "
        "greedy output (on the simulator's shared target forward per prompt, its draft chains "
        "reused); the run with k' drafts per cycle is the walk j -> j + min(accepted(j), k') "
        "+ 1 (exact; truncating one set of k-cycles is not: a k'-run visits other states)",
        "seconds": round(time.time() - t0, 2),
    }
    return sw


def _card_eval(stats: dict) -> dict:
    """The trained drafter's acceptance as the model card shows it."""
    return {
        "k": stats["k"],
        "n_prompts": stats["n_prompts"],
        "engine": SIMULATOR,
        "tau": stats["tau"]["trained"],
        "draft_acceptance_rate": stats["draft_acceptance_rate"]["trained"],
        "per_position_acceptance": stats["per_position_acceptance"]["trained"],
        "conditional_acceptance": stats["conditional_acceptance"]["trained"],
    }


def check_drafter_matches(dman: dict, mode: str, template: str, target_sha: str, where) -> None:
    """Refuse a drafter (manifest ``dman``, folder ``where``) trained for another chat template
    (text ``template`` in ``mode``) or another target (sha256 ``target_sha``).

    Raises:
        ManifestMismatch: the template or the target differs (``allow_template_mismatch``
            skips this check).
    """
    want = {
        "template": {"mode": mode, "sha256": chat.template_hash(template)},
        "target": {"sha256": target_sha},
    }
    keys = ["template", "target.sha256"]
    check_compatible(dman, want, keys, f"drafter {where}", "allow_template_mismatch")


def _served(p: RunParams, cfg: dict, n: int, arch: str | None) -> dict:
    """``{engine: boundaries}`` each engine captures from the exported config, read by the
    installed version's rule for ``arch`` (:mod:`eagle3nb.target.engine_rules`) where the table
    holds it, else by the engine's generic convention; an engine the export refused is left out."""
    from eagle3nb.steps.common import engine_versions
    from eagle3nb.target.engine_rules import engine_rule

    versions = engine_versions(p) if arch else {}
    out = {}
    refused = engine_read.refused_engines(cfg)  # e.g. SGLang for boundary N: serves nothing
    for e in engine_read.ENGINE_READS:
        if e in refused:
            continue
        rule = None
        if e in versions:
            try:
                rule = engine_rule(e, versions[e], arch)
                out[e] = engine_read.read_as_engine(cfg, e, n, None if rule.refused else rule)
            except ValueError:  # no rule for this key, or ids outside its range
                rule = None
        if rule is None:
            out[e] = engine_read.read_as_engine(cfg, e, n)
        out[e] = out[e]["boundaries"]
    return out


def _runs(p: RunParams, model, drafter, dman: dict, bnds, n: int, served: dict) -> dict:
    """``{label: (drafter, boundaries)}`` to evaluate: the trained drafter, as served where an
    engine reads other boundaries from the exported ids, and with ``baselines`` an untrained
    drafter and the trained one at the other engine's reading of the same ids
    (:func:`offset_boundaries`)."""
    runs = {"trained": (drafter, bnds)}
    for sb in served.values():
        if sb != list(bnds) and f"trained, as served (ids -> {sb})" not in runs:
            runs[f"trained, as served (ids -> {sb})"] = (drafter, sb)
    if p.baselines:
        torch.manual_seed(p.seed + 1234)
        emb = model.get_input_embeddings().weight.detach().float().cpu()
        fresh = Eagle3Drafter(drafter.config, emb)
        fresh.set_vocab(drafter.d2t.cpu(), drafter.t2d.cpu())
        if dman["train_config"].get("init_head_from_target"):
            init_head_from_target(fresh, model)  # the trained drafter's starting point
        runs["untrained"] = (fresh.eval().to(model.device), bnds)
        moved = offset_boundaries(dman.get("convention", "sglang"), list(bnds), n)
        if moved is not None and moved not in [list(x) for _, x in runs.values()]:
            runs[OFFSET] = (drafter, moved)
    return runs


def _vllm_served(
    p: RunParams, rd: RunDir, path, prompts, eos, served, bnds, results, hf_greedy
) -> tuple[str, dict, dict]:
    """The same drafter files served by vLLM itself: its counters next to the simulator's
    (``results``) for the boundaries vLLM reads from the exported ids (the trained ones unless
    export_layer_ids says otherwise); its speed merged into metrics.json["engines"]["vllm"].
    ``hf_greedy``: HF generate's greedy output per prompt (the simulator's check computed it).
    Returns ``(label, result, metrics.json["eval"]["vllm_served"])``."""
    if served["vllm"] == list(bnds):
        sim_label = "trained"
    else:
        sim_label = f"trained, as served (ids -> {served['vllm']})"
    with start_vllm(p, path, "float32", rd.root) as client:
        record_engine_threads(rd, client)
        info = client.info()
        v = served_acceptance(
            client, rd.drafter, prompts, p.k, p.eval_max_new_tokens, eos, hf_greedy
        )
    label = f"trained, served by vLLM {info['engine_version']}"
    v.pop("outputs")
    sim = results[sim_label]
    vpos, spos = v["per_position_acceptance"], sim["per_position_acceptance"]
    block = {
        "engine_version": info["engine_version"],
        "device": info["device"],
        "boundaries": served["vllm"],
        "compared_with": sim_label,
        "tau": round(v["tau"], 4),
        "per_position_acceptance": [round(a, 4) for a in vpos],
        "simulator_tau": round(sim["tau"], 4),
        "simulator_per_position_acceptance": [round(a, 4) for a in spos],
        "abs_diff_per_position": [round(abs(a - b), 4) for a, b in zip(vpos, spos)],
        "counters": v["counters"],
        "simulator_cycles": sim["cycles"],
        "greedy_mismatches_vs_vllm_plain": len(v["greedy_mismatches"]),
        "mismatches_vs_hf_greedy": len(v["hf_mismatches"]),
        "served_tokens_per_s": round(v["tokens_per_s"], 1) if v["tokens_per_s"] else None,
        "plain_tokens_per_s": _r1(v["plain_tokens_per_s"]),
        "speedup_with_drafter": _r1(v["speedup"], 3),
        "speed_note": v["speed_note"],
    }
    merge_engine_metrics(
        rd,
        "vllm",
        {
            "eagle3_served_tokens_per_s": block["served_tokens_per_s"],
            "eagle3_tau": block["tau"],
            "plain_served_tokens_per_s": block["plain_tokens_per_s"],
        },
    )
    return label, dict(v, boundaries=served["vllm"], traces=[]), block


def _r1(x, nd=1):
    return round(x, nd) if x else None


def _record_checks(p: RunParams, rd: RunDir, n_prompts: int, stats: dict, vllm_block) -> None:
    """metrics.json["checks"]["04_eval_acceptance"]."""
    matched = "drafter's template and target sha256 match this run"
    unchecked = "template/target NOT checked (allow_template_mismatch)"
    checks = [
        "drafter loads: required tensors present, d2t offsets consistent with t2d",
        unchecked if p.allow_template_mismatch else matched,
        (
            f"speculative output == plain greedy output on {n_prompts} prompts: "
            f"{stats['greedy_mismatches']} mismatches"
        ),
    ]
    if vllm_block:
        checks.append(_vllm_check_line(vllm_block))
    record_checks(rd, "04_eval_acceptance", checks)


def _vllm_check_line(b: dict) -> str:
    """The metrics.json["checks"] line of vLLM's served run (``b``: its block)."""
    return (
        f"vLLM {b['engine_version']} served the exported drafter (boundaries {b['boundaries']}): "
        f"output vs its plain greedy: {b['greedy_mismatches_vs_vllm_plain']} mismatches, vs HF "
        f"greedy: {b['mismatches_vs_hf_greedy']}; per-position |vLLM - simulator| "
        f"{b['abs_diff_per_position']}"
    )


def _stats(
    p: RunParams, rd: RunDir, dman, results, engines_of, served, bnds, n_prompts, secs, vllm_block
) -> dict:
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
    stats = {
        "engine": SIMULATOR + (", and vLLM serving" if vllm_block else ""),
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
        "greedy_mismatches": len(results["trained"]["greedy_mismatches"]),
        "trained_boundaries": list(bnds),
        "served_boundaries": served,
        "definitions": "tau = mean tokens emitted per draft-verify cycle (1 + accepted drafts); "
        "a_i = fraction of cycles whose draft position i was accepted; draft_acceptance_rate = "
        "accepted / drafted = (tau - 1) / k; conditional_acceptance c_i = a_i / a_(i-1) "
        "(a_0 = 1) = P(position i accepted | position i-1 accepted)",
        "data_and_budget": budget,
        "seconds": round(secs, 2),
    }
    if vllm_block:
        stats["vllm_served"] = vllm_block
    return stats
