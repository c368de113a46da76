"""One function per notebook: the work of 01/02b/03/04, reading and writing only the run directory.

Notebooks call these and plot; each step validates its inputs (and the previous step's manifest)
before long work starts, writes its artefacts atomically, and merges its numbers into metrics.json.
"""

from __future__ import annotations

import time

import torch

from . import chat, conventions, extract, models
from .acceptance import evaluate_acceptance
from .alignment import alignment_matrix, alignment_verdict, reference_states
from .capture import HFCaptureEngine, n_layers_of
from .dataset import AuxDataset
from .drafter import Eagle3Drafter
from . import engine_configs
from .engine_configs import engine_report
from .export import export_drafter, load_drafter
from .generate import generate_batch, read_jsonl, write_jsonl
from .manifest import atomic_write_json, check_compatible, provenance, read_json, sha256_file
from .online import OnlineSource
from .params import RunDir, RunParams, resolve_device, resolve_path, update_metrics
from .prompts import load_prompts, split_prompts
from .train import TrainConfig, init_head_from_target, train_drafter

__all__ = ["record_checks", "generate_step", "extract_step", "train_step", "eval_step", "target_info", "resolve_aux"]


def _progress():
    from tqdm.auto import tqdm

    return tqdm


def target_info(path, model, cache_dir=None) -> dict:
    """Manifest block describing the target model (its sha256 cached in ``cache_dir``, the run folder)."""
    c = model.config
    return {"name": path.name, "path": str(path), "sha256": models.model_hash(path, cache_dir), "architecture": (c.architectures or ["?"])[0], "n_layers": n_layers_of(model), "hidden_size": c.hidden_size, "vocab_size": c.vocab_size}


def _template(p: RunParams, tok) -> str:
    text = resolve_path(p.chat_template).read_text() if p.chat_template else None
    return chat.template_text(tok, text, p.mode)


def resolve_aux(p: RunParams, n_layers: int) -> tuple[list[int], list[int]]:
    """``(layer_ids in p.convention, boundaries)`` of this run (see
    :func:`eagle3nb.conventions.aux_ids_and_boundaries`)."""
    return conventions.aux_ids_and_boundaries(p.convention, p.layer_ids, n_layers)


def record_checks(rd: RunDir, step: str, checks: list[str]) -> None:
    """List, in metrics.json["checks"][step], the checks that ran on this run's data."""
    update_metrics(rd.metrics, "checks", {step: checks})


def generate_step(p: RunParams, progress=True) -> dict:
    """01: regenerate a continuation for each train prompt; store held-out prompts for 04."""
    rd = RunDir(p).make()
    model, tok, path = models.load_target(p.model, p.dtype, resolve_device(p))
    template = _template(p, tok)
    train, held = split_prompts(load_prompts(resolve_path(p.prompts_file)), p.heldout_fraction, p.seed)
    if p.max_train_prompts:
        train = train[: p.max_train_prompts]
    ctx = model.config.max_position_embeddings
    tmpl = template if p.mode == "chat" else None
    recs = []
    for split, prompts in (("train", train), ("heldout", held)):
        for i, text in enumerate(prompts):
            ids = chat.encode_prompt(tok, text, p.mode, tmpl)
            if len(ids) + p.max_new_tokens > ctx:
                raise ValueError(f"prompt {split}[{i}] has {len(ids)} tokens; with max_new_tokens={p.max_new_tokens} it exceeds the context of {ctx}; shorten it or lower max_new_tokens")
            recs.append({"id": len(recs), "split": split, "prompt": text, "prompt_ids": ids})
    todo = [r for r in recs if r["split"] == "train"]
    eos = models.stop_token_ids(model, tok)
    t0 = time.time()
    batches = range(0, len(todo), p.gen_batch_size)
    for s in (_progress()(batches, desc="generate") if progress else batches):
        chunk = todo[s : s + p.gen_batch_size]
        outs = generate_batch(model, [r["prompt_ids"] for r in chunk], p.max_new_tokens, eos, p.temperature, p.top_p, p.seed + s)
        for r, o in zip(chunk, outs):
            r["output_ids"], r["text"] = o, tok.decode(o, skip_special_tokens=True)
    secs = time.time() - t0
    write_jsonl(rd.generated, recs)
    n_tok = sum(len(r["output_ids"]) for r in todo)
    man = provenance(
        p.seed, kind="eagle3nb-generation", target=target_info(path, model, rd.root),
        engine={"name": "hf-transformers", "version": __import__("transformers").__version__},
        decoding={"temperature": p.temperature, "top_p": p.top_p, "max_new_tokens": p.max_new_tokens, "greedy": p.temperature == 0, "stop_token_ids": eos},
        template={"mode": p.mode, "sha256": chat.template_hash(template)}, dtype=p.dtype,
        prompts_file={"path": str(resolve_path(p.prompts_file)), "sha256": sha256_file(resolve_path(p.prompts_file))},
        n_train=len(train), n_heldout=len(held), generated_tokens=n_tok, file=rd.generated.name, file_sha256=sha256_file(rd.generated),
    )
    atomic_write_json(rd.generation_manifest, man)
    stats = {"engine": "hf-transformers", "n_train_prompts": len(train), "n_heldout_prompts": len(held), "generated_tokens": n_tok, "seconds": round(secs, 3), "tokens_per_s": round(n_tok / secs, 1) if secs else None}
    update_metrics(rd.metrics, "generate", stats)
    record_checks(rd, "01_generate", [f"params validated ({len(RunParams.model_fields)} keys)", f"{len(recs)} prompts fit the context of {ctx} with max_new_tokens={p.max_new_tokens}", "train/held-out split disjoint by prompt hash"])
    return {"manifest": man, "records": recs, "stats": stats}


def extract_step(p: RunParams, progress=True) -> dict:
    """02b: capture aux states at SGLang's capture point (engine: HF transformers) into shards."""
    rd = RunDir(p)
    gman = read_json(rd.generation_manifest, "generation manifest (from 01_generate)")
    model, tok, path = models.load_target(p.model, p.dtype, resolve_device(p))
    tinfo = target_info(path, model, rd.root)
    check_compatible(gman, {"target": tinfo, "template": {"mode": p.mode, "sha256": chat.template_hash(_template(p, tok))}}, ["target.sha256", "template"], "generation output", "(delete the run folder)")
    n = tinfo["n_layers"]
    ids, bnds = resolve_aux(p, n)
    engine = HFCaptureEngine(model, p.convention, p.capture_batch_size)
    assert engine.boundaries(ids) == bnds
    # both modes: the served prompt (chat: the template's prefix rendering) + exactly the generated ids
    samples = extract.train_samples(rd)  # the same list each extraction worker rebuilds
    if not samples:
        raise ValueError("no train sample with generated tokens: 01_generate produced nothing to extract; check prompts_file and max_new_tokens")
    # measure, before writing anything, which boundaries the engine really captured on one sample
    probe = samples[0][1]
    err, ref_b = alignment_matrix(engine.capture([probe], ids)[0].aux.float(), reference_states(model, probe), len(ids))
    align = alignment_verdict(err, ref_b, bnds, p.dtype)
    if not align["ok"] and not p.allow_boundary_mismatch:
        raise ValueError(f"{engine.engine_name} captured boundaries {align['measured']} for {p.convention} ids {ids}, declared {bnds} ({[s_['verdict'] for s_ in align['slots']]}); fix convention/layer_ids, or set allow_boundary_mismatch=True to continue")
    disk = extract.disk_plan(p, samples, len(bnds), tinfo["hidden_size"])
    extract.check_disk(disk)  # exact shard bytes vs free space, before any capture
    need, free = disk["total_bytes"], disk["free_bytes"]
    man = provenance(
        p.seed, target=tinfo,
        engine={"name": engine.engine_name, "version": engine.engine_version, "capture_point_of": p.convention},
        convention=p.convention, layer_ids=ids, aux_boundaries=bnds, final_boundary=n, dtype=p.dtype,
        template=gman["template"], generation_sha256=gman["file_sha256"],
    )
    t0 = time.time()
    m = extract.write(p, rd, samples, engine, ids, man, _progress() if progress else None)
    secs = time.time() - t0
    table = conventions.boundary_table(bnds, n)
    stats = {"engine": engine.engine_name, "capture_point_of": p.convention, "layer_ids": ids, "aux_boundaries": bnds, "n_samples": m["n_samples"], "n_tokens": m["n_tokens"], "estimated_bytes": need, "disk": disk, "workers": p.extract_workers, "aux_storage": p.aux_storage, "aux_quantization": m.get("aux_quantization"), "skipped": {k: len(v) for k, v in m["skipped"].items()}, "seconds": round(secs, 3), "tokens_per_s": round(m["n_tokens"] / secs, 1) if secs else None}
    update_metrics(rd.metrics, "extract", stats)
    record_checks(rd, "02b_extract_sglang", [
        f"target sha256 and template match the generation manifest ({gman['target']['sha256'][:12]})",
        f"{p.convention} ids {ids} -> boundaries {bnds}: capturable, strictly increasing",
        f"alignment on a probe sample: measured boundaries {align['measured']} ({'match' if align['ok'] else 'MISMATCH, allowed by allow_boundary_mismatch'}; tolerance {align['tolerance']})",
        f"disk need {need} B (shards exact: {disk['shard_bytes']} B) <= free {free} B",
        f"engine row count == token count for all {m['n_samples']} samples",
        f"finite states: {len(m['skipped']['nonfinite'])} samples skipped, {len(m['skipped']['empty_loss_mask'])} with empty loss mask skipped",
        f"{len(m['shards'])} shards written atomically with sha256",
    ])
    update_metrics(rd.metrics, "alignment", {engine.engine_name: {"declared": align["declared"], "measured": align["measured"], "verdicts": [x["verdict"] for x in align["slots"]], "max_error": max(x["error"] for x in align["slots"]), "tolerance": align["tolerance"]}})
    return {"manifest": m, "boundary_table": table, "stats": stats, "alignment": align, "alignment_error": err, "reference_boundaries": ref_b}


def train_step(p: RunParams, progress=True) -> dict:
    """03: train the drafter with TTT on the dataset (``training_mode: online``: on 01's samples,
    the target capturing each batch) and export it for SGLang and vLLM."""
    rd = RunDir(p)
    ds = AuxDataset(rd.dataset) if p.training_mode == "offline" else None
    model, tok, path = models.load_target(p.model, "float32", resolve_device(p))
    if ds is None:
        ds = _online_source(p, rd, model, tok, path)
    if not p.allow_manifest_mismatch:
        want = {"target": {"sha256": models.model_hash(path, rd.root)}, "dtype": p.dtype, "convention": p.convention, "template": {"mode": p.mode, "sha256": chat.template_hash(_template(p, tok))}}
        check_compatible(ds.manifest, want, ["target.sha256", "dtype", "convention", "template"], f"dataset {rd.dataset}", "allow_manifest_mismatch")
        _, bnds = resolve_aux(p, n_layers_of(model))
        check_compatible(ds.manifest, {"aux_boundaries": bnds}, ["aux_boundaries"], f"dataset {rd.dataset} (boundaries the exported drafter will be served with)", "allow_manifest_mismatch")
    # the boundaries the exported ids make SGLang and vLLM capture; "engine_default" writes the ids
    # users copy from the engines' defaults (the user's failure when the data came from elsewhere)
    n_t = n_layers_of(model)
    serve_b = conventions.pick_default_boundaries(n_t) if p.export_layer_ids == "engine_default" else list(ds.manifest["aux_boundaries"])
    serve_mismatch = serve_b != list(ds.manifest["aux_boundaries"])
    if serve_mismatch and not p.allow_manifest_mismatch:
        raise ValueError(
            f"export_layer_ids={p.export_layer_ids!r}: the exported ids make SGLang and vLLM capture boundaries {serve_b}, "
            f"but dataset {rd.dataset} was captured at boundaries {ds.manifest['aux_boundaries']} ({ds.manifest['convention']} ids "
            f"{ds.manifest['layer_ids']}); the served drafter would read other tensors than it was trained on. Use "
            "export_layer_ids: trained, or set allow_manifest_mismatch=True to reproduce the mismatch"
        )
    if p.draft_vocab_size > model.config.vocab_size:
        raise ValueError(f"draft_vocab_size={p.draft_vocab_size} exceeds the target vocab ({model.config.vocab_size}); lower it")
    cfg = TrainConfig(draft_vocab_size=p.draft_vocab_size, draft_num_heads=p.draft_num_heads, draft_num_kv_heads=p.draft_num_kv_heads, draft_intermediate_size=p.draft_intermediate_size, ttt_steps=p.ttt_steps, loss_decay=p.loss_decay, batch_size=p.batch_size, max_steps=p.max_steps, lr=p.lr, warmup_steps=p.warmup_steps, weight_decay=p.weight_decay, aux_noise=p.aux_noise, init_head_from_target=p.init_head_from_target, seed=p.seed, checkpoint_every=p.checkpoint_every)
    drafter, rep = train_drafter(ds, model, cfg, rd.train, _progress() if progress else None)
    atomic_write_json(rd.train / "history.json", rep["history"])
    bnds = ds.manifest["aux_boundaries"]
    man = provenance(p.seed, kind="eagle3nb-drafter", training_mode=p.training_mode, target=ds.manifest["target"], dataset_engine=ds.manifest["engine"], convention=ds.manifest["convention"], layer_ids=ds.manifest["layer_ids"], aux_boundaries=bnds, dtype=ds.manifest["dtype"], template=ds.manifest["template"], train_config=cfg.__dict__, vocab=rep["vocab"])
    export_drafter(drafter, rd.drafter, bnds, ds.manifest["target"]["n_layers"], man, tok.bos_token_id, tok.eos_token_id, serve_b)
    _, cfg_json = load_drafter(rd.drafter)  # refuses a folder missing a tensor or contradicting itself
    engines = engine_report(cfg_json, bnds, ds.manifest["target"]["n_layers"], {"norm_before_residual": drafter.config.norm_before_residual})
    update_metrics(rd.metrics, "export", {"engines": engines, "export_layer_ids": p.export_layer_ids, "trained_boundaries": bnds, "served_boundaries": serve_b, "serve_mismatch": serve_mismatch})
    last = rep["history"][-1]
    stats = {"steps": rep["steps"], "seconds": round(rep["seconds"], 2), "loss_token_steps_per_s": round(rep["tokens_per_s"], 1) if rep["tokens_per_s"] else None, "final_loss": last["loss"], "final_loss_is": f"sum over TTT steps j of {p.loss_decay}**j x soft cross-entropy, last logged training batch", "last_batch_step_acc": last["step_acc"], "last_batch_step_acc_is": "training-batch accuracy per TTT step (not held-out; see eval)", "draft_vocab_size": p.draft_vocab_size, "vocab": rep["vocab"], "empty_batches": rep["empty_batches"], "n_train_samples": len(ds), "n_train_tokens_incl_prompts": ds.manifest["n_tokens"], "training_mode": p.training_mode}
    if p.training_mode == "online":  # the target's share of the training time
        stats["online"] = {"target_capture_seconds": round(ds.capture_seconds, 3), "target_capture_tokens_per_s": round(ds.captured_tokens / ds.capture_seconds, 1) if ds.capture_seconds else None, "nonfinite_rows_masked": ds.nonfinite_rows, "note": "capture times are of this process only (a resumed run counts its last part)"}
    update_metrics(rd.metrics, "train", stats)
    record_checks(rd, "03_train", [
        f"dataset: {len(ds.manifest['shards'])} shard sha256 verified at load" if p.training_mode == "offline" else "online: the target captured every batch (no dataset on disk); its sha256 and template match 01's output",
        "manifest target/dtype/convention/template " + ("match this run" if not p.allow_manifest_mismatch else "NOT checked (allow_manifest_mismatch)"),
        f"dataset boundaries {bnds} == boundaries the drafter is served with" if not p.allow_manifest_mismatch else "serve-time boundaries NOT checked (allow_manifest_mismatch)",
        "exported drafter reloads: required tensors present, shapes match config, d2t offsets consistent with t2d",
        (f"SERVE MISMATCH (allowed by allow_manifest_mismatch): trained at boundaries {bnds}, exported ids serve {serve_b}" if serve_mismatch else f"exported ids serve the trained boundaries {bnds}"),
        "engines read back the trained boundaries: " + ", ".join(f"{e}={'ok' if r['ok'] else 'MISMATCH ' + str(r)}" for e, r in engines.items()),
    ])
    return {"history": rep["history"], "stats": stats, "export_dir": rd.drafter}


def _online_source(p: RunParams, rd: RunDir, model, tok, path) -> OnlineSource:
    """03 online: 01's samples (as 02 would extract them), the target (``p.dtype``) capturing each
    batch; the same checks as 02 before training (generation manifest, measured boundaries)."""
    gman = read_json(rd.generation_manifest, "generation manifest (from 01_generate)")
    tinfo = target_info(path, model, rd.root)
    check_compatible(gman, {"target": tinfo, "template": {"mode": p.mode, "sha256": chat.template_hash(_template(p, tok))}}, ["target.sha256", "template"], "generation output", "(delete the run folder)")
    ids, bnds = resolve_aux(p, tinfo["n_layers"])
    cap = model if p.dtype == "float32" else models.load_target(p.model, p.dtype, resolve_device(p))[0]
    samples = extract.train_samples(rd)
    if not samples:
        raise ValueError("no train sample with generated tokens: 01_generate produced nothing to train on; check prompts_file and max_new_tokens")
    src = OnlineSource(samples, cap, ids, p.convention, provenance(p.seed, target=tinfo, dtype=p.dtype, template=gman["template"], generation_sha256=gman["file_sha256"]))
    probe = samples[0][1]
    err, ref_b = alignment_matrix(src.engine.capture([probe], ids)[0].aux.float(), reference_states(cap, probe), len(ids))
    align = alignment_verdict(err, ref_b, bnds, p.dtype)
    if not align["ok"] and not p.allow_boundary_mismatch:
        raise ValueError(f"{src.engine.engine_name} captured boundaries {align['measured']} for {p.convention} ids {ids}, declared {bnds}; fix convention/layer_ids, or set allow_boundary_mismatch=True to continue")
    update_metrics(rd.metrics, "alignment", {src.engine.engine_name: {"declared": align["declared"], "measured": align["measured"], "verdicts": [x["verdict"] for x in align["slots"]], "max_error": max(x["error"] for x in align["slots"]), "tolerance": align["tolerance"], "online": True}})
    return src


def eval_step(p: RunParams, progress=True) -> dict:
    """04: greedy chain speculative decoding of held-out prompts; trained drafter vs baselines."""
    rd = RunDir(p)
    model, tok, path = models.load_target(p.model, "float32", resolve_device(p))
    drafter, cfg = load_drafter(rd.drafter, model.get_input_embeddings().weight.detach().float().cpu())
    drafter.to(model.device)
    dman = read_json(rd.drafter / "manifest.json", "drafter manifest")
    if not p.allow_template_mismatch:
        check_compatible(dman, {"template": {"mode": p.mode, "sha256": chat.template_hash(_template(p, tok))}, "target": {"sha256": models.model_hash(path, rd.root)}}, ["template", "target.sha256"], f"drafter {rd.drafter}", "allow_template_mismatch")
    bnds = cfg["eagle3nb"]["aux_boundaries"]
    n = n_layers_of(model)
    held = [r for r in read_jsonl(rd.generated) if r["split"] == "heldout"]
    if p.max_eval_prompts:
        held = held[: p.max_eval_prompts]
    if not held:
        raise ValueError("no held-out prompt to evaluate; raise heldout_fraction or max_eval_prompts")
    prompts = [r["prompt_ids"] for r in held]
    eos = models.stop_token_ids(model, tok)
    bar = (lambda xs: _progress()(xs, desc="speculative decoding")) if progress else None
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
    gm = read_json(rd.generation_manifest)
    tc = dman["train_config"]
    tm = read_json(rd.metrics).get("train", {})
    stats = {
        "engine": "eagle3nb simulator on hf-transformers target",
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
    update_metrics(rd.metrics, "eval", stats)
    record_checks(rd, "04_eval_acceptance", [
        "drafter loads: required tensors present, d2t offsets consistent with t2d",
        "drafter's template and target sha256 match this run" if not p.allow_template_mismatch else "template/target NOT checked (allow_template_mismatch)",
        f"speculative output == plain greedy output on {len(prompts)} prompts: {stats['greedy_mismatches']} mismatches",
    ])
    return {"results": results, "stats": stats, "tokenizer": tok}
