"""01_generate on a chat dataset: records read and refused, split by conversation, regenerated
turn by turn by the target (HF or vLLM), resumable; rows with loss masks from served ids."""

from __future__ import annotations

from collections import Counter

from eagle3nb.manifest import atomic_write_json, provenance, sha256_file
from eagle3nb.params import RunParams, resolve_device
from eagle3nb.preflight import check_records_left, split_checked
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.repo_paths import resolve_path
from eagle3nb.steps.generate import workers as generate_workers
from eagle3nb.steps.shared.checks import (
    merge_engine_metrics,
    record_checks,
    speed_entry,
    target_info,
    template_of,
)
from eagle3nb.target import models
from eagle3nb.text import chat, conversations
from eagle3nb.text.generation import write_jsonl
from eagle3nb.text.regenerate import run_key

__all__ = ["generate_chat_step", "refusal_table", "trained_fractions"]


def generate_chat_step(p: RunParams, progress=True) -> dict:
    """01 with ``dataset`` set: regenerate the train conversations turn by turn, store train rows
    and held-out conversation prefixes (one per user turn) for 04.

    Writes ``data/generated.jsonl``: train records ``{"id", "split": "train", "conversation",
    "turns", "prompt", "prompt_ids", "input_ids", "loss_mask", "output_ids", "text"}`` (one per
    row, see :mod:`eagle3nb.text.regenerate`), held-out records ``{"id", "split": "heldout",
    "conversation", "turn", "prompt", "tools", "prompt_ids", "output_ids", "text", "messages": the
    history served at that turn}``; the resume files ``data/generated.partial*.jsonl`` while it
    runs (one per worker with ``generate_workers``); ``data/generation_manifest.json``.

    Returns:
        ``{"manifest", "records", "stats": metrics.json["generate"], "refused": [{"where",
        "id", "reason"}]}``.

    Raises:
        ValueError: the dataset cannot be read, is empty, has no format column, or no record is
            left; a split with no train or no held-out conversation (before the target loads,
            :func:`eagle3nb.preflight.split_checked`); a train row whose loss mask is all zeros or all ones (a template that renders no
            header).
    """
    conversations.check_not_empty(resolve_path(p.dataset), p.dataset)  # named as the user wrote it
    fmt, recs, refused = conversations.load_records(resolve_path(p.dataset), p.dataset_format)
    source = f"dataset={p.dataset!r}"
    check_records_left(p, recs, refused)  # refused before the target loads
    split_checked([r["id"] for r in recs], p, source, "conversations")
    rd = RunDir(p).make()
    model, tok, path = models.load_target(p.model, p.dtype, resolve_device(p))
    template = template_of(p, tok)
    kwargs = dict(p.chat_template_kwargs)
    ctx = model.config.max_position_embeddings
    recs = _fit_context(recs, refused, tok, template, kwargs, ctx, p.max_new_tokens)
    check_records_left(p, recs, refused)
    train_ids, held_ids = split_checked([r["id"] for r in recs], p, source, "conversations")
    if p.max_train_prompts:
        train_ids = train_ids[: p.max_train_prompts]
    by_id = {r["id"]: r for r in recs}
    todo = [by_id[i] for i in train_ids + held_ids]
    eos = models.stop_token_ids(model, tok)
    settings = {
        "template_sha256": chat.template_hash(template),
        "kwargs": kwargs,
        "engine": p.generate_engine,
        "decoding": [p.max_new_tokens, p.temperature, p.top_p, p.seed, eos],
        "batch": p.gen_batch_size,
        "target": [str(path), p.dtype],
    }
    strip = [{k: v for k, v in r.items() if k != "where"} for r in todo]
    job = {"records": strip, "key": run_key(strip, settings), "template": template}
    job.update(kwargs=kwargs, eos=eos, ctx=ctx)
    if p.generate_workers > 1:
        engine, secs, results = generate_workers.run_workers(p, rd, tok, job)
    else:
        partial = rd.generated.with_name("generated.partial.jsonl")
        engine, secs, results = generate_workers.regenerate_share(
            p, rd, model, tok, path, job, partial, None, progress
        )
    out = _records(results, tok, set(train_ids), by_id)
    write_jsonl(rd.generated, out)
    generate_workers.clean_partials(rd)
    stats = _stats(p, engine, secs, fmt, results, out, refused, len(train_ids), len(held_ids))
    if p.generate_speed_engines:
        stats["speed_by_engine"] = _speed_by_engine(p, rd, model, tok, path, job, results, stats)
    update_metrics(rd.metrics, "generate", stats)
    if p.generate_engine != "hf":  # next to the engine's other speeds of this run
        tps = {"regenerate_tokens_per_s_01": stats["tokens_per_s"]}
        merge_engine_metrics(rd, p.generate_engine, tps)
    man = _manifest(p, rd, model, path, engine, eos, template, kwargs, stats)
    atomic_write_json(rd.generation_manifest, man)
    record_checks(
        rd,
        "01_generate",
        [
            f"dataset read as {fmt}: {len(recs)} records kept, {len(refused)} refused",
            "train/held-out split disjoint by conversation id hash",
            "loss masks from served ids: each train row has masked and unmasked tokens",
        ],
    )
    return {"manifest": man, "records": out, "stats": stats, "refused": refused}


def _speed_by_engine(p, rd: RunDir, model, tok, path, job, results, stats) -> dict:
    """The same regeneration (same conversations, chunks and turns) timed through each engine of
    ``generate_speed_engines`` after the run's own, engine start excluded: ``{engine: {"engine",
    "version", "tokens_per_s", "seconds", "generated_tokens", "same_ids_as_run"}}``, where
    ``same_ids_as_run`` is the fraction of conversations whose generated ids equal the run's turn
    by turn (greedy runs; None when sampling). The stored records stay the run engine's."""
    run = (stats["engine"], stats["engine_version"], stats["generated_tokens"], stats["seconds"])
    out = {p.generate_engine: speed_entry(*run, 1.0 if results else None)}
    ids = [[t["output_ids"] for t in r["turns"]] for r in results]
    for e in p.generate_speed_engines:
        if e in out:
            continue
        q = p.model_copy(update={"generate_engine": e})
        partial = rd.generated.with_name(f"speed.{e}.partial.jsonl")
        partial.unlink(missing_ok=True)
        try:
            eng, secs, res = generate_workers.regenerate_share(
                q, rd, model, tok, path, job, partial
            )
        finally:
            partial.unlink(missing_ok=True)
        n = sum(len(t["output_ids"]) for r in res for t in r["turns"])
        same = sum([[t["output_ids"] for t in r["turns"]] == i for r, i in zip(res, ids)])
        frac = round(same / len(ids), 4) if ids and p.temperature == 0 else None
        out[e] = speed_entry(eng["name"], eng["version"], n, secs, frac)
    return out


def _fit_context(recs, refused, tok, template, kwargs, ctx: int, max_new: int) -> list[dict]:
    """Records whose dataset rendering fits the context; the others go to ``refused``."""
    kept = []
    for r in recs:
        if "text" in r:
            n = len(tok(r["text"], add_special_tokens=False).input_ids) + max_new
        else:
            n = len(chat.render_ids(tok, r["messages"], template, False, r.get("tools"), kwargs))
        if n > ctx:
            reason = f"too long for the context ({n} tokens > {ctx})"
            refused.append({"where": r["where"], "id": r["id"], "reason": reason})
        else:
            kept.append(r)
    return kept


def _records(results: list[dict], tok, train: set, by_id: dict) -> list[dict]:
    """generated.jsonl records: train rows, then held-out prefixes (one per asked turn)."""
    out: list[dict] = []
    for split in ("train", "heldout"):
        for res in results:
            if (res["id"] in train) != (split == "train"):
                continue
            rec = by_id[res["id"]]
            users = [m["content"] for m in rec.get("messages", []) if m["role"] == "user"]
            users = users or [rec.get("text", "")]
            base = {"split": split, "conversation": res["id"]}
            if split == "train":
                for row in res["rows"]:
                    t0, m = row["turns"][0], row["loss_mask"]
                    first = m.index(1)
                    out.append(
                        {
                            "id": len(out),
                            **base,
                            "turns": row["turns"],
                            "prompt": users[min(t0, len(users) - 1)],
                            "prompt_ids": row["input_ids"][:first],
                            "input_ids": row["input_ids"],
                            "loss_mask": m,
                            "output_ids": [t for t, k in zip(row["input_ids"], m) if k],
                            "text": res["turns"][row["turns"][-1]]["text"],
                        }
                    )
                continue
            for t, turn in enumerate(res["turns"]):
                out.append(
                    {
                        "id": len(out),
                        **base,
                        "turn": t,
                        "prompt": users[min(t, len(users) - 1)],
                        "tools": rec.get("tools"),
                        **turn,
                    }
                )
    flat = [r["id"] for r in out if r["split"] == "train" and all(r["loss_mask"])]
    if flat:
        raise ValueError(
            f"rows {flat[:5]} have a loss mask of all ones: the chat template rendered nothing "
            "before the reply; use a template with role headers (chat_template)"
        )
    return out


def _stats(p, engine, secs, fmt, results, out, refused, n_train, n_held) -> dict:
    """metrics.json["generate"] of a chat-dataset run."""
    n_tok = sum(len(t["output_ids"]) for r in results for t in r["turns"])
    rows = [r for r in out if r["split"] == "train"]
    return {
        "engine": engine["name"],
        "engine_version": engine["version"],
        "dataset_format": fmt,
        "n_train_prompts": n_train,
        "n_heldout_prompts": n_held,
        "n_train_conversations": n_train,
        "n_heldout_conversations": n_held,
        "n_train_rows": len(rows),
        "n_heldout_prefixes": len(out) - len(rows),
        "n_turns": sum(len(r["turns"]) for r in results),
        "refused": dict(Counter(_reason_kind(x["reason"]) for x in refused)),
        "ended": dict(Counter(r["ended"] for r in results if r["ended"])),
        "generated_tokens": n_tok,
        "seconds": round(secs, 3),
        "tokens_per_s": round(n_tok / secs, 1) if secs else None,
        "trained_fraction_mean": round(sum(trained_fractions(out)) / len(rows), 4)
        if rows
        else None,
    }


def _reason_kind(reason: str) -> str:
    """The kind of a refusal reason (its text before any detail)."""
    for kind in (
        "unknown role",
        "empty content",
        "empty text",
        "starts with",
        "malformed tool call",
        "duplicate id",
        "too long",
        "no user turn",
        "not JSON",
        "not a JSON object",
        "not UTF-8",
    ):
        if reason.startswith(kind):
            return kind
    return reason.split(":")[0]


def trained_fractions(records: list[dict]) -> list[float]:
    """Share of loss-bearing tokens in each train sample of 01's records (list[float] in (0, 1)):
    a chat row's ``loss_mask``, or a completion record's generated ids over prompt + generated."""
    out = []
    for r in records:
        if r["split"] != "train" or not r.get("output_ids"):
            continue
        if "loss_mask" in r:
            out.append(sum(r["loss_mask"]) / len(r["loss_mask"]))
        else:
            out.append(len(r["output_ids"]) / (len(r["prompt_ids"]) + len(r["output_ids"])))
    return out


def refusal_table(refused: list[dict], limit: int = 20) -> str:
    """Refused records as a text table: counts per kind, then the first ``limit`` with file, line
    and reason ("" when none was refused)."""
    if not refused:
        return ""
    kinds = Counter(_reason_kind(x["reason"]) for x in refused)
    lines = [f"refused records: {len(refused)}"]
    lines += [f"  {n:5d}  {k}" for k, n in kinds.most_common()]
    lines += [f"  {x['where']:<28} id={x['id']}: {x['reason']}" for x in refused[:limit]]
    if len(refused) > limit:
        lines.append(f"  ... {len(refused) - limit} more in metrics.json")
    return "\n".join(lines)


def _manifest(p, rd, model, path, engine, eos, template, kwargs, stats):
    """generation_manifest.json of a chat-dataset run (target, engine, template, dataset)."""
    ds = resolve_path(p.dataset)
    return provenance(
        p.seed,
        kind="eagle3nb-generation",
        target=target_info(path, model, rd.root),
        engine=engine,
        decoding={
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_new_tokens": p.max_new_tokens,
            "greedy": p.temperature == 0,
            "stop_token_ids": eos,
        },
        template={"mode": p.mode, "sha256": chat.template_hash(template)},
        template_kwargs=kwargs,
        dtype=p.dtype,
        dataset={
            "path": str(ds),
            "format": stats["dataset_format"],
            "sha256": sha256_file(ds) if ds.is_file() else None,
        },
        n_train=stats["n_train_rows"],
        n_heldout=stats["n_heldout_prefixes"],
        generated_tokens=stats["generated_tokens"],
        file=rd.generated.name,
        file_sha256=sha256_file(rd.generated),
    )
