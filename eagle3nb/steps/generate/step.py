"""01_generate: the target regenerates a continuation of every train prompt (HF, vLLM or SGLang)."""

from __future__ import annotations

import time

from eagle3nb import timing
from eagle3nb.manifest import atomic_write_json, provenance, sha256_file
from eagle3nb.params import RunParams, resolve_device
from eagle3nb.preflight import split_checked
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.repo_paths import resolve_path
from eagle3nb.steps.generate.workers import start_engine
from eagle3nb.steps.shared.checks import (
    merge_engine_metrics,
    progress_bar,
    record_checks,
    record_engine_threads,
    speed_entry,
    target_info,
    template_of,
    use_thread_budget,
)
from eagle3nb.target import models
from eagle3nb.text import chat
from eagle3nb.text.generation import generate_batch, generation_attention, write_jsonl
from eagle3nb.text.prompts import load_prompts


def generate_step(p: RunParams, progress=True) -> dict:
    """01: regenerate a continuation for each train prompt; store held-out prompts for 04.

    Writes ``data/generated.jsonl`` (one record per prompt: id, split, prompt, prompt_ids and,
    for train prompts, output_ids and text) and ``data/generation_manifest.json``.

    Returns:
        ``{"manifest": the generation manifest, "records": the records, "stats":
        metrics.json["generate"]}``.

    With ``dataset`` set, the chat dataset is regenerated turn by turn instead
    (:func:`eagle3nb.steps.generate.chat.generate_chat_step`).

    Raises:
        ValueError: no prompt, duplicates, or a split with no train or no held-out prompt
            (:func:`eagle3nb.preflight.split_checked`), before the target loads; a prompt plus
            ``max_new_tokens`` exceeds the target's context.
    """
    if p.dataset is not None:
        from eagle3nb.steps.generate.chat import generate_chat_step

        return generate_chat_step(p, progress)
    prompts = load_prompts(resolve_path(p.prompts_file))
    source = f"prompts_file={p.prompts_file!r}"
    train, held = split_checked(prompts, p, source, "prompts")  # before the target loads
    rd = RunDir(p).make()
    use_thread_budget(p, rd)
    model, tok, path = models.load_target(p.model, p.dtype, resolve_device(p))
    template = template_of(p, tok)
    if p.max_train_prompts:
        train = train[: p.max_train_prompts]
    ctx = model.config.max_position_embeddings
    recs = _records(p, tok, template if p.mode == "chat" else None, train, held, ctx)
    todo = [r for r in recs if r["split"] == "train"]
    eos = models.stop_token_ids(model, tok)
    engine, secs = _generate(p, rd, model, tok, path, todo, eos, progress)
    if p.sampled_continuations:
        extra = _sampled_records(p, recs, todo)
        secs += _sampled(p, rd, model, tok, path, extra, eos, progress)
        recs = recs + extra  # todo stays 01's own decoding (the speed comparison below)
    write_jsonl(rd.generated, recs)
    n_tok = sum(len(r["output_ids"]) for r in recs if r["split"] == "train")
    man = _manifest(p, rd, model, path, engine, eos, template, len(train), len(held), n_tok)
    atomic_write_json(rd.generation_manifest, man)
    stats = {
        "engine": engine["name"],
        "engine_version": engine["version"],
        "n_train_prompts": len(train),
        "n_heldout_prompts": len(held),
        "generated_tokens": n_tok,
        "seconds": round(secs, 3),
        "tokens_per_s": round(n_tok / secs, 1) if secs else None,
        # the wall time of the one pass that wrote the dataset: a number, not a measurement
        "tokens_per_s_is": timing.summarize(
            [n_tok / secs] if secs else [], "01's generation", unit="tokens/s"
        ).text(1),
    }
    if p.generate_speed_engines:
        stats["speed_by_engine"] = _speed_by_engine(p, rd, model, tok, path, todo, eos, stats)
    update_metrics(rd.metrics, "generate", stats)
    if p.generate_engine != "hf":
        merge_engine_metrics(
            rd,
            p.generate_engine,
            {
                "generate_tokens_per_s_01": stats["tokens_per_s"],
                "generate_tokens_per_s_01_is": "01_generate wall time of the train prompts in "
                "batches of gen_batch_size (engine start excluded)",
            },
        )
    record_checks(
        rd,
        "01_generate",
        [
            f"params validated ({len(RunParams.model_fields)} keys)",
            f"{len(recs)} prompts fit the context of {ctx} with max_new_tokens={p.max_new_tokens}",
            "train/held-out split disjoint by prompt hash",
        ],
    )
    return {"manifest": man, "records": recs, "stats": stats}


def _records(p: RunParams, tok, template, train, held, ctx: int) -> list[dict]:
    """One record per prompt (train first, then held-out), its ids as the target will be served
    them (``template``: the chat template, None in completion mode, rendered with
    ``p.chat_template_kwargs``).

    Raises:
        ValueError: a prompt plus ``max_new_tokens`` exceeds the context ``ctx``.
    """
    recs = []
    for split, prompts in (("train", train), ("heldout", held)):
        for i, text in enumerate(prompts):
            ids = chat.encode_prompt(tok, text, p.mode, template, p.chat_template_kwargs)
            if len(ids) + p.max_new_tokens > ctx:
                raise ValueError(
                    f"prompt {split}[{i}] has {len(ids)} tokens; with max_new_tokens="
                    f"{p.max_new_tokens} it exceeds the context of {ctx}; shorten it or lower "
                    "max_new_tokens"
                )
            recs.append({"id": len(recs), "split": split, "prompt": text, "prompt_ids": ids})
    return recs


def _sampled_records(p: RunParams, recs: list[dict], train: list[dict]) -> list[dict]:
    """``p.sampled_continuations`` more train records per train prompt (same prompt and ids,
    ``variant`` 1.., ids after the existing records), for continuations sampled at
    ``p.sample_temperature``; the first record of each prompt keeps 01's own decoding."""
    out = []
    for v in range(1, p.sampled_continuations + 1):
        for r in train:
            rec = {k: r[k] for k in ("split", "prompt", "prompt_ids")}
            out.append({"id": len(recs) + len(out), **rec, "variant": v})
    return out


def _sampled(p: RunParams, rd: RunDir, model, tok, path, extra, eos, progress) -> float:
    """Fill ``extra``'s continuations: sampled at ``p.sample_temperature`` (seed + 1), whole, or
    for their first ``p.sampled_prefix_tokens`` tokens and then greedy from prompt + that prefix
    (the rest of ``max_new_tokens``; none after an EOS). Returns the seconds spent generating."""
    n = min(p.sampled_prefix_tokens or p.max_new_tokens, p.max_new_tokens)
    upd = {"temperature": p.sample_temperature, "seed": p.seed + 1, "max_new_tokens": n}
    secs = _generate(p.model_copy(update=upd), rd, model, tok, path, extra, eos, progress)[1]
    if n == p.max_new_tokens:
        return secs
    open_ = [r for r in extra if not (r["output_ids"] and r["output_ids"][-1] in eos)]
    rest = [{"prompt_ids": r["prompt_ids"] + r["output_ids"]} for r in open_]
    greedy = p.model_copy(update={"temperature": 0.0, "max_new_tokens": p.max_new_tokens - n})
    secs += _generate(greedy, rd, model, tok, path, rest, eos, progress)[1]
    for r, c in zip(open_, rest):
        r["output_ids"] = r["output_ids"] + c["output_ids"]
        r["text"] = tok.decode(r["output_ids"], skip_special_tokens=True)
    return secs


def _generate(
    p: RunParams, rd: RunDir, model, tok, path, todo, eos, progress
) -> tuple[dict, float]:
    """Generate a continuation of each ``todo`` record in batches of ``gen_batch_size`` (HF in this
    process, or vLLM / SGLang), setting its ``output_ids`` and ``text``. Returns ``(manifest engine block,
    seconds)``, the engine start excluded."""
    client = start_engine(p, rd, path, model.config.max_position_embeddings)
    batches = range(0, len(todo), p.gen_batch_size)
    try:
        if client is not None:
            record_engine_threads(rd, client)
            info = client.info()
            engine = {
                "name": info["engine_name"],
                "version": info["engine_version"],
                "torch": info["torch_version"],
                "device": info["device"],
            }
            if todo:  # engine start, not timed
                client.generate([todo[0]["prompt_ids"]], 1, eos, 0.0, 1.0, p.seed)
        else:
            engine = {"name": "hf-transformers", "version": __import__("transformers").__version__}
            engine["attention"] = generation_attention(model)
        t0 = time.time()
        desc = f"generate ({engine['name']})"
        for s in progress_bar()(batches, desc=desc) if progress else batches:
            chunk = todo[s : s + p.gen_batch_size]
            pids = [r["prompt_ids"] for r in chunk]
            args = (pids, p.max_new_tokens, eos, p.temperature, p.top_p, p.seed + s)
            outs = client.generate(*args) if client is not None else generate_batch(model, *args)
            for r, o in zip(chunk, outs):
                r["output_ids"], r["text"] = o, tok.decode(o, skip_special_tokens=True)
        secs = time.time() - t0
    finally:
        if client is not None:
            client.close()
    return engine, secs


def _speed_by_engine(p: RunParams, rd: RunDir, model, tok, path, todo, eos, stats) -> dict:
    """01's generation of the same train prompts timed through each engine of
    ``generate_speed_engines`` after the run's own (same process, same prompts and batches, engine
    start excluded): ``{engine: {"engine", "version", "tokens_per_s", "seconds",
    "generated_tokens", "same_ids_as_run"}}``, the run's own engine included. ``same_ids_as_run``
    is the fraction of prompts whose ids equal the stored ones (meaningful for greedy runs; None
    when sampling). The stored records stay the run engine's."""
    run = (stats["engine"], stats["engine_version"], stats["generated_tokens"], stats["seconds"])
    out = {p.generate_engine: speed_entry(*run, 1.0 if todo else None)}
    for e in p.generate_speed_engines:
        if e in out:
            continue
        copies = [dict(r) for r in todo]
        q = p.model_copy(update={"generate_engine": e})
        engine, secs = _generate(q, rd, model, tok, path, copies, eos, progress=False)
        n = sum(len(c["output_ids"]) for c in copies)
        same = sum(c["output_ids"] == r["output_ids"] for c, r in zip(copies, todo))
        greedy = todo and p.temperature == 0
        frac = round(same / len(todo), 4) if greedy else None
        out[e] = speed_entry(engine["name"], engine["version"], n, secs, frac)
    return out


def _manifest(p: RunParams, rd: RunDir, model, path, engine, eos, template, n_train, n_held, n_tok):
    """generation_manifest.json: target, engine, decoding, template and prompts of 01's output."""
    prompts_file = resolve_path(p.prompts_file)
    decoding = {
        "temperature": p.temperature,
        "top_p": p.top_p,
        "max_new_tokens": p.max_new_tokens,
        "greedy": p.temperature == 0,
        "stop_token_ids": eos,
        "sampled_continuations": p.sampled_continuations,
        "sample_temperature": p.sample_temperature if p.sampled_continuations else None,
        "sampled_prefix_tokens": p.sampled_prefix_tokens if p.sampled_continuations else None,
    }
    return provenance(
        p.seed,
        kind="eagle3nb-generation",
        target=target_info(path, model, rd.root),
        engine=engine,
        decoding=decoding,
        template={"mode": p.mode, "sha256": chat.template_hash(template)},
        template_kwargs=dict(p.chat_template_kwargs),  # as the chat-dataset path records them
        dtype=p.dtype,
        prompts_file={"path": str(prompts_file), "sha256": sha256_file(prompts_file)},
        n_train=n_train,
        n_heldout=n_held,
        generated_tokens=n_tok,
        file=rd.generated.name,
        file_sha256=sha256_file(rd.generated),
    )
