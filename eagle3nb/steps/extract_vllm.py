"""02a_extract_vllm: aux states through vLLM's own forward (extract_hidden_states), checked
against the HF reference, written as shards under dataset_vllm/."""

from __future__ import annotations

import shutil
import time

import torch

from eagle3nb.target import conventions, models
from eagle3nb.steps import extract
from eagle3nb.target.alignment import alignment_matrix, alignment_verdict, reference_states
from eagle3nb.dataset.write import estimate_bytes, write_dataset
from eagle3nb.text.generation import read_jsonl
from eagle3nb.manifest import provenance
from eagle3nb.steps.common import extraction_inputs, merge_engine_metrics, progress_bar, record_checks
from eagle3nb.rundir import update_metrics
from eagle3nb.params import RunParams
from eagle3nb.engines.vllm_helpers import TimedCapture, measure_speed, start_vllm


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
    from eagle3nb.engines.adapter import EngineCaptureEngine

    rd, gman, device, model, tok, path, tinfo, ids, bnds = extraction_inputs(p)
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
        m = write_dataset(rd.dataset_vllm, samples, lambda xs: engine.capture(xs, vids), man, p.shard_size, models.DTYPES[p.dtype], progress_bar() if progress else None)
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
