"""04_eval_acceptance: acceptance of the exported drafter measured by who ``eval_engines`` lists:
eagle3nb's simulator over an HF float32 copy of the target (:mod:`eagle3nb.steps.evaluate.simulator`), and the
serving engines vLLM and SGLang, each serving the drafter itself and reporting its own counters
(:mod:`eagle3nb.steps.evaluate.served`), over 01's held-out prompts and a benchmark per category
(``eval_dataset``, :mod:`eagle3nb.steps.evaluate.bench`)."""

from __future__ import annotations

import time

from eagle3nb.boundaries import engine_read
from eagle3nb.drafter.export import load_drafter
from eagle3nb.manifest import check_compatible, read_json, rendered_kwargs, with_template_kwargs
from eagle3nb.params import RunParams, resolve_device
from eagle3nb.rundir import RunDir
from eagle3nb.steps.evaluate import chat as eval_chat
from eagle3nb.steps.evaluate import simulator as eval_sim
from eagle3nb.steps.evaluate.progress import EvalLog, report_left_out, report_refused
from eagle3nb.steps.shared.checks import template_of, use_thread_budget
from eagle3nb.steps.evaluate.bench import (
    HELDOUT,
    read_eval_dataset,
    resolve_eval_engines,
    serve_engines,
)
from eagle3nb.steps.evaluate.served import (  # noqa: F401  (OFFSET, offset_boundaries: re-exported)
    FLAVOUR,
    OFFSET,
    drop_vllm_id0,
    flavour_swapped_dir,
    offset_boundaries,
    offset_drafter_dir,
)
from eagle3nb.steps.evaluate.simulator import SIMULATOR, SIMULATOR_METHOD  # noqa: F401  (re-exported)
from eagle3nb.steps.evaluate.publish import write_serving_files
from eagle3nb.steps.shared.recorded import run_or_read
from eagle3nb.target import models
from eagle3nb.text import chat


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
    :mod:`eagle3nb.steps.shared.recorded`; the tokenizer is loaded again) and starts no engine.
    """
    live = {
        "tokenizer": lambda out: models.load_tokenizer(models.resolve_model(p.model)),
        # 03's re-export replaces drafter/ and drops the model card: written again, not recorded
        "serving": lambda out: write_serving_files(p, RunDir(p), eval_sim.card_eval(out["stats"])),
    }
    drafter = tuple(f"drafter/{f}" for f in ("config.json", "manifest.json", "model.safetensors"))
    root = RunDir(p).root
    return run_or_read(
        p, root, "04_eval_acceptance", ("data", *drafter), lambda: _eval(p, progress), live
    )


def _eval(p: RunParams, progress: bool) -> dict:
    rd = RunDir(p)
    log = EvalLog(rd.root / "eval.log")  # python -m eagle3nb.run echoes it (run.py)
    use_thread_budget(p, rd)
    device = resolve_device(p)
    path = models.resolve_model(p.model)
    tok = models.load_tokenizer(path)  # no weights: the simulator alone loads an HF copy
    cfg = read_json(rd.drafter / "config.json", "drafter config")
    dman = read_json(rd.drafter / "manifest.json", "drafter manifest")
    if not p.allow_template_mismatch:
        target_sha = models.model_hash(path, rd.root)
        check_drafter_matches(
            dman, p.mode, template_of(p, tok), target_sha, rd.drafter, p.chat_template_kwargs
        )
    load_drafter(rd.drafter)  # refuses a broken export before any engine starts
    engines, left_out = resolve_eval_engines(p, path, cfg, device)
    tcfg = models.text_config(models.read_model_config(path))
    n, bnds = int(tcfg["num_hidden_layers"]), cfg["eagle3nb"]["aux_boundaries"]
    prompts, turns, template_block = eval_chat.heldout_prompts(p, rd, tok)
    eos = _stop_ids(path, tok)
    # what SGLang/vLLM capture when they read the exported ids, by each installed version's rule
    # for this class (differs in the mismatch reproductions: params/mismatch.yaml, kimi_case.yaml)
    served = _served(p, cfg, n, dman.get("target", {}).get("architecture"))
    records, dblock = read_eval_dataset(p) if p.eval_dataset else ([], None)
    report_refused(log, dblock)
    t0 = time.time()
    sim = None
    if "simulator" in engines:
        log(f"simulator: {len(prompts)} held-out prompts, {len(records)} benchmark records")
        sim = eval_sim.simulate(
            p, rd, path, device, prompts, turns, eos, served, bnds, n, dman, records, progress, tok
        )
    secs = time.time() - t0
    prompt_set = (
        prompts,
        [HELDOUT] * len(prompts),
        [(f"{HELDOUT}-{i}", 0) for i in range(len(prompts))],
    )
    if sim and records:
        prompt_set = tuple(a + b for a, b in zip(prompt_set, sim["bench_prompts"]))
    serving = [e for e in engines if e in ("vllm", "sglang")]
    for e in serving:
        if e not in served:
            left_out[e] = "the export refused it (metrics.json['export'])"
    serving = [e for e in serving if e in served]
    drafters = _served_drafters(p, rd, dman, bnds, n, served, serving)
    left_out.update(drop_vllm_id0(drafters, device, p.vllm_options))
    report_left_out(log, p.eval_engines, left_out)
    runs, outs, prompt_set = serve_engines(
        p,
        rd,
        path,
        device,
        serving,
        drafters,
        prompt_set,
        eos,
        int(tcfg.get("max_position_embeddings") or 2048),
        tok,
        pending=None if sim else records,
        log=log,
    )
    return eval_sim.assemble(
        p=p,
        rd=rd,
        dman=dman,
        sim=sim,
        runs=runs,
        outs=outs,
        prompt_set=prompt_set,
        engines=engines,
        left_out=left_out,
        served=served,
        bnds=bnds,
        dblock=dblock,
        template_block=template_block,
        turns=turns,
        secs=secs,
        tok=tok,
    )


def _stop_ids(path, tok) -> list[int]:
    """:func:`eagle3nb.target.models.stop_token_ids` from the folder's generation_config.json
    (no weights loaded)."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(str(path), local_files_only=True)
    except OSError:  # no generation_config.json: the tokenizer's eos alone
        gen = None
    return models.stop_token_ids(SimpleNamespace(generation_config=gen), tok)


def _served_drafters(p, rd, dman, bnds, n, served, serving) -> dict:
    """``{label: (folder, ks, batch sizes, engines that serve it, {engine: boundaries it reads})}``: the exported drafter at k and
    every ``eval_ks`` and batch size, and with ``baselines`` its layer-offset copy at k and the
    first batch size, for the engines that read the offset as meant, and its flavour-swapped copy
    (an EAGLE-3.1 drafter read as the other flavour) at k and the first batch size."""
    ks = [p.k] + [k for k in p.eval_ks if k != p.k]
    out = {"trained": (rd.drafter, ks, list(p.eval_batch_sizes), set(serving), served)}
    moved = offset_boundaries(dman.get("convention", "sglang"), list(bnds), n)
    if p.baselines and moved is not None and serving:
        arch = dman.get("target", {}).get("architecture")
        reads = offset_drafter_dir(rd.drafter, rd.root / "drafter_offset", moved, n, arch)
        out[OFFSET] = (
            rd.root / "drafter_offset",
            [p.k],
            list(p.eval_batch_sizes[:1]),
            set(reads),
            reads,
        )
    swap = rd.root / "drafter_flavour_swapped"
    if p.baselines and serving and flavour_swapped_dir(rd.drafter, swap):
        out[FLAVOUR] = (swap, [p.k], list(p.eval_batch_sizes[:1]), set(serving), served)
    return out


def check_drafter_matches(
    dman: dict, mode: str, template: str, target_sha: str, where, template_kwargs: dict | None
) -> None:
    """Refuse a drafter (manifest ``dman``, folder ``where``) trained for another chat template
    (text ``template`` in ``mode``), rendered with other template kwargs (04's
    ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``: in chat mode they change the
    prompt ids as a template does; a manifest from before they were recorded counts as {}), or
    for another target (sha256 ``target_sha``).

    Raises:
        ManifestMismatch: the template, its kwargs or the target differs
            (``allow_template_mismatch`` skips this check).
    """
    want = {
        "template": {"mode": mode, "sha256": chat.template_hash(template)},
        "template_kwargs": rendered_kwargs(mode, template_kwargs),
        "target": {"sha256": target_sha},
    }
    keys = ["template", "template_kwargs", "target.sha256"]
    have = with_template_kwargs(dman)
    check_compatible(have, want, keys, f"drafter {where}", "allow_template_mismatch")


def _served(p: RunParams, cfg: dict, n: int, arch: str | None) -> dict:
    """``{engine: boundaries}`` each engine captures from the exported config, read by the
    installed version's rule for ``arch`` (:mod:`eagle3nb.boundaries.rules`) where the table
    holds it, else by the engine's generic convention; an engine the export refused is left out."""
    from eagle3nb.steps.shared.checks import engine_versions
    from eagle3nb.boundaries.rules import engine_rule

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
