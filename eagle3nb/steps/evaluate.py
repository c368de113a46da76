"""04_eval_acceptance: greedy chain speculative decoding of held-out prompts (eagle3nb's simulator
over the HF target) and, with vllm_eval, vLLM serving the exported drafter."""

from __future__ import annotations

import time

import torch

from eagle3nb.text import chat
from eagle3nb.target import models
from eagle3nb.drafter.acceptance import evaluate_acceptance, greedy_generate
from eagle3nb.target.capture import n_layers_of
from eagle3nb.drafter.model import Eagle3Drafter
from eagle3nb.drafter import engine_read as engine_configs
from eagle3nb.drafter.export import load_drafter
from eagle3nb.text.generation import read_jsonl
from eagle3nb.manifest import check_compatible, read_json
from eagle3nb.steps.common import merge_engine_metrics, progress_bar, record_checks, template_of
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.params import RunParams, resolve_device
from eagle3nb.training.loop import init_head_from_target
from eagle3nb.engines.vllm_helpers import served_acceptance, start_vllm


def eval_step(p: RunParams, progress=True) -> dict:
    """04: greedy chain speculative decoding of held-out prompts; trained drafter vs baselines."""
    rd = RunDir(p)
    model, tok, path = models.load_target(p.model, "float32", resolve_device(p))
    drafter, cfg = load_drafter(rd.drafter, model.get_input_embeddings().weight.detach().float().cpu())
    drafter.to(model.device)
    dman = read_json(rd.drafter / "manifest.json", "drafter manifest")
    if not p.allow_template_mismatch:
        check_compatible(dman, {"template": {"mode": p.mode, "sha256": chat.template_hash(template_of(p, tok))}, "target": {"sha256": models.model_hash(path, rd.root)}}, ["template", "target.sha256"], f"drafter {rd.drafter}", "allow_template_mismatch")
    bnds = cfg["eagle3nb"]["aux_boundaries"]
    n = n_layers_of(model)
    held = [r for r in read_jsonl(rd.generated) if r["split"] == "heldout"]
    if p.max_eval_prompts:
        held = held[: p.max_eval_prompts]
    if not held:
        raise ValueError("no held-out prompt to evaluate; raise heldout_fraction or max_eval_prompts")
    prompts = [r["prompt_ids"] for r in held]
    eos = models.stop_token_ids(model, tok)
    bar = (lambda xs: progress_bar()(xs, desc="speculative decoding")) if progress else None
    runs = {"trained": (drafter, bnds)}
    # what SGLang/vLLM capture when they read the exported ids (differs only in the mismatch reproduction)
    served = {e: engine_configs.read_as_engine(cfg, e, n)["boundaries"] for e in engine_configs.ENGINE_READS}
    for e, sb in served.items():
        if sb != list(bnds) and f"trained, as served (ids -> {sb})" not in runs:
            runs[f"trained, as served (ids -> {sb})"] = (drafter, sb)
    if p.baselines:
        torch.manual_seed(p.seed + 1234)
        fresh = Eagle3Drafter(drafter.config, model.get_input_embeddings().weight.detach().float().cpu())
        fresh.set_vocab(drafter.d2t.cpu(), drafter.t2d.cpu())
        if dman["train_config"].get("init_head_from_target"):
            init_head_from_target(fresh, model)  # the trained drafter's starting point
        runs["untrained"] = (fresh.eval().to(model.device), bnds)
        if max(bnds) + 1 <= n and [b + 1 for b in bnds] not in [list(x) for _, x in runs.values()]:
            runs["trained, boundaries +1"] = (drafter, [b + 1 for b in bnds])
    results, t0 = {}, time.time()
    for label, (d, b) in runs.items():
        results[label] = evaluate_acceptance(model, d, prompts, b, p.k, p.eval_max_new_tokens, eos, check_greedy=(label == "trained"), progress=bar)
    secs = time.time() - t0
    vllm_block, engines_of = None, {label: "eagle3nb simulator on hf-transformers target" for label in results}
    if p.vllm_eval:
        # the same drafter files served by vLLM itself; its counters next to the simulator's for the
        # boundaries vLLM reads from the exported ids (the trained ones unless export_layer_ids says otherwise)
        sim_label = "trained" if served["vllm"] == list(bnds) else f"trained, as served (ids -> {served['vllm']})"
        hf_greedy = [greedy_generate(model, q, p.eval_max_new_tokens, eos) for q in prompts]
        with start_vllm(p, path, "float32", rd.root) as client:
            info = client.info()
            v = served_acceptance(client, rd.drafter, prompts, p.k, p.eval_max_new_tokens, eos, hf_greedy)
        label = f"trained, served by vLLM {info['engine_version']}"
        v.pop("outputs")
        results[label] = dict(v, boundaries=served["vllm"], traces=[])
        engines_of[label] = f"vllm {info['engine_version']} (its own EAGLE-3 serving and spec_decode counters)"
        sim = results[sim_label]
        vllm_block = {
            "engine_version": info["engine_version"], "device": info["device"], "boundaries": served["vllm"], "compared_with": sim_label,
            "tau": round(v["tau"], 4), "per_position_acceptance": [round(a, 4) for a in v["per_position_acceptance"]],
            "simulator_tau": round(sim["tau"], 4), "simulator_per_position_acceptance": [round(a, 4) for a in sim["per_position_acceptance"]],
            "abs_diff_per_position": [round(abs(a - b), 4) for a, b in zip(v["per_position_acceptance"], sim["per_position_acceptance"])],
            "counters": v["counters"], "simulator_cycles": sim["cycles"],
            "greedy_mismatches_vs_vllm_plain": len(v["greedy_mismatches"]), "mismatches_vs_hf_greedy": len(v["hf_mismatches"]),
            "served_tokens_per_s": round(v["tokens_per_s"], 1) if v["tokens_per_s"] else None,
        }
        merge_engine_metrics(rd, "vllm", {"eagle3_served_tokens_per_s": vllm_block["served_tokens_per_s"], "eagle3_tau": vllm_block["tau"]})
    gm = read_json(rd.generation_manifest)
    tc = dman["train_config"]
    tm = read_json(rd.metrics).get("train", {})
    stats = {
        "engine": "eagle3nb simulator on hf-transformers target" + (", and vLLM serving" if vllm_block else ""), "engines": engines_of,
        "k": p.k, "n_prompts": len(prompts), "max_new_tokens": p.eval_max_new_tokens,
        "tau": {k: round(v["tau"], 4) for k, v in results.items()},
        "per_position_acceptance": {k: [round(a, 4) for a in v["per_position_acceptance"]] for k, v in results.items()},
        "draft_acceptance_rate": {k: round(v["draft_acceptance_rate"], 4) for k, v in results.items()},
        "cycles": {k: v["cycles"] for k, v in results.items()},
        "drafted_tokens": {k: v["cycles"] * p.k for k, v in results.items()},
        "emitted_tokens": {k: v["emitted_tokens"] for k, v in results.items()},
        "greedy_mismatches": len(results["trained"]["greedy_mismatches"]),
        "trained_boundaries": list(bnds), "served_boundaries": served,
        "definitions": "tau = mean tokens emitted per draft-verify cycle (1 + accepted drafts); a_i = fraction of cycles whose draft position i was accepted; draft_acceptance_rate = accepted / drafted = (tau - 1) / k",
        "data_and_budget": f"{gm['n_train']} train prompts x <= {gm['decoding']['max_new_tokens']} greedy tokens ({gm['generated_tokens']} tokens); {tc['max_steps']} steps of batch {tc['batch_size']}, TTT {tc['ttt_steps']} ({tm.get('seconds', '?')} s of training); {len(prompts)} held-out prompts x <= {p.eval_max_new_tokens} tokens",
        "seconds": round(secs, 2),
    }
    if vllm_block:
        stats["vllm_served"] = vllm_block
    update_metrics(rd.metrics, "eval", stats)
    record_checks(rd, "04_eval_acceptance", [
        "drafter loads: required tensors present, d2t offsets consistent with t2d",
        "drafter's template and target sha256 match this run" if not p.allow_template_mismatch else "template/target NOT checked (allow_template_mismatch)",
        f"speculative output == plain greedy output on {len(prompts)} prompts: {stats['greedy_mismatches']} mismatches",
    ] + ([f"vLLM {vllm_block['engine_version']} served the exported drafter (boundaries {vllm_block['boundaries']}): output vs its plain greedy: {vllm_block['greedy_mismatches_vs_vllm_plain']} mismatches, vs HF greedy: {vllm_block['mismatches_vs_hf_greedy']}; per-position |vLLM - simulator| {vllm_block['abs_diff_per_position']}"] if vllm_block else []))
    return {"results": results, "stats": stats, "tokenizer": tok}
