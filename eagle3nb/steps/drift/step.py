"""05_drift: quantized targets and kernel drift. One drafter per (engine, dtype, quantization)
source, each evaluated on every source: a train x serve matrix of tau and a_1, with the layer
offset as one more row, so a drop reads as drift or as offset.

How a cell is measured: the drafter drafts k tokens after every emitted token of the serve
source's own greedy continuation of each held-out prompt, from the serve source's own captured
states (:func:`eagle3nb.drafter.ksweep.accepted_from_states`), and the k-run is walked from those
(exact for greedy chain drafting; the states come from one capture of prompt + continuation per
prompt instead of the serving engine's verify forwards). Same method in every cell. Next to it:
for vLLM sources (``drift_vllm_serve``) vLLM itself serves the reference drafter and the
source's own drafter (its own counters; output checked against its plain greedy output), and
for HF sources the simulator runs the source's drafter on that HF target (output checked
against its plain greedy output; its tau checks the states-based one).
"""

from __future__ import annotations

import copy
import hashlib
import time
from dataclasses import replace

import torch

from eagle3nb.drafter.ksweep import accepted_from_states, sweep_from_positions
from eagle3nb.manifest import provenance
from eagle3nb.params import RunParams, resolve_device
from eagle3nb.rundir import RunDir, update_metrics
from eagle3nb.steps.evaluate import chat as eval_chat
from eagle3nb.steps.extract import sharded as extract
from eagle3nb.steps.shared.checks import record_checks, resolve_aux, use_thread_budget
from eagle3nb.steps.drift.report import matrix_block, recommend
from eagle3nb.steps.drift.sources import (
    REFERENCE,
    SourceData,
    capture_hf,
    capture_vllm,
    drift_stats,
    figure_states,
    parse_sources,
)
from eagle3nb.steps.evaluate.step import offset_boundaries
from eagle3nb.steps.shared.recorded import run_or_read
from eagle3nb.target import models
from eagle3nb.target.capture import final_norm_of, n_layers_of
from eagle3nb.target.quantize import load_quantized_hf, quantized_path, write_quantized
from eagle3nb.training.loop import TrainConfig, train_drafter

OFFSET_ROW = "layer offset"  # row key: the reference's drafters fed the other engine's boundaries


class StateStore:
    """One source's train samples in memory, read by the training loop as an ``AuxDataset``
    (``store[i]``: ``input_ids [T]``, ``loss_mask [T]``, ``aux [T, n_aux*H]``, ``final [T, H]``).
    """

    def __init__(self, items: list[dict], bnds: list[int]):
        self.items = items
        self.lengths = [len(x["input_ids"]) for x in items]
        self.manifest = {"aux_boundaries": list(bnds), "n_tokens": sum(self.lengths)}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]

    def fingerprint(self) -> str:
        """sha256 over every stored tensor (a checkpoint resumes only on the same data)."""
        h = hashlib.sha256()
        for x in self.items:
            for k in ("input_ids", "loss_mask", "aux", "final"):
                h.update(x[k].contiguous().numpy().tobytes())
        return h.hexdigest()

    def token_masks(self):
        """``(input_ids, loss_mask)`` per sample (the draft vocab)."""
        return ((x["input_ids"], x["loss_mask"]) for x in self.items)


class _Ctx:
    """What every part of the step shares."""

    def __init__(self, p: RunParams):
        self.p, self.rd = p, RunDir(p)
        self.device = resolve_device(p)
        self.ref, self.tok, self.path = models.load_target(p.model, "float32", self.device)
        self.n = n_layers_of(self.ref)
        self.ids, self.bnds = resolve_aux(p, self.n)
        self.moved = offset_boundaries(p.convention, list(self.bnds), self.n)
        self.all_b = sorted(set(self.bnds) | set(self.moved or []))
        self.samples = extract.checked_train_samples(self.rd, "train the drafters on")
        self.prompts = eval_chat.heldout_prompts(p, self.rd, self.tok)[0]
        self.stops = set(models.stop_token_ids(self.ref, self.tok))
        self.sha = models.model_hash(self.path, self.rd.root)
        self.out = self.rd.root / "drift"
        self.drafters: dict[str, list] = {}  # source key -> drafter per seed
        self.checks: dict[str, dict] = {}  # source key -> served / simulator checks
        self.seconds = {"quantize": 0.0, "capture": 0.0, "train": 0.0, "checks": 0.0, "matrix": 0.0}

    def timed(self, phase: str, t0: float) -> None:
        """Add the seconds since ``t0`` to ``phase``."""
        self.seconds[phase] = round(self.seconds[phase] + time.time() - t0, 2)

    def head(self, final: torch.Tensor) -> torch.Tensor:
        """The float32 target's logits from boundary N states ``[T, H]``."""
        x = final.to(self.ref.device)
        return self.ref.get_output_embeddings()(final_norm_of(self.ref)(x)).float().cpu()


def drift_matrix_step(p: RunParams, progress=True) -> dict:
    """05: capture every source in ``p.drift_sources`` (quantized variants written into the run
    folder first), train ``len(p.drift_seeds)`` drafters per source for ``p.drift_train_steps``
    steps, and evaluate each on every source (see the module docstring).

    Returns:
        ``metrics.json["drift_matrix"]`` (sources, drift per boundary, logits, matrix,
        served checks, recommendation) with ``"states"``: :func:`figure_states` of every source
        (``{label: {b: [sum T, H] float32}}``) for the drift figure.

    Raises:
        ValueError: a bad ``drift_sources`` entry (before any work); no train sample or held-out
            prompt.

    A re-run on unchanged parameters and inputs reads the recorded result (``reuse_results``,
    :mod:`eagle3nb.steps.shared.recorded`) and starts no engine.
    """
    parse_sources(p.drift_sources)  # bad input fails here, before a record is looked for
    inputs = ("data", "drift", "quantized")
    return run_or_read(p, RunDir(p).root, "05_drift", inputs, lambda: _matrix(p, progress))


def _matrix(p: RunParams, progress: bool) -> dict:
    sources = parse_sources(p.drift_sources)
    c = _Ctx(p)
    use_thread_budget(p, c.rd)
    t0 = time.time()
    quant = _write_variants(c, sources)
    c.timed("quantize", t0)
    data: dict[str, SourceData] = {}
    for src in sources:
        data[src.key] = _run_source(c, src, quant.get(src.quant))
    ref = data[REFERENCE]
    drift = {k: drift_stats(ref, d, c.bnds, c.head) for k, d in data.items() if k != REFERENCE}
    t1 = time.time()
    cells = _evaluate_all(c, data)
    c.timed("matrix", t1)
    mat = matrix_block(cells, [s.key for s in sources], OFFSET_ROW)
    block = {
        "sources": [_source_block(data[s.key], quant.get(s.quant)) for s in sources],
        "reference": REFERENCE,
        "boundaries": list(c.bnds),
        "offset_boundaries": c.moved,
        "drift": drift,
        "matrix": mat,
        "checks": c.checks,
        "recommendation": recommend(mat, REFERENCE, OFFSET_ROW),
        "budget": _budget(c),
        "method": __doc__.split("How a cell is measured: ")[1].split("\n\n")[0].replace("\n", " "),
        "seconds": round(time.time() - t0, 1),
        "seconds_by_phase": c.seconds,
    }
    update_metrics(c.rd.metrics, "drift_matrix", block)
    record_checks(c.rd, "05_drift", _check_lines(block))
    return dict(block, states=figure_states(data, c.bnds))


def _write_variants(c: _Ctx, sources) -> dict:
    """Every quantized format the sources name, written once into ``<run>/quantized/<fmt>``."""
    fmts = sorted({s.quant for s in sources if s.quant != "none"})
    out = {}
    for f in fmts:
        rec = write_quantized(c.path, quantized_path(c.rd.root, f), f, c.sha)
        out[f] = dict(rec, path=str(quantized_path(c.rd.root, f)))
    return out


def _run_source(c: _Ctx, src, qrec: dict | None) -> SourceData:
    """Capture one source, train its drafters, and run the engine-side checks while its engine
    is up (vLLM: serve the reference's and its own drafter; HF: the simulator on that target)."""
    path = qrec["path"] if qrec else str(c.path)
    n_gen = c.p.eval_max_new_tokens + c.p.k
    args = (c.samples, c.prompts, list(c.bnds), c.all_b, n_gen)
    t0 = time.time()
    if src.engine == "hf":
        load = load_quantized_hf if qrec else models.load_target
        model = c.ref if src.key == REFERENCE else load(path, src.dtype, c.device)[0]
        data = capture_hf(model, src, *args)
        c.timed("capture", t0)
        _train_source(c, data)
        t1 = time.time()
        c.checks[src.key] = _hf_simulator_check(c, model, data)
        c.timed("checks", t1)
        return data
    from eagle3nb.engines.vllm_helpers import start_vllm

    with start_vllm(c.p, path, src.dtype, c.rd.root) as client:
        data = capture_vllm(client, src, *args)
        c.timed("capture", t0)
        _train_source(c, data)
        t1 = time.time()
        if c.p.drift_vllm_serve:
            c.checks[src.key] = _vllm_serve_check(c, client, data)
        c.timed("checks", t1)
    return data


def _train_source(c: _Ctx, data: SourceData) -> None:
    """One drafter per seed on ``data``'s train states (in memory; checkpoints under
    ``<run>/drift/train/<source>-seed<s>``, so a rerun resumes)."""
    p = c.p
    cfg = TrainConfig(
        draft_vocab_size=p.draft_vocab_size,
        draft_num_heads=p.draft_num_heads,
        draft_num_kv_heads=p.draft_num_kv_heads,
        draft_intermediate_size=p.draft_intermediate_size,
        ttt_steps=p.ttt_steps,
        batch_size=p.batch_size,
        max_steps=p.drift_train_steps,
        lr=p.lr,
        warmup_steps=min(p.warmup_steps, p.drift_train_steps - 1),
        checkpoint_every=p.drift_train_steps,
        log_every=p.drift_train_steps,
        eval_every=0,
        export_from="last",
    )
    t0 = time.time()
    store = StateStore(data.train, c.bnds)
    name = data.source.key.replace(":", "-")
    out = []
    for s in p.drift_seeds:
        cs = replace(cfg, seed=s)
        # one folder per config and data: a rerun resumes it, other settings train anew
        tag = hashlib.sha256(f"{cs.identity()}{store.fingerprint()}".encode()).hexdigest()[:10]
        folder = c.out / "train" / f"{name}-seed{s}-{tag}"
        d, _ = train_drafter(store, c.ref, cs, folder, None, None, (), stream=None)
        out.append(d.eval())
    c.drafters[data.source.key] = out
    c.timed("train", t0)


def _export(c: _Ctx, key: str) -> str:
    """The first seed's drafter of source ``key`` exported for vLLM (``<run>/drift/drafters``)."""
    from eagle3nb.drafter.export import export_drafter
    from eagle3nb.steps.shared.checks import target_info

    d = c.drafters[key][0]
    folder = c.out / "drafters" / key.replace(":", "-")
    man = provenance(
        c.p.drift_seeds[0],
        kind="eagle3nb-drafter",
        target=target_info(c.path, c.ref, c.rd.root),
        trained_on=key,
        aux_boundaries=list(c.bnds),
    )
    bos, eos = c.tok.bos_token_id, c.tok.eos_token_id
    return str(export_drafter(d, folder, list(c.bnds), c.n, man, bos, eos, None, c.p.k))


def _plain(c: _Ctx, h: dict) -> list[int]:
    """The serve source's plain greedy output of a held-out prompt, cut as a run with the stop
    tokens and ``eval_max_new_tokens`` cuts it."""
    g = h["full"][h["p"] :].tolist()[: c.p.eval_max_new_tokens]
    for i, t in enumerate(g):
        if t in c.stops:
            return g[: i + 1]
    return g


def _vllm_serve_check(c: _Ctx, client, data: SourceData) -> dict:
    """vLLM serves the reference's drafter and this source's own (first seed) on this source's
    target: its own counters, and its output against its own plain greedy output."""
    res = {}
    for key in dict.fromkeys([REFERENCE, data.source.key]):
        r = client.serve_acceptance(
            _export(c, key), c.prompts, c.p.k, c.p.eval_max_new_tokens, sorted(c.stops)
        )
        plain = [_plain(c, h) for h in data.heldout]
        res[key] = {
            "engine": f"vllm {data.engine['version']} (its own EAGLE-3 serving and counters)",
            "tau": round(r["tau"], 4),
            "a1": round(r["per_position_acceptance"][0], 4),
            "per_position_acceptance": [round(a, 4) for a in r["per_position_acceptance"]],
            "num_drafts": r["num_drafts"],
            "greedy_mismatches_vs_own_plain": sum(
                list(a) != list(b) for a, b in zip(r["outputs"], plain)
            ),
        }
    return {"served_by": "vllm", "drafters": res}


def _hf_simulator_check(c: _Ctx, model, data: SourceData) -> dict:
    """The simulator over this HF source's target with its own first drafter (a copy in the
    target's dtype): output against that target's plain greedy output, and its tau next to the
    states-based one."""
    from eagle3nb.drafter.acceptance import evaluate_acceptance

    dtype = next(model.parameters()).dtype  # a bfloat16 target feeds bfloat16 states
    d = copy.deepcopy(c.drafters[data.source.key][0]).to(model.device, dtype)
    r = evaluate_acceptance(
        model, d, c.prompts, list(c.bnds), c.p.k, c.p.eval_max_new_tokens, sorted(c.stops)
    )
    return {
        "served_by": "eagle3nb simulator on this hf-transformers target",
        "drafters": {
            data.source.key: {
                "tau": round(r["tau"], 4),
                "a1": round(r["per_position_acceptance"][0], 4),
                "greedy_mismatches_vs_own_plain": len(r["greedy_mismatches"]),
            }
        },
    }


def cell(c: _Ctx, drafter, data: SourceData, fed: list[int]) -> dict:
    """tau and a_i of ``drafter`` fed boundaries ``fed`` of ``data``'s held-out states."""
    pos = []
    dev = next(drafter.parameters()).device
    for h in data.heldout:
        n_out = len(_plain(c, h))
        aux = torch.cat([h["states"][b] for b in fed], dim=-1).to(dev)
        m = accepted_from_states(drafter, h["full"].to(dev), aux, h["p"], c.p.k, n_out)
        pos.append({"m": m, "n_out": n_out})
    return sweep_from_positions(pos, c.p.k)[c.p.k]


def _evaluate_all(c: _Ctx, data: dict) -> dict:
    """``{(row, col): [summary per seed]}``: every source's drafters on every source, and the
    reference's drafters fed the offset boundaries (row :data:`OFFSET_ROW`)."""
    cells = {}
    for col, d in data.items():
        for row, ds in c.drafters.items():
            cells[(row, col)] = [cell(c, x, d, list(c.bnds)) for x in ds]
        if c.moved:
            cells[(OFFSET_ROW, col)] = [cell(c, x, d, c.moved) for x in c.drafters[REFERENCE]]
    return cells


def _source_block(d: SourceData, qrec: dict | None) -> dict:
    q = {k: v for k, v in (qrec or {}).items() if k != "config_quantization"} or None
    return {
        "key": d.source.key,
        "label": d.source.label,
        "engine": d.engine,
        "quantization": q,
        "capture_seconds": d.seconds,
    }


def _budget(c: _Ctx) -> dict:
    p = c.p
    return {
        "train_samples": len(c.samples),
        "train_tokens": sum(len(s[1]) for s in c.samples),
        "steps_per_drafter": p.drift_train_steps,
        "batch_size": p.batch_size,
        "seeds": list(p.drift_seeds),
        "heldout_prompts": len(c.prompts),
        "k": p.k,
        "max_new_tokens": p.eval_max_new_tokens,
    }


def _check_lines(b: dict) -> list[str]:
    """metrics.json["checks"]["05_drift"]."""
    lines = []
    for s in b["sources"]:
        if s["key"] != REFERENCE:
            lg = b["drift"][s["key"]]["logits"]
            lines.append(
                f"{s['label']}: logits vs float32 HF: relative error {lg['relative_error']}, "
                f"top-1 agreement {lg['top1_agreement']}"
            )
    for key, ch in b["checks"].items():
        for dk, r in ch["drafters"].items():
            lines.append(
                f"{ch['served_by']} on {key}, drafter trained on {dk}: output vs its own plain "
                f"greedy: {r['greedy_mismatches_vs_own_plain']} mismatches"
            )
    lines += b["matrix"]["diagonal"]["lines"]
    return lines
