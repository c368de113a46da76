"""02b_extract_sglang: aux states through SGLang's own model path (or HF at SGLang's capture point),
checked against the HF reference, written as shards; drift across engines and dtypes."""

from __future__ import annotations

import time

import torch

from eagle3nb.target import conventions, models
from eagle3nb.steps import extract
from eagle3nb.target.alignment import alignment_matrix, alignment_verdict, reference_states
from eagle3nb.target.capture import HFCaptureEngine
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.text.generation import read_jsonl
from eagle3nb.manifest import provenance, read_json
from eagle3nb.steps.common import extraction_inputs, merge_engine_metrics, progress_bar, record_checks
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.params import RunParams
from eagle3nb.engines.vllm_helpers import TimedCapture, measure_speed


def _hf_states(model, samples, bnds) -> dict[int, torch.Tensor]:
    """``{b: [sum T, H] float32}`` of an HF model at ``bnds`` over ``samples`` (one at a time)."""
    from eagle3nb.target.capture import capture_boundaries

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
    from eagle3nb.dataset.read import DATASET_KIND

    out = {}
    for mf in sorted(rd.root.glob("*/manifest.json")):
        try:
            man = read_json(mf)
            if man.get("kind") != DATASET_KIND or not man.get("complete") or man.get("engine", {}).get("name") == engine_name:
                continue
            ds = AuxDataset(mf.parent)
        except (OSError, ValueError):
            continue
        by_id = {it["sample_id"]: it for it in ds}
        if not all(i in by_id for i in sample_ids):
            continue
        out[f"{man['engine']['name']} {man.get('dtype')} ({mf.parent.name})"] = _split_aux([by_id[i]["aux"] for i in sample_ids], list(man["aux_boundaries"]))
    return out


def extract_sglang_step(p: RunParams, progress=True) -> dict:
    """02b: capture aux states into shards through SGLang's own model path (``extract_engine="sglang"``,
    the SGLang worker in its venv, loopback-only) or with HF at SGLang's capture point
    (``extract_engine="hf"``). Boundary N (``final``) comes from HF in both cases (SGLang cannot give it; see
    :mod:`eagle3nb.engines.sglang_backend`); the manifest names both engines."""
    from eagle3nb.engines.sglang_helpers import final_logprob_check, hf_final, namespace_report, start_sglang

    rd, gman, device, model, tok, path, tinfo, ids, bnds = extraction_inputs(p)
    n = tinfo["n_layers"]
    recs = [r for r in read_jsonl(rd.generated) if r["split"] == "train"]
    # both modes: the served prompt (chat: the template's prefix rendering) + exactly the generated ids
    samples = extract.train_samples(rd)  # the same list each extraction worker rebuilds
    if not samples:
        raise ValueError("no train sample with generated tokens: 01_generate produced nothing to extract; check prompts_file and max_new_tokens")
    if p.extract_engine == "sglang" and p.extract_workers > 1:
        raise ValueError(f"extract_workers={p.extract_workers} with extract_engine='sglang': sharded extraction starts one HF engine per worker; use extract_workers: 1 with SGLang (it batches inside its own engine), or engine: hf")
    disk = extract.disk_plan(p, samples, len(bnds), tinfo["hidden_size"])
    extract.check_disk(disk)  # exact shard bytes vs free space, before any capture
    need, free = disk["total_bytes"], disk["free_bytes"]
    transformers_version = __import__("transformers").__version__
    final_block = {"engine": "hf-transformers", "version": transformers_version, "boundary": n, "dtype": p.dtype}
    probe_n = max(1, min(p.drift_samples, len(samples)))
    probe_samples = [s[1] for s in samples[:probe_n]]
    checks, client, extra = [], None, {}
    try:
        if p.extract_engine == "sglang":
            from eagle3nb.engines.adapter import EngineCaptureEngine

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
        m = extract.write(p, rd, samples, engine, eng_ids, man, progress_bar() if progress else None)
        secs = time.time() - t0
        # drift across engines and dtypes at the same boundaries and tokens (layer offsets excluded)
        drift = {}
        if p.drift_samples:
            ref32 = model if p.dtype == "float32" else models.load_target(p.model, "float32", device)[0]
            drift["hf-transformers float32 (reference)"] = _hf_states(ref32, probe_samples, bnds)
            bf = model if p.dtype == "bfloat16" else models.load_target(p.model, "bfloat16", device)[0]
            drift["hf-transformers bfloat16"] = _hf_states(bf, probe_samples, bnds)
            if p.extract_engine != "hf":  # HF's own capture is the HF entries above
                drift[f"{engine.engine_name} {p.dtype}"] = _split_aux(probe_aux, bnds)
            if p.extract_engine == "sglang" and p.drift_both_dtypes:
                other = "bfloat16" if p.dtype == "float32" else "float32"
                with start_sglang(path, other, device, p.seed, p.sglang_python, rd.root, model.config.max_position_embeddings) as c2:
                    drift[f"sglang {other}"] = _split_aux([r["aux"] for r in c2.capture(probe_samples, eng_ids)], bnds)
            drift.update(_other_engine_datasets(rd, engine.engine_name, [s[0] for s in samples[:probe_n]]))
        if p.extract_engine == "hf":  # same process, same batches: HF forward with vs without capture
            extra["capture_speed"] = extract.capture_overhead(model, engine, samples, ids)
        if p.extract_engine == "sglang" and p.measure_engine_speed:
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
