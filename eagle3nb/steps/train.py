"""Step 03 from the command line, and the entry point torchrun starts on every rank.

Command line (one process, or one per GPU under torchrun)::

    python -m eagle3nb.steps.train outputs/<run>            # the run's params.yaml
    python -m eagle3nb.steps.train params/default.yaml --set max_steps=200
    torchrun --nproc_per_node 2 -m eagle3nb.steps.train params/default.yaml

The training loop itself is :func:`eagle3nb.training.loop.train_drafter`; what 03 does around it
(dataset checks, vocab, export) is :func:`train_step` below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

import os
import subprocess


from eagle3nb.text import chat
from eagle3nb.target import conventions, models
from eagle3nb.training import distributed
from eagle3nb.steps import extract
from eagle3nb.target.alignment import alignment_matrix, alignment_verdict, reference_states
from eagle3nb.target.capture import n_layers_of
from eagle3nb.drafter.engine_read import engine_report
from eagle3nb.drafter.export import export_drafter, load_drafter
from eagle3nb.manifest import atomic_write_json, check_compatible, provenance, read_json
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.training.online import OnlineSource
from eagle3nb.steps.common import progress_bar, record_checks, resolve_aux, target_info, template_of
from eagle3nb.rundir import REPO_ROOT, RunDir, read_metrics, update_metrics
from eagle3nb.params import RunParams, resolve_device
from eagle3nb.training.loop import TrainConfig, train_drafter


def _train_with_torchrun(p: RunParams, rd: RunDir) -> dict:
    """03 with several processes: run ``python -m eagle3nb.steps.train`` under torchrun (this node's
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
    cmd = distributed.torchrun_command(["eagle3nb.steps.train", str(pf)], p.nproc_per_node, p.nnodes, p.node_rank, p.rdzv_endpoint)
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
    ds_dir = rd.dataset_vllm if p.train_on == "vllm" else rd.dataset
    ds = AuxDataset(ds_dir, mmap=True) if p.training_mode == "offline" else None
    model, tok, path = models.load_target(p.model, "float32", distributed.local_device(resolve_device(p), ctx))
    if ds is None:
        ds = _online_source(p, rd, model, tok, path)
    if not p.allow_manifest_mismatch:
        # 02a stores vLLM's ids (convention vllm); the boundaries are compared below either way
        want = {"target": {"sha256": models.model_hash(path, rd.root)}, "dtype": p.dtype, "convention": "vllm" if p.train_on == "vllm" and p.training_mode == "offline" else p.convention, "template": {"mode": p.mode, "sha256": chat.template_hash(template_of(p, tok))}}
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
    drafter, rep = train_drafter(ds, model, cfg, rd.train, progress_bar() if progress else None)
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
    check_compatible(gman, {"target": tinfo, "template": {"mode": p.mode, "sha256": chat.template_hash(template_of(p, tok))}}, ["target.sha256", "template"], "generation output", "(delete the run folder)")
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


def _load_run_params(run: Path, sets: list[str]):
    from eagle3nb.params import load_params

    pf = run / "params.yaml" if run.is_dir() else run
    if run.is_dir() and not pf.exists():
        raise FileNotFoundError(f"{run} is a folder without params.yaml; pass a run folder written by `python -m eagle3nb.run` or a params YAML file")
    over = {}
    for kv in sets or []:
        if "=" not in kv:
            raise ValueError(f"--set {kv!r}: write key=value, e.g. --set max_steps=200")
        k, v = kv.split("=", 1)
        import yaml

        over[k.strip()] = yaml.safe_load(v)
    return load_params(pf, **over)


def _cli():
    import typer

    app = typer.Typer(add_completion=False, help=__doc__)

    @app.command()
    def main(
        run: Path = typer.Argument(..., help="run folder (holding params.yaml) or a params YAML file"),
        set_: Optional[list[str]] = typer.Option(None, "--set", help="override a parameter, key=value (repeatable)"),
    ):
        """Train (03) from a run's params; several processes when launched by torchrun or when
        nproc_per_node/nnodes ask for them."""

        try:
            p = _load_run_params(run, set_)
            out = train_step(p.model_copy(update={"interactive": False}), progress=p.interactive)
        except (ValueError, FileNotFoundError) as e:  # bad input: the message says what and how to fix
            typer.echo(f"eagle3nb.steps.train: {e}", err=True)
            raise typer.Exit(2) from None
        finally:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        if out["stats"] is not None:
            s = out["stats"]
            typer.echo(f"trained {s['steps']} steps on {s.get('world_size', 1)} process(es) ({s.get('parallel', 'single')}) in {s['seconds']} s, {s['loss_token_steps_per_s']} loss-token-steps/s -> {out['export_dir']}")

    return app


app = _cli()


if __name__ == "__main__":
    app()
