"""One function per notebook: the work of 01/02b/03/04, reading and writing only the run directory.

Notebooks call these and plot; each step validates its inputs (and the previous step's manifest)
before long work starts, writes its artefacts atomically, and merges its numbers into metrics.json.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import torch

from . import chat, conventions, distributed, extract, models
from .acceptance import evaluate_acceptance, greedy_generate
from .alignment import alignment_matrix, alignment_verdict, reference_states
from .capture import HFCaptureEngine, n_layers_of
from .dataset import AuxDataset, estimate_bytes, write_dataset
from .drafter import Eagle3Drafter
from . import engine_configs
from .engine_configs import engine_report
from .export import export_drafter, load_drafter
from .generate import generate_batch, read_jsonl, write_jsonl
from .manifest import atomic_write_json, check_compatible, provenance, read_json, sha256_file
from .loader import ShardStore
from .online import OnlineSource
from .params import REPO_ROOT, RunDir, RunParams, read_metrics, resolve_device, resolve_path, update_metrics
from .prompts import load_prompts, split_prompts
from .train import TrainConfig, init_head_from_target, train_drafter
from .vllm_engine import TimedCapture, measure_speed, served_acceptance, start_vllm

__all__ = ["record_checks", "merge_engine_metrics", "generate_step", "extract_step", "extract_vllm_step", "train_step", "eval_step", "target_info", "resolve_aux"]


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


def merge_engine_metrics(rd: RunDir, engine: str, values: dict) -> None:
    """Merge ``values`` into ``metrics.json["engines"][engine]`` (01, 02a and 04 each add theirs)."""
    from .params import read_metrics

    cur = dict(read_metrics(rd.metrics).get("engines", {}).get(engine, {}))
    cur.update(values)
    update_metrics(rd.metrics, "engines", {engine: cur})


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
    batches = range(0, len(todo), p.gen_batch_size)
    client = start_vllm(p, path, p.dtype, rd.root) if p.gen_engine == "vllm" else None
    try:
        if client is not None:
            info = client.info()
            engine = {"name": info["engine_name"], "version": info["engine_version"], "torch": info["torch_version"], "device": info["device"]}
            client.generate([todo[0]["prompt_ids"]], 1, eos, 0.0, 1.0, p.seed) if todo else None  # engine start, not timed
        else:
            engine = {"name": "hf-transformers", "version": __import__("transformers").__version__}
        t0 = time.time()
        for s in (_progress()(batches, desc=f"generate ({engine['name']})") if progress else batches):
            chunk = todo[s : s + p.gen_batch_size]
            pids = [r["prompt_ids"] for r in chunk]
            outs = client.generate(pids, p.max_new_tokens, eos, p.temperature, p.top_p, p.seed + s) if client is not None else generate_batch(model, pids, p.max_new_tokens, eos, p.temperature, p.top_p, p.seed + s)
            for r, o in zip(chunk, outs):
                r["output_ids"], r["text"] = o, tok.decode(o, skip_special_tokens=True)
        secs = time.time() - t0
    finally:
        if client is not None:
            client.close()
    write_jsonl(rd.generated, recs)
    n_tok = sum(len(r["output_ids"]) for r in todo)
    man = provenance(
        p.seed, kind="eagle3nb-generation", target=target_info(path, model, rd.root),
        engine=engine,
        decoding={"temperature": p.temperature, "top_p": p.top_p, "max_new_tokens": p.max_new_tokens, "greedy": p.temperature == 0, "stop_token_ids": eos},
        template={"mode": p.mode, "sha256": chat.template_hash(template)}, dtype=p.dtype,
        prompts_file={"path": str(resolve_path(p.prompts_file)), "sha256": sha256_file(resolve_path(p.prompts_file))},
        n_train=len(train), n_heldout=len(held), generated_tokens=n_tok, file=rd.generated.name, file_sha256=sha256_file(rd.generated),
    )
    atomic_write_json(rd.generation_manifest, man)
    stats = {"engine": engine["name"], "engine_version": engine["version"], "n_train_prompts": len(train), "n_heldout_prompts": len(held), "generated_tokens": n_tok, "seconds": round(secs, 3), "tokens_per_s": round(n_tok / secs, 1) if secs else None}
    update_metrics(rd.metrics, "generate", stats)
    if client is not None:
        merge_engine_metrics(rd, "vllm", {"generate_tokens_per_s_01": stats["tokens_per_s"], "generate_tokens_per_s_01_is": "01_generate wall time of the train prompts in batches of gen_batch_size (engine start excluded)"})
    record_checks(rd, "01_generate", [f"params validated ({len(RunParams.model_fields)} keys)", f"{len(recs)} prompts fit the context of {ctx} with max_new_tokens={p.max_new_tokens}", "train/held-out split disjoint by prompt hash"])
    return {"manifest": man, "records": recs, "stats": stats}


def _hf_states(model, samples, bnds) -> dict[int, torch.Tensor]:
    """``{b: [sum T, H] float32}`` of an HF model at ``bnds`` over ``samples`` (one at a time)."""
    from .capture import capture_boundaries

    dev = next(model.parameters()).device
    st = [capture_boundaries(model, torch.tensor([list(x)], device=dev), bnds) for x in samples]
    return {b: torch.cat([s_[b][0].float().cpu() for s_ in st]) for b in bnds}


def _split_aux(aux_rows: list[torch.Tensor], bnds: list[int]) -> dict[int, torch.Tensor]:
    a = torch.cat([x.float() for x in aux_rows])
    H = a.shape[1] // len(bnds)
    return {b: a[:, i * H : (i + 1) * H] for i, b in enumerate(bnds)}


def _other_engine_datasets(rd: RunDir, engine_name: str, sample_ids: list[int]) -> dict[str, dict[int, torch.Tensor]]:
    """Aux states of the same samples from other engines' datasets in this run folder (e.g. vLLM's
    from 02a), keyed ``"<engine> <dtype>"``, ``{boundary: [n, H]}``."""
    from .dataset import DATASET_KIND

    out = {}
    for mf in sorted(rd.root.glob("*/manifest.json")):
        try:
            man = read_json(mf)
            if man.get("kind") != DATASET_KIND or not man.get("complete") or man.get("engine", {}).get("name") == engine_name:
                continue
            ds = AuxDataset(mf.parent)
        except (OSError, ValueError):
            continue
        by_id = {it["sample_id"]: it for it in ds.items}
        if not all(i in by_id for i in sample_ids):
            continue
        out[f"{man['engine']['name']} {man.get('dtype')} ({mf.parent.name})"] = _split_aux([by_id[i]["aux"] for i in sample_ids], list(man["aux_boundaries"]))
    return out


def _extraction_inputs(p: RunParams):
    """What 02a and 02b both start from: the run folder, 01's manifest (checked against this target
    and template), the target in ``p.dtype`` on its device, its manifest block, and the run's aux
    ids and boundaries. Returns ``(rd, gman, device, model, tok, path, tinfo, ids, bnds)``."""
    rd = RunDir(p)
    gman = read_json(rd.generation_manifest, "generation manifest (from 01_generate)")
    device = resolve_device(p)
    model, tok, path = models.load_target(p.model, p.dtype, device)
    tinfo = target_info(path, model, rd.root)
    check_compatible(gman, {"target": tinfo, "template": {"mode": p.mode, "sha256": chat.template_hash(_template(p, tok))}}, ["target.sha256", "template"], "generation output", "(delete the run folder)")
    ids, bnds = resolve_aux(p, tinfo["n_layers"])
    return rd, gman, device, model, tok, path, tinfo, ids, bnds


def extract_step(p: RunParams, progress=True) -> dict:
    """02b: capture aux states into shards through SGLang's own model path (``engine="sglang"``,
    the SGLang worker in its venv, loopback-only) or with HF at SGLang's capture point
    (``engine="hf"``). Boundary N (``final``) comes from HF in both cases (SGLang cannot give it; see
    :mod:`eagle3nb.engines.sglang_backend`); the manifest names both engines."""
    from .sglang_engine import final_logprob_check, hf_final, namespace_report, start_sglang

    rd, gman, device, model, tok, path, tinfo, ids, bnds = _extraction_inputs(p)
    n = tinfo["n_layers"]
    recs = [r for r in read_jsonl(rd.generated) if r["split"] == "train"]
    # both modes: the served prompt (chat: the template's prefix rendering) + exactly the generated ids
    samples = extract.train_samples(rd)  # the same list each extraction worker rebuilds
    if not samples:
        raise ValueError("no train sample with generated tokens: 01_generate produced nothing to extract; check prompts_file and max_new_tokens")
    if p.engine == "sglang" and p.extract_workers > 1:
        raise ValueError(f"extract_workers={p.extract_workers} with engine='sglang': sharded extraction starts one HF engine per worker; use extract_workers: 1 with SGLang (it batches inside its own engine), or engine: hf")
    disk = extract.disk_plan(p, samples, len(bnds), tinfo["hidden_size"])
    extract.check_disk(disk)  # exact shard bytes vs free space, before any capture
    need, free = disk["total_bytes"], disk["free_bytes"]
    transformers_version = __import__("transformers").__version__
    final_block = {"engine": "hf-transformers", "version": transformers_version, "boundary": n, "dtype": p.dtype}
    probe_n = max(1, min(p.drift_samples, len(samples)))
    probe_samples = [s[1] for s in samples[:probe_n]]
    checks, client, extra = [], None, {}
    try:
        if p.engine == "sglang":
            from .engines.adapter import EngineCaptureEngine

            client = start_sglang(path, p.dtype, device, p.seed, p.sglang_python, rd.root, model.config.max_position_embeddings)
            info = client.info()
            engine = EngineCaptureEngine(client, n, p.capture_batch_size, final_from=lambda xs: hf_final(model, xs, p.capture_batch_size))
            eng_ids = engine.convention.boundaries_to_ids(bnds, n)  # SGLang's ids for the run's boundaries
            probe = client.capture(probe_samples, eng_ids, logprobs=True)  # starts SGLang's capture engine
            net = namespace_report(client.pid)  # now that the scheduler (and its TCPStore) is up
            engine_block = {"name": info["engine_name"], "version": info["engine_version"], "torch": info["torch_version"], "convention": info["convention"], "layer_ids": eng_ids, "device": info["device"], "cpu_shim": info["cpu_shim"], "network": "loopback-only namespace" if client.pid and net.get("loopback_only") else "host namespace"}
            final_block["why"] = "SGLang 0.5.23 cannot return boundary N: its capture hooks take layer inputs only, and capture-only mode returns the aux states in place of the last-layer states (sglang_backend docstring); final is HF's boundary N, checked against SGLang's own next-token log-probs"
            probe_aux = [r["aux"] for r in probe]
            lp = final_logprob_check(model, probe_samples[0], hf_final(model, probe_samples[:1])[0], probe[0]["input_logprobs"], p.dtype)
            final_block["check_vs_sglang_logprobs"] = lp
            if not lp["ok"] and not p.allow_boundary_mismatch:
                raise ValueError(f"log p(next token) from HF's final state differs from SGLang's own by {lp['max_abs_diff']:.3g} > {lp['tolerance']} ({p.dtype}): the stored target distribution would not be SGLang's; check dtype/model, or set allow_boundary_mismatch=True to continue")
            checks += [f"SGLang worker network namespace: interfaces {net.get('interfaces')}, TCP listeners {net.get('listeners')}" if "error" not in net else f"SGLang network namespace not inspected: {net['error']}",
                       f"final (boundary {n}) from hf-transformers; its next-token log-probs vs SGLang's own on a probe sample: max |diff| {lp['max_abs_diff']:.2e} (tolerance {lp['tolerance']})"]
            # time the engine's capture calls during extraction (engine already started by the probe)
            engine.client = timed = TimedCapture(client)
        else:
            engine = HFCaptureEngine(model, p.convention, p.capture_batch_size)
            eng_ids = ids
            engine_block = {"name": engine.engine_name, "version": engine.engine_version, "capture_point_of": p.convention}
            probe_aux = [c.aux for c in engine.capture(probe_samples, ids)]
        if engine.boundaries(eng_ids) != bnds:
            raise ValueError(f"{engine.engine_name} ids {eng_ids} name boundaries {engine.boundaries(eng_ids)}, the run declares {bnds}")
        # measure, before writing anything, which boundaries the engine really captured on one sample
        err, ref_b = alignment_matrix(probe_aux[0].float(), reference_states(model, probe_samples[0]), len(bnds))
        align = alignment_verdict(err, ref_b, bnds, p.dtype)
        if not align["ok"] and not p.allow_boundary_mismatch:
            raise ValueError(f"{engine.engine_name} captured boundaries {align['measured']} for {engine.convention.name} ids {eng_ids}, declared {bnds} ({[s_['verdict'] for s_ in align['slots']]}); fix convention/layer_ids, or set allow_boundary_mismatch=True to continue")
        man = provenance(
            p.seed, target=tinfo, engine=engine_block, final_state=final_block,
            convention=p.convention, layer_ids=ids, aux_boundaries=bnds, final_boundary=n, dtype=p.dtype,
            template=gman["template"], generation_sha256=gman["file_sha256"],
        )
        t0 = time.time()
        m = extract.write(p, rd, samples, engine, eng_ids, man, _progress() if progress else None)
        secs = time.time() - t0
        # drift across engines and dtypes at the same boundaries and tokens (layer offsets excluded)
        drift = {}
        if p.drift_samples:
            ref32 = model if p.dtype == "float32" else models.load_target(p.model, "float32", device)[0]
            drift["hf-transformers float32 (reference)"] = _hf_states(ref32, probe_samples, bnds)
            bf = model if p.dtype == "bfloat16" else models.load_target(p.model, "bfloat16", device)[0]
            drift["hf-transformers bfloat16"] = _hf_states(bf, probe_samples, bnds)
            if p.engine != "hf":  # HF's own capture is the HF entries above
                drift[f"{engine.engine_name} {p.dtype}"] = _split_aux(probe_aux, bnds)
            if p.engine == "sglang" and p.drift_both_dtypes:
                other = "bfloat16" if p.dtype == "float32" else "float32"
                with start_sglang(path, other, device, p.seed, p.sglang_python, rd.root, model.config.max_position_embeddings) as c2:
                    drift[f"sglang {other}"] = _split_aux([r["aux"] for r in c2.capture(probe_samples, eng_ids)], bnds)
            drift.update(_other_engine_datasets(rd, engine.engine_name, [s[0] for s in samples[:probe_n]]))
        if p.engine == "hf":  # same process, same batches: HF forward with vs without capture
            extra["capture_speed"] = extract.capture_overhead(model, engine, samples, ids)
        if p.engine == "sglang" and p.measure_engine_speed:
            if not timed.tokens:  # the dataset was complete already (resumed): time one capture pass now
                for i in range(0, len(samples), p.capture_batch_size):
                    timed.capture([s[1] for s in samples[i : i + p.capture_batch_size]], eng_ids)
            extra["speed"] = measure_speed(client, [r["prompt_ids"] for r in recs], [s[1] for s in samples], p.max_new_tokens, models.stop_token_ids(model, tok), p.seed, timed.seconds, timed.tokens)
            merge_engine_metrics(rd, "sglang", dict(extra["speed"], engine_version=engine_block["version"], device=engine_block["device"], dtype=p.dtype))
    finally:
        if client is not None:
            client.close()
    table = conventions.boundary_table(bnds, n)
    stats = {"engine": engine.engine_name, "engine_version": engine_block["version"], "final_state_engine": final_block["engine"], "layer_ids": ids, "engine_layer_ids": eng_ids, "aux_boundaries": bnds, "n_samples": m["n_samples"], "n_tokens": m["n_tokens"], "estimated_bytes": need, "disk": disk, "workers": p.extract_workers, "aux_storage": p.aux_storage, "aux_quantization": m.get("aux_quantization"), "capture_speed": extra.get("capture_speed"), "skipped": {k: len(v) for k, v in m["skipped"].items()}, "seconds": round(secs, 3), "tokens_per_s": round(m["n_tokens"] / secs, 1) if secs else None}
    if "capture_point_of" in engine_block:
        stats["capture_point_of"] = engine_block["capture_point_of"]
    update_metrics(rd.metrics, "extract", stats)
    ref_label = "hf-transformers float32 (reference)"
    drift_summary = {lab: {str(b): round(float(((st[b] - drift[ref_label][b]).norm(dim=-1) / drift[ref_label][b].norm(dim=-1).clamp_min(1e-12)).median()), 6) for b in bnds if b in st} for lab, st in drift.items() if lab != ref_label} if drift else {}
    if drift_summary:
        update_metrics(rd.metrics, "engine_drift", {"median_relative_deviation_from_hf_float32": drift_summary, "samples": probe_n})
    record_checks(rd, "02b_extract_sglang", checks + [
        f"target sha256 and template match the generation manifest ({gman['target']['sha256'][:12]})",
        f"{p.convention} ids {ids} -> boundaries {bnds}: capturable, strictly increasing; {engine.engine_name} asked with its ids {eng_ids}",
        f"alignment on a probe sample: measured boundaries {align['measured']} ({'match' if align['ok'] else 'MISMATCH, allowed by allow_boundary_mismatch'}; tolerance {align['tolerance']})",
        f"disk need {need} B (shards exact: {disk['shard_bytes']} B) <= free {free} B",
        f"engine row count == token count for all {m['n_samples']} samples",
        f"finite states: {len(m['skipped']['nonfinite'])} samples skipped, {len(m['skipped']['empty_loss_mask'])} with empty loss mask skipped",
        f"{len(m['shards'])} shards written atomically with sha256",
    ])
    update_metrics(rd.metrics, "alignment", {engine.engine_name: {"declared": align["declared"], "measured": align["measured"], "verdicts": [x["verdict"] for x in align["slots"]], "max_error": max(x["error"] for x in align["slots"]), "tolerance": align["tolerance"]}})
    return {"manifest": m, "boundary_table": table, "stats": stats, "alignment": align, "alignment_error": err, "reference_boundaries": ref_b, "drift": drift, "drift_reference": ref_label, "speed": extra.get("speed")}


def extract_vllm_step(p: RunParams, progress=True) -> dict:
    """02a: capture aux states through vLLM's own forward (``extract_hidden_states``) into
    ``dataset_vllm/``; boundary N (``final``) comes from vLLM too (vLLM id N).

    The run's boundaries (``layer_ids`` in ``convention``) are asked from vLLM with vLLM's ids;
    before writing, a probe sample's captured slots are compared with the HF reference at every
    boundary, and a declared/measured mismatch stops the step (``allow_boundary_mismatch``
    overrides). Also measures vLLM's tokens/s (plain generation, prefill without capture,
    extraction) into ``metrics.json["engines"]["vllm"]``.

    Raises:
        ValueError: no sample to extract; boundaries vLLM cannot capture; measured boundaries differ
            from the declared ones; an engine answer with other rows than asked.
        OSError: not enough disk for the dataset.
        FileNotFoundError: the vLLM venv is missing (``vllm_python``).
    """
    from .engines.adapter import EngineCaptureEngine

    rd, gman, device, model, tok, path, tinfo, ids, bnds = _extraction_inputs(p)
    n = tinfo["n_layers"]
    vids = conventions.get_convention("vllm").boundaries_to_ids(bnds, n)  # vLLM's ids for the run's boundaries
    recs = [r for r in read_jsonl(rd.generated) if r["split"] == "train"]
    samples = extract.train_samples(rd)
    if not samples:
        raise ValueError("no train sample with generated tokens: 01_generate produced nothing to extract; check prompts_file and max_new_tokens")
    n_tok = sum(len(s[1]) for s in samples)
    need = estimate_bytes(n_tok, len(bnds), tinfo["hidden_size"], torch.finfo(models.DTYPES[p.dtype]).bits // 8)
    rd.dataset_vllm.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(rd.dataset_vllm).free
    if need > free:
        raise OSError(f"the dataset needs ~{need / 1e9:.2f} GB (tokens x (n_aux + 1) x H x bytes) but {rd.dataset_vllm} has {free / 1e9:.2f} GB free; free space, lower max_train_prompts/max_new_tokens, or use dtype: bfloat16")
    with start_vllm(p, path, p.dtype, rd.root) as client:
        info = client.info()
        timed = TimedCapture(client)
        engine = EngineCaptureEngine(timed, n, p.capture_batch_size)
        if engine.boundaries(vids) != bnds:
            raise ValueError(f"vLLM ids {vids} name boundaries {engine.boundaries(vids)}, the run declares {bnds}")
        # measure, before writing anything, which boundaries vLLM really captured on one sample
        probe = samples[0][1]
        client.capture([probe], vids)  # starts vLLM's capture engine (not timed)
        err, ref_b = alignment_matrix(engine.capture([probe], vids)[0].aux.float(), reference_states(model, probe), len(vids))
        align = alignment_verdict(err, ref_b, bnds, p.dtype)
        if not align["ok"] and not p.allow_boundary_mismatch:
            raise ValueError(f"vllm captured boundaries {align['measured']} for vllm ids {vids}, declared {bnds} ({[s_['verdict'] for s_ in align['slots']]}); fix convention/layer_ids, or set allow_boundary_mismatch=True to continue")
        eng_block = {"name": info["engine_name"], "version": info["engine_version"], "torch": info["torch_version"], "convention": info["convention"], "layer_ids": vids, "method": "extract_hidden_states", "device": info["device"]}
        man = provenance(
            p.seed, target=tinfo, engine=eng_block, final_state={"engine": info["engine_name"], "version": info["engine_version"], "boundary": n, "layer_id": n, "dtype": p.dtype},
            convention="vllm", layer_ids=vids, aux_boundaries=bnds, final_boundary=n, dtype=p.dtype,
            template=gman["template"], generation_sha256=gman["file_sha256"],
        )
        timed.seconds, timed.tokens = 0.0, 0
        t0 = time.time()
        m = write_dataset(rd.dataset_vllm, samples, lambda xs: engine.capture(xs, vids), man, p.shard_size, models.DTYPES[p.dtype], _progress() if progress else None)
        secs = time.time() - t0
        if not timed.tokens:  # dataset complete already (resumed): time one capture pass now
            for i in range(0, len(samples), p.capture_batch_size):
                timed.capture([s[1] for s in samples[i : i + p.capture_batch_size]], vids)
        speed = measure_speed(client, [r["prompt_ids"] for r in recs], [s[1] for s in samples], p.max_new_tokens, models.stop_token_ids(model, tok), p.seed, timed.seconds, timed.tokens, p.capture_batch_size)
    merge_engine_metrics(rd, "vllm", dict(speed, engine_version=info["engine_version"], device=info["device"], dtype=p.dtype))
    stats = {"engine": info["engine_name"], "engine_version": info["engine_version"], "convention": "vllm", "engine_layer_ids": vids, "layer_ids_in_run_convention": ids, "aux_boundaries": bnds, "n_samples": m["n_samples"], "n_tokens": m["n_tokens"], "estimated_bytes": need, "skipped": {k: len(v) for k, v in m["skipped"].items()}, "seconds": round(secs, 3), "tokens_per_s": round(m["n_tokens"] / secs, 1) if secs else None}
    update_metrics(rd.metrics, "extract_vllm", stats)
    update_metrics(rd.metrics, "alignment", {"vllm": {"declared": align["declared"], "measured": align["measured"], "verdicts": [x["verdict"] for x in align["slots"]], "max_error": max(x["error"] for x in align["slots"]), "tolerance": align["tolerance"]}})
    record_checks(rd, "02a_extract_vllm", [
        f"target sha256 and template match the generation manifest ({gman['target']['sha256'][:12]})",
        f"{p.convention} ids {ids} -> boundaries {bnds} -> vllm ids {vids} (vLLM {info['engine_version']}: id = boundary, id {n} = final pre-norm state)",
        f"alignment on a probe sample: measured boundaries {align['measured']} ({'match' if align['ok'] else 'MISMATCH, allowed by allow_boundary_mismatch'}; tolerance {align['tolerance']})",
        f"disk need {need} B <= free {free} B",
        f"engine row count == token count for all {m['n_samples']} samples",
        f"finite states: {len(m['skipped']['nonfinite'])} samples skipped, {len(m['skipped']['empty_loss_mask'])} with empty loss mask skipped",
        f"{len(m['shards'])} shards written atomically with sha256",
    ])
    return {"manifest": m, "boundary_table": conventions.boundary_table(bnds, n), "stats": stats, "speed": speed, "alignment": align, "alignment_error": err, "reference_boundaries": ref_b}


def _train_with_torchrun(p: RunParams, rd: RunDir) -> dict:
    """03 with several processes: run ``python -m eagle3nb.train`` under torchrun (this node's
    share when ``nnodes`` > 1), stream its output, then read what rank 0 wrote."""
    import yaml

    if p.device.startswith("cuda") or p.device == "auto":
        import torch as _t

        n = _t.cuda.device_count()
        if n and p.nproc_per_node > n:
            raise ValueError(f"nproc_per_node={p.nproc_per_node} but this node has {n} GPUs; set nproc_per_node to at most {n}")
    rd.train.mkdir(parents=True, exist_ok=True)
    pf = rd.train / "launch_params.yaml"
    pf.write_text(yaml.safe_dump(dict(p.model_dump(), interactive=False), sort_keys=False))
    cmd = distributed.torchrun_command(["eagle3nb.train", str(pf)], p.nproc_per_node, p.nnodes, p.node_rank, p.rdzv_endpoint)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT)] + [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]))
    print("[eagle3nb] " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        tail = (tail + [line])[-40:]
    if proc.wait() != 0:
        raise RuntimeError(f"torchrun training failed (exit {proc.returncode}); last lines:\n" + "".join(tail))
    return {"history": read_json(rd.train / "history.json"), "stats": read_metrics(rd.metrics)["train"], "export_dir": rd.drafter}


def train_step(p: RunParams, progress=True) -> dict:
    """03: train the drafter with TTT on the dataset (``training_mode: online``: on 01's samples,
    the target capturing each batch) and export it for SGLang and vLLM.

    ``nproc_per_node`` 1 and ``nnodes`` 1 train in this process; more launch torchrun (see
    :func:`_train_with_torchrun`). Under torchrun every rank runs this; rank 0 exports and writes
    metrics, the others return ``stats: None``."""
    rd = RunDir(p)
    if (p.nproc_per_node > 1 or p.nnodes > 1) and not distributed.under_torchrun():
        return _train_with_torchrun(p, rd)
    ctx = distributed.init_from_env(resolve_device(p))
    ds_dir = rd.dataset_vllm if p.train_from == "02a" else rd.dataset
    ds = ShardStore(ds_dir) if p.training_mode == "offline" else None
    model, tok, path = models.load_target(p.model, "float32", distributed.local_device(resolve_device(p), ctx))
    if ds is None:
        ds = _online_source(p, rd, model, tok, path)
    if not p.allow_manifest_mismatch:
        # 02a stores vLLM's ids (convention vllm); the boundaries are compared below either way
        want = {"target": {"sha256": models.model_hash(path, rd.root)}, "dtype": p.dtype, "convention": "vllm" if p.train_from == "02a" and p.training_mode == "offline" else p.convention, "template": {"mode": p.mode, "sha256": chat.template_hash(_template(p, tok))}}
        check_compatible(ds.manifest, want, ["target.sha256", "dtype", "convention", "template"], f"dataset {ds_dir}", "allow_manifest_mismatch")
        _, bnds = resolve_aux(p, n_layers_of(model))
        check_compatible(ds.manifest, {"aux_boundaries": bnds}, ["aux_boundaries"], f"dataset {ds_dir} (boundaries the exported drafter will be served with)", "allow_manifest_mismatch")
    # the boundaries the exported ids make SGLang and vLLM capture; "engine_default" writes the ids
    # users copy from the engines' defaults (the user's failure when the data came from elsewhere)
    n_t = n_layers_of(model)
    serve_b = conventions.pick_default_boundaries(n_t) if p.export_layer_ids == "engine_default" else list(ds.manifest["aux_boundaries"])
    serve_mismatch = serve_b != list(ds.manifest["aux_boundaries"])
    if serve_mismatch and not p.allow_manifest_mismatch:
        raise ValueError(
            f"export_layer_ids={p.export_layer_ids!r}: the exported ids make SGLang and vLLM capture boundaries {serve_b}, "
            f"but dataset {ds_dir} was captured at boundaries {ds.manifest['aux_boundaries']} ({ds.manifest['convention']} ids "
            f"{ds.manifest['layer_ids']}); the served drafter would read other tensors than it was trained on. Use "
            "export_layer_ids: trained, or set allow_manifest_mismatch=True to reproduce the mismatch"
        )
    if p.draft_vocab_size > model.config.vocab_size:
        raise ValueError(f"draft_vocab_size={p.draft_vocab_size} exceeds the target vocab ({model.config.vocab_size}); lower it")
    cfg = TrainConfig(draft_vocab_size=p.draft_vocab_size, draft_num_heads=p.draft_num_heads, draft_num_kv_heads=p.draft_num_kv_heads, draft_intermediate_size=p.draft_intermediate_size, ttt_steps=p.ttt_steps, loss_decay=p.loss_decay, batch_size=p.batch_size, max_steps=p.max_steps, lr=p.lr, warmup_steps=p.warmup_steps, weight_decay=p.weight_decay, aux_noise=p.aux_noise, init_head_from_target=p.init_head_from_target, seed=p.seed, checkpoint_every=p.checkpoint_every, bucket_by_length=p.bucket_by_length, loader_workers=p.loader_workers, fsdp=p.fsdp, attention=p.attention)
    drafter, rep = train_drafter(ds, model, cfg, rd.train, _progress() if progress else None)
    if not ctx.is_main:
        return {"history": rep["history"], "stats": None, "export_dir": rd.drafter}
    atomic_write_json(rd.train / "history.json", rep["history"])
    atomic_write_json(rd.train / "step_times.json", {"seconds": rep["step_seconds"], "token_steps": rep["step_token_steps"], "world_size": rep["world_size"], "is": "per step of the last (resumed) call: wall seconds on rank 0 and loss-bearing tokens x TTT steps over all ranks"})
    bnds = ds.manifest["aux_boundaries"]
    man = provenance(p.seed, kind="eagle3nb-drafter", training_mode=p.training_mode, target=ds.manifest["target"], dataset_engine=ds.manifest["engine"], convention=ds.manifest["convention"], layer_ids=ds.manifest["layer_ids"], aux_boundaries=bnds, dtype=ds.manifest["dtype"], template=ds.manifest["template"], train_config=cfg.__dict__, vocab=rep["vocab"])
    export_drafter(drafter, rd.drafter, bnds, ds.manifest["target"]["n_layers"], man, tok.bos_token_id, tok.eos_token_id, serve_b)
    _, cfg_json = load_drafter(rd.drafter)  # refuses a folder missing a tensor or contradicting itself
    engines = engine_report(cfg_json, bnds, ds.manifest["target"]["n_layers"], {"norm_before_residual": drafter.config.norm_before_residual})
    update_metrics(rd.metrics, "export", {"engines": engines, "export_layer_ids": p.export_layer_ids, "trained_boundaries": bnds, "served_boundaries": serve_b, "serve_mismatch": serve_mismatch})
    last = rep["history"][-1]
    stats = {"steps": rep["steps"], "seconds": round(rep["seconds"], 2), "loss_token_steps_per_s": round(rep["tokens_per_s"], 1) if rep["tokens_per_s"] else None, "final_loss": last["loss"], "final_loss_is": f"sum over TTT steps j of {p.loss_decay}**j x soft cross-entropy, last logged training batch", "last_batch_step_acc": last["step_acc"], "last_batch_step_acc_is": "training-batch accuracy per TTT step (not held-out; see eval)", "draft_vocab_size": p.draft_vocab_size, "vocab": rep["vocab"], "empty_batches": rep["empty_batches"], "n_train_samples": len(ds), "n_train_tokens_incl_prompts": ds.manifest["n_tokens"],
             "world_size": rep["world_size"], "parallel": rep["parallel"], "global_batch": p.batch_size,
             "padding_fraction": {k: round(v["padding_fraction"], 4) for k, v in rep["padding"].items()}, "padding_fraction_is": "share of padded positions in the per-rank batches of one epoch: this run's plan (bucketed by length unless bucket_by_length is false) vs a plain shuffle", "training_mode": p.training_mode}
    if p.training_mode == "online":  # the target's share of the training time
        stats["online"] = {"target_capture_seconds": round(ds.capture_seconds, 3), "target_capture_tokens_per_s": round(ds.captured_tokens / ds.capture_seconds, 1) if ds.capture_seconds else None, "nonfinite_rows_masked": ds.nonfinite_rows, "note": "capture times are of this process only (a resumed run counts its last part)"}
    update_metrics(rd.metrics, "train", stats)
    record_checks(rd, "03_train", [
        f"dataset {ds_dir.name}/ (engine {ds.manifest['engine']['name']}): {len(ds.manifest['shards'])} shard sha256 verified at load" if p.training_mode == "offline" else "online: the target captured every batch (no dataset on disk); its sha256 and template match 01's output",
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
    cap = model if p.dtype == "float32" else models.load_target(p.model, p.dtype, model.device)[0]
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
