"""03_train: train the drafter and export it; step 03 from the command line; torchrun's entry point.

Command line (one process, or one per GPU under torchrun)::

    python -m eagle3nb.steps.train.step outputs/<run>            # the run's params.yaml
    python -m eagle3nb.steps.train.step params/default.yaml --set max_steps=200
    torchrun --nproc_per_node 2 -m eagle3nb.steps.train.step params/default.yaml

The training loop itself is :func:`eagle3nb.training.loop.train_drafter`; what 03 does around it
(dataset checks, vocab, export) is :func:`train_step` below.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Annotated

import torch
import typer

from eagle3nb.dataset.read import AuxDataset
from eagle3nb.boundaries.engine_read import engine_report, trainer_flags
from eagle3nb.boundaries.rules import register_recorded
from eagle3nb.drafter.export import export_drafter, load_drafter
from eagle3nb.manifest import atomic_write_json, check_compatible, provenance, read_json
from eagle3nb.manifest import rendered_kwargs, template_fields, with_template_kwargs
from eagle3nb.params import RunParams, load_run_params, resolve_device
from eagle3nb.rundir import RunDir, read_metrics, update_metrics
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.steps.extract import sharded as extract
from eagle3nb.steps.train.heldout_slice import heldout_eval, heldout_stats
from eagle3nb.steps.train.online_engine import engine_online_source
from eagle3nb.steps.shared.checks import (
    check_alignment,
    checked_generation,
    engine_versions,
    export_rule_check,
    progress_bar,
    record_alignment,
    record_checks,
    resolve_aux,
    template_of,
    use_thread_budget,
)
from eagle3nb.boundaries import conventions
from eagle3nb.target import models
from eagle3nb.target.capture import n_layers_of
from eagle3nb.target.head import load_target_head
from eagle3nb.text import chat
from eagle3nb.training import distributed
from eagle3nb.training.fastpath import resolve
from eagle3nb.training.loop import TrainConfig, train_drafter
from eagle3nb.training.online import OnlineSource
from eagle3nb.training.shard_target import choose_target_shard, load_sharded_target, shard_report


def train_step(p: RunParams, progress=True) -> dict:
    """03: train the drafter with TTT on the dataset (``training_mode: online``: on 01's samples,
    the target capturing each batch) and export it for SGLang and vLLM.

    ``nproc_per_node`` 1 and ``nnodes`` 1 train in this process; more launch torchrun (see
    :func:`_train_with_torchrun`). Under torchrun every rank runs this; rank 0 exports and writes
    metrics, the others return ``stats: None``.

    Returns:
        ``{"history": per logged step, "stats": metrics.json["train"] (None off rank 0),
        "export_dir": the drafter folder}``.

    Raises:
        ManifestMismatch: the dataset was made with another target, dtype, convention, template or
            boundaries (unless ``allow_manifest_mismatch``).
        ValueError: the exported ids would serve other boundaries than trained (unless
            ``allow_manifest_mismatch``); ``draft_vocab_size`` over the target's vocab; online:
            no sample or a boundary mismatch (unless ``allow_boundary_mismatch``).
        RuntimeError: the torchrun launch failed.
    """
    rd = RunDir(p)
    use_thread_budget(p, rd)
    if (p.nproc_per_node > 1 or p.nnodes > 1) and not distributed.under_torchrun():
        return _train_with_torchrun(p, rd)
    ctx = distributed.init_from_env(resolve_device(p))
    init = adoption_for(p) if p.init_from else None  # refused before any weight loads
    if p.training_mode == "online" and p.online_engine != "hf" and ctx.world > 1:
        raise ValueError(  # RunParams refuses it; a torchrun started by hand gets here
            f"online_engine={p.online_engine!r} with {ctx.world} training processes: one engine "
            "worker feeds one trainer here; use nproc_per_node: 1 and nnodes: 1, or "
            "online_engine: hf (docs/training.md#online-from-the-serving-engine)"
        )
    ds_dir = rd.dataset_vllm if p.train_on == "vllm" else rd.dataset
    ds = AuxDataset(ds_dir, mmap=True) if p.training_mode == "offline" else None
    device = distributed.local_device(resolve_device(p), ctx)
    model, tok, path, head = _load_target(p, device, ctx)  # head: beside a sharded target
    if ds is None and p.online_engine == "hf":
        ds = _online_source(p, rd, model, tok, path)
    elif ds is None:  # the serving engine captures each batch (steps/train/online_engine.py)
        ds = engine_online_source(p, rd, model, tok, path, device)
    if not p.allow_manifest_mismatch:
        _check_dataset(p, rd, ds.manifest, ds_dir, model, tok, path)
    serve_b = _served_boundaries(p, ds.manifest, ds_dir, n_layers_of(model))
    arch, trained = ds.manifest["target"].get("architecture"), ds.manifest["aux_boundaries"]
    if ctx.is_main and arch:  # each engine version's rule for this class reads the export's ids
        export_rule_check(p, rd, arch, n_layers_of(model), trained, serve_b)
    vocab = model.config.get_text_config().vocab_size  # wrappers: the text model's
    if p.draft_vocab_size > vocab:
        raise ValueError(
            f"draft_vocab_size={p.draft_vocab_size} exceeds the target vocab ({vocab}); lower it"
        )
    cfg = _train_config(p)
    ev = heldout_eval(p, rd, model, tok, ds.manifest["aux_boundaries"])
    bar = progress_bar() if progress else None
    try:
        drafter, rep = train_drafter(
            ds, head or model, cfg, rd.train, bar, ev, p.tracking, init=init
        )
    finally:  # the engine of online training is not needed for the export
        if hasattr(ds, "close"):
            ds.close()
    if not ctx.is_main:
        return {"history": rep["history"], "stats": None, "export_dir": rd.drafter}
    atomic_write_json(rd.train / "history.json", rep["history"])
    step_times = {
        "seconds": rep["step_seconds"],
        "token_steps": rep["step_token_steps"],
        "wait_seconds": rep["step_wait_seconds"],
        "world_size": rep["world_size"],
        "is": "per step of the last (resumed) call: wall seconds on rank 0 and loss-bearing "
        "tokens x TTT steps over all ranks",
    }
    atomic_write_json(rd.train / "step_times.json", step_times)
    engines = _export(p, rd, ds.manifest, drafter, rep, cfg, tok, serve_b)
    stats = dict(_train_stats(p, ds, rep), heldout=heldout_stats(p, rep, ev))
    update_metrics(rd.metrics, "train", stats)
    _record_checks(p, rd, ds.manifest, ds_dir, serve_b, engines)
    return {"history": rep["history"], "stats": stats, "export_dir": rd.drafter}


def adoption_for(p: RunParams) -> dict:
    """``init_from`` checked against the target's config and this run's boundaries before any
    work (:func:`eagle3nb.training.init_from.adoption_plan`; preflight calls it too).

    Raises:
        FileNotFoundError, ValueError: as adoption_plan (the field or the boundaries named).
    """
    from eagle3nb.repo_paths import resolve_path
    from eagle3nb.training.init_from import adoption_plan

    path = models.resolve_model(p.model)
    tcfg = models.text_config(models.read_model_config(path))
    n = int(tcfg["num_hidden_layers"])
    _, bnds = resolve_aux(p, n)
    tok_n = len(models.load_tokenizer(path))

    def hint(declared: list[int]) -> str | None:  # the layer_ids that capture that set
        try:
            ids = conventions.get_convention(p.convention).boundaries_to_ids(declared, n)
        except ValueError:
            return None
        return f"layer_ids: {ids} (convention {p.convention})"

    folder = resolve_path(p.init_from)
    target = {"name": p.model}
    if _manifest_has_sha(folder):  # hashing the target's weights only where it compares
        target["sha256"] = models.model_hash(path)
    return adoption_plan(
        folder, tcfg, tok_n, bnds, p.init_boundaries, hint, target, p.init_from_target
    )


def _manifest_has_sha(folder) -> bool:
    import json
    from pathlib import Path

    man = Path(folder) / "manifest.json"
    return man.is_file() and bool((json.loads(man.read_text()).get("target") or {}).get("sha256"))


def _train_config(p: RunParams) -> TrainConfig:
    """TrainConfig from the run parameters of the same names (other fields keep defaults)."""
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    return TrainConfig(**{k: getattr(p, k) for k in names if k in RunParams.model_fields})


def _load_target(p: RunParams, device: str, ctx):
    """``(target, tokenizer, path, head)`` as 03 needs the target: offline without held-out
    evaluation its head only (embedding, final norm, lm_head; bf16 for bf16-mixed training);
    online with ``online_target_shard`` resolved to fsdp the model in ``p.dtype`` sharded over the
    ranks and its float32 head (:mod:`eagle3nb.training.shard_target`); else the whole model in
    float32 (head None). Raises ValueError when the sharding cannot apply, before any read."""
    path = models.resolve_model(p.model)
    how = p.online_target_shard, ctx.world, p.training_mode, p.eval_every
    if choose_target_shard(*how, path) == "fsdp":
        return load_sharded_target(p.model, p.dtype, device, ctx)[:4]
    if p.training_mode != "offline" or p.eval_every > 0:
        return (*models.load_target(p.model, "float32", device), None)
    models.check_model_folder(path)
    fast = resolve(p.precision, p.torch_compile, torch.device(device))
    dtype = torch.bfloat16 if fast.precision == "bf16-mixed" else torch.float32
    return load_target_head(path, dtype, device), models.load_tokenizer(path), path, None


def _train_with_torchrun(p: RunParams, rd: RunDir) -> dict:
    """03 with several processes: run ``python -m eagle3nb.steps.train.step`` under torchrun (this node's
    share when ``nnodes`` > 1), stream its output, then read what rank 0 wrote."""
    import yaml

    if p.device.startswith("cuda") or p.device == "auto":
        n = torch.cuda.device_count()
        if n and p.nproc_per_node > n:
            raise ValueError(
                f"nproc_per_node={p.nproc_per_node} but this node has {n} GPUs; set "
                f"nproc_per_node to at most {n}"
            )
    rd.train.mkdir(parents=True, exist_ok=True)
    pf = rd.train / "launch_params.yaml"
    pf.write_text(yaml.safe_dump(dict(p.model_dump(), interactive=False), sort_keys=False))
    cmd = distributed.torchrun_command(
        ["eagle3nb.steps.train.step", str(pf)],
        p.nproc_per_node,
        p.nnodes,
        p.node_rank,
        p.rdzv_endpoint,
    )
    # the ranks import eagle3nb from this checkout, installed or not
    paths = [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *paths]))
    print("[eagle3nb] " + " ".join(cmd), flush=True)
    out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=env, **out)
    tail = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        tail = (tail + [line])[-40:]
    if proc.wait() != 0:
        raise RuntimeError(
            f"torchrun training failed (exit {proc.returncode}); last lines:\n" + "".join(tail)
        )
    return {
        "history": read_json(rd.train / "history.json"),
        "stats": read_metrics(rd.metrics)["train"],
        "export_dir": rd.drafter,
    }


def _online_source(p: RunParams, rd: RunDir, model, tok, path) -> OnlineSource:
    """03 online: 01's samples (as 02 would extract them), the target (``p.dtype``) capturing each
    batch; the same checks as 02 before training (generation manifest, measured boundaries)."""
    gman, tinfo = checked_generation(p, rd, model, tok, path)
    ids, bnds = resolve_aux(p, tinfo["n_layers"])
    same = model.dtype == models.DTYPES[p.dtype]  # a sharded target is loaded in p.dtype
    cap = model if same else models.load_target(p.model, p.dtype, model.device)[0]
    samples = extract.checked_train_samples(rd, "train on")
    man = provenance(
        p.seed,
        target=tinfo,
        dtype=p.dtype,
        **template_fields(gman),  # the template and the kwargs 01 rendered with
        generation_sha256=gman["file_sha256"],
    )
    src = OnlineSource(samples, cap, ids, p.convention, man)
    probe = samples[0][1]
    name = src.engine.engine_name
    captured = src.engine.capture([probe], ids)[0].aux
    align, _, _ = check_alignment(p, name, p.convention, ids, bnds, captured, cap, probe)
    record_alignment(rd, name, align, online=True)
    src.manifest["engine"]["target_shard"] = shard_report(cap)  # per-rank share of the target
    return src


def _check_dataset(p: RunParams, rd: RunDir, man: dict, ds_dir, model, tok, path) -> None:
    """The dataset's target, dtype, convention, template (+ its kwargs) and boundaries are this run's.

    Raises:
        ManifestMismatch: one differs (kwargs: a manifest without them counts as {}).
    """
    # 02a stores vLLM's ids (convention vllm); the boundaries are compared below either way
    from_vllm = (p.train_on if p.training_mode == "offline" else p.online_engine) == "vllm"
    want = {
        "target": {"sha256": models.model_hash(path, rd.root)},
        "dtype": p.dtype,
        "convention": "vllm" if from_vllm else p.convention,
        "template": {"mode": p.mode, "sha256": chat.template_hash(template_of(p, tok))},
        "template_kwargs": rendered_kwargs(p.mode, p.chat_template_kwargs),
    }
    keys = ["target.sha256", "dtype", "convention", "template", "template_kwargs"]
    have = with_template_kwargs(man)
    check_compatible(have, want, keys, f"dataset {ds_dir}", "allow_manifest_mismatch")
    _, bnds = resolve_aux(p, n_layers_of(model))
    what = f"dataset {ds_dir} (boundaries the exported drafter will be served with)"
    check_compatible(
        man, {"aux_boundaries": bnds}, ["aux_boundaries"], what, "allow_manifest_mismatch"
    )


def _served_boundaries(p: RunParams, man: dict, ds_dir, n_layers: int) -> list[int]:
    """The boundaries the exported ids make SGLang and vLLM capture: the trained ones, or with
    ``export_layer_ids: engine_default`` the ids users copy from the engines' defaults (the
    user's failure when the data came from elsewhere).

    Raises:
        ValueError: they differ from the trained ones (unless ``allow_manifest_mismatch``).
    """
    trained = list(man["aux_boundaries"])
    if p.export_layer_ids == "engine_default":
        serve_b = conventions.pick_default_boundaries(n_layers)
    else:
        serve_b = trained
    if serve_b != trained and not p.allow_manifest_mismatch:
        raise ValueError(
            f"export_layer_ids={p.export_layer_ids!r}: the exported ids make SGLang and vLLM "
            f"capture boundaries {serve_b}, but dataset {ds_dir} was captured at boundaries "
            f"{man['aux_boundaries']} ({man['convention']} ids {man['layer_ids']}); the served "
            "drafter would read other tensors than it was trained on. Use export_layer_ids: "
            "trained, or set allow_manifest_mismatch=True to reproduce the mismatch"
        )
    return serve_b


def _export(p: RunParams, rd: RunDir, man: dict, drafter, rep, cfg, tok, serve_b) -> dict:
    """Export the drafter for SGLang and vLLM, reload it, and record in metrics.json["export"] how
    each engine reads its ids back. Returns that per-engine report."""
    bnds = man["aux_boundaries"]
    n = man["target"]["n_layers"]
    dman = provenance(
        p.seed,
        kind="eagle3nb-drafter",
        training_mode=p.training_mode,
        target=man["target"],
        dataset_engine=man["engine"],  # online from an engine: its block, "online": true
        final_state=man.get("final_state"),  # which engine gave boundary N
        twin_check=man.get("twin_check"),  # how the engine's id rule is known (02a/02b, online)
        convention=man["convention"],
        layer_ids=man["layer_ids"],
        aux_boundaries=bnds,
        dtype=man["dtype"],
        **template_fields(man),  # the dataset's: what the drafter was trained on
        train_config=cfg.__dict__,
        vocab=rep["vocab"],
        init_from=rep.get("init_from"),  # where an adopted drafter came from (None: fresh)
    )
    bos, eos = tok.bos_token_id, tok.eos_token_id
    by_rule = p.export_layer_ids != "convention"  # convention: the per-class mismatch, reproduced
    vers = engine_versions(p)
    register_recorded(man)  # a rule 02 measured: the export writes ids by it (manifest-carried)
    table = _tau_table(rd, bnds)  # 06's audit of this run's drafter, where one was made
    export_drafter(drafter, rd.drafter, bnds, n, dman, bos, eos, serve_b, p.k, vers, by_rule, table)
    _, cfg_json = load_drafter(rd.drafter)  # refuses a folder missing a tensor or contradicting
    export_notices(p, rd, cfg_json, n)
    engines = engine_report(cfg_json, bnds, n, trainer_flags(drafter.config))
    export = {
        "engines": engines,
        "export_layer_ids": p.export_layer_ids,
        "trained_boundaries": bnds,
        "served_boundaries": serve_b,
        "serve_mismatch": serve_b != list(bnds),
    }
    update_metrics(rd.metrics, "export", export)
    return engines


def _tau_table(rd: RunDir, bnds: list[int]) -> tuple[list[dict], str] | None:
    """The audit's tau per boundary set (06's ``audit/audit.json``, best first) when it audited
    this run's drafter trained on ``bnds`` (a re-run of 03); None otherwise."""
    f = rd.root / "audit" / "audit.json"
    try:
        a = read_json(f, "audit")
        same = Path(a["drafter"]).resolve() == rd.drafter.resolve()
        if same and list(a["verdict"]["declared"]) == list(bnds):
            return a["candidates"], f"{f} (06's audit of this run's drafter)"
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        pass
    return None


EXPORT_PREFIX = "[03] "  # with NOTICE, a line python -m eagle3nb.run counts (run._notices)


def export_notices(p: RunParams, rd: RunDir, cfg: dict, n: int) -> list[str]:
    """What the export refused, on the terminal (printed, and appended to ``train/train.log``,
    which the runner echoes): per refused engine the lines of
    :func:`eagle3nb.boundaries.refusal.refusal_notice` (why, its ids key marked so it cannot serve
    its default ids by mistake, the set to retrain or fine-tune at), each ``[03] notice: ``.
    Returns the lines (none when no engine was refused)."""
    from eagle3nb.boundaries.refusal import refusal_notice
    from eagle3nb.steps.evaluate.progress import NOTICE

    meta = cfg.get("eagle3nb") or {}
    lines = []
    for engine, why in (meta.get("refused_engines") or {}).items():
        best = (meta.get("retrain") or {}).get(engine)
        how = ""
        if best is not None:
            try:
                ids = conventions.get_convention(p.convention).boundaries_to_ids(
                    best["boundaries"], n
                )
                how = f"layer_ids: {ids} (convention {p.convention}), then 02 and 03 again; or "
            except ValueError:
                pass
            how += f"fine-tune this drafter there: init_from: {rd.drafter}, init_boundaries: params"
        lines += [EXPORT_PREFIX + NOTICE + x for x in refusal_notice(engine, why, best, how)]
    if lines:
        rd.train.mkdir(parents=True, exist_ok=True)
        with open(rd.train / "train.log", "a") as f:
            f.write("".join(x + "\n" for x in lines))
        print("\n".join(lines), flush=True)
    return lines


def _train_stats(p: RunParams, ds, rep: dict) -> dict:
    """metrics.json["train"]: steps, speed, last losses, vocab, padding, parallelism."""
    last = rep["history"][-1]
    tps = rep["tokens_per_s"]
    stats = {
        "steps": rep["steps"],
        "seconds": round(rep["seconds"], 2),
        "loss_token_steps_per_s": round(tps, 1) if tps else None,
        "final_loss": last["loss"],
        "final_loss_is": f"sum over TTT steps j of {p.loss_decay}**j x soft cross-entropy, last "
        "logged training batch",
        "last_batch_step_acc": last["step_acc"],
        "last_batch_step_acc_is": "training-batch accuracy per TTT step (not held-out; see eval)",
        "draft_vocab_size": p.draft_vocab_size,
        "vocab": rep["vocab"],
        "init_from": rep.get("init_from"),
        "empty_batches": rep["empty_batches"],
        "n_train_samples": len(ds),
        "n_train_tokens_incl_prompts": ds.manifest["n_tokens"],
        "world_size": rep["world_size"],
        "parallel": rep["parallel"],
        "global_batch": p.batch_size,
        "padding_fraction": {k: round(v["padding_fraction"], 4) for k, v in rep["padding"].items()},
        "padding_fraction_is": "share of padded positions in the per-rank batches of one epoch: "
        "this run's plan (bucketed by length unless bucket_by_length is false) vs a plain shuffle",
        "training_mode": p.training_mode,
        "batch_wait_share": round(
            sum(rep["step_wait_seconds"][1:]) / max(sum(rep["step_seconds"][1:]), 1e-9), 4
        ),
        "batch_wait_share_is": "share of the step time spent waiting for the batch, steps after "
        "the first (loader offline, target capture online; the issue-12 margin is <= 0.5)",
        "thread_changes": rep["thread_changes"],  # torch threads re-sized to the idle cores
    }
    if p.training_mode == "online":  # the target's share of the training time
        stats["online"] = ds.stats()
    return stats


def _record_checks(p: RunParams, rd: RunDir, man: dict, ds_dir, serve_b, engines: dict) -> None:
    """metrics.json["checks"]["03_train"]."""
    bnds = man["aux_boundaries"]
    unchecked = "NOT checked (allow_manifest_mismatch)"
    checked = not p.allow_manifest_mismatch
    if p.training_mode == "offline":
        data = f"dataset {ds_dir.name}/ (engine {man['engine']['name']}): "
        data += f"{len(man['shards'])} shard sha256 verified at load"
    elif p.online_engine == "hf":
        data = "online: the target captured every batch (no dataset on disk); its sha256 and "
        data += "template match 01's output"
    else:
        e = man["engine"]
        data = f"online: {e['name']} {e['version']} captured every batch (no states on disk; "
        data += "twin proof and probe vs HF before the first step, re-checks in metrics.json"
        data += "[train][online])"
    serve = f"exported ids serve the trained boundaries {bnds}"
    if serve_b != list(bnds):
        serve = "SERVE MISMATCH (allowed by allow_manifest_mismatch): trained at boundaries "
        serve += f"{bnds}, exported ids serve {serve_b}"
    reads = ", ".join(
        f"{e}=" + ("ok" if r["ok"] else r.get("refused") or "MISMATCH " + str(r))
        for e, r in engines.items()
    )
    lines = [
        data,
        "manifest target/dtype/convention/template " + ("match this run" if checked else unchecked),
        (
            f"dataset boundaries {bnds} == boundaries the drafter is served with"
            if checked
            else "serve-time boundaries " + unchecked
        ),
        "exported drafter reloads: required tensors present, shapes match config, "
        + "d2t offsets consistent with t2d",
        serve,
        "engines read back the trained boundaries: " + reads,
    ]
    record_checks(rd, "03_train", lines)


app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(
    run: Annotated[
        Path, typer.Argument(help="run folder (holding params.yaml) or a params YAML file")
    ],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="override a parameter, key=value (repeatable)"),
    ] = None,
):
    """Train (03) from a run's params; several processes when launched by torchrun or when
    nproc_per_node/nnodes ask for them."""
    try:
        p = load_run_params(run, set_)
        out = train_step(p.model_copy(update={"interactive": False}), progress=p.interactive)
    except (ValueError, FileNotFoundError) as e:  # bad input: the message says what and how to fix
        typer.echo(f"eagle3nb.steps.train.step: {e}", err=True)
        raise typer.Exit(2) from None
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if out["stats"] is not None:
        s = out["stats"]
        typer.echo(
            f"trained {s['steps']} steps on {s.get('world_size', 1)} process(es) "
            f"({s.get('parallel', 'single')}) in {s['seconds']} s, "
            f"{s['loss_token_steps_per_s']} loss-token-steps/s -> {out['export_dir']}"
        )


if __name__ == "__main__":
    app()
