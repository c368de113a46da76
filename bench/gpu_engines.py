"""Engine benches on a random-weight target of a real shape, through the functions the notebooks
call (used by ``bench/gpu_workbook.py``'s ``shape:<name>`` stages; each part returns a dict).

- :func:`vllm_part`: 02a's :func:`eagle3nb.engines.speed.measure_speed` (capture
  tokens/s through vLLM vs vLLM's plain prefill of the same samples in the same calls, and
  vLLM's generation tokens/s), the engine start times, a kernel table of one capture and one
  plain prefill call (``torch.profiler``, in-process engines only), and
  :func:`eagle3nb.dataset.write.write_dataset` (02a's writer) of the captured samples: tokens/s
  and bytes/s of capture + write, against the disk's own write rate (``env`` stage).
- :func:`serve_part`: 04's :func:`eagle3nb.steps.evaluate.served.serve_engine` serving a random
  drafter of the target's shape (tau near 1: this is the drafter's cost, not a speedup) and the
  same prompts without it, at each batch size, with CUDA graphs off (``enforce_eager``) and on.
- :func:`hf_part`: 02b's HF hooks (:func:`eagle3nb.steps.extract.sharded.capture_overhead`: plain decoder
  forward vs :class:`eagle3nb.target.capture.HFCaptureEngine`) and 01's HF generation
  (:func:`eagle3nb.text.generation.generate_batch`) on the HF model made from the same config.

Prompts and samples are random token ids (seeded); generation has no stop id, so every request
runs ``max_new_tokens``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

__all__ = ["random_ids", "vllm_part", "serve_part", "hf_part", "kernel_table"]


def random_ids(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``n`` lists of ``length`` token ids drawn uniformly from 256..vocab-1 (no byte ids)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(256, vocab, (n, length), generator=g).tolist()


def kernel_table(fn, rows: int = 15, sort: str | None = None) -> str:
    """``torch.profiler`` table of one call of ``fn`` in this process, top ``rows`` by ``sort``
    (default: CUDA time where there is a GPU, else CPU time; ``"self_cpu_time_total"`` shows the
    host's own work per op)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    key = sort or ("cuda_time_total" if torch.cuda.is_available() else "cpu_time_total")
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def python_profile(fn, rows: int = 25) -> str:
    """``cProfile`` of one call of ``fn``: the top ``rows`` Python functions by their own time
    (where host time goes that no torch op names: the engine's scheduler, the connector, copies
    made from Python)."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(rows)
    return buf.getvalue()


def _client(model_dir, dtype, options, python):
    from eagle3nb.engines.client import EngineClient

    return EngineClient("vllm", model_dir, dtype, options, python=python, param="vllm_python")


def _timed_start(client, fn) -> float:
    """Seconds of the first call that builds an engine configuration (start + one tiny request)."""
    t0 = time.perf_counter()
    fn()
    return round(time.perf_counter() - t0, 2)


def vllm_part(a, model_dir, cfg: dict, ids: list[int], out_dir: Path) -> dict:
    """See the module docstring. ``a``: the bench's arguments (dtype, sizes, vllm options)."""
    from eagle3nb.dataset.write import write_dataset
    from eagle3nb.engines.adapter import EngineCaptureEngine
    from eagle3nb.engines.speed import measure_speed

    V, n = cfg["vocab_size"], cfg["num_hidden_layers"]
    samples = random_ids(a.samples, a.sample_len, V, 1)
    prompts = random_ids(a.gen_prompts, a.prompt_len, V, 2)
    res: dict = {"samples": a.samples, "sample_len": a.sample_len, "vllm_ids": ids}
    client = _client(model_dir, a.dtype, a.vllm_options(eager=True), a.vllm_python)
    try:
        res["start_s"] = {
            "capture_engine_first": _timed_start(client, lambda: client.capture([samples[0]], ids))
        }
        speed = measure_speed(
            client, prompts, samples, a.gen_tokens, [], 0,
            lambda xs: client.capture(xs, ids), batch_size=a.capture_batch,
            generate_prompts=a.gen_prompts, speed_samples=a.samples, repeats=2,
        )  # fmt: skip
        res["measure_speed"] = speed
        res["capture_vs_plain_prefill"] = speed["capture_overhead_ratio"]
        res["capture_vs_plain_prefill_target"] = 1.3
        if client.python is None:  # in-process: the engine's kernels are in this profiler
            batch = samples[: a.capture_batch]
            res["kernels_plain_prefill"] = kernel_table(lambda: client.generate(batch, 1, [], 0.0))
            res["start_s"]["capture_engine_again"] = _timed_start(
                client, lambda: client.capture([samples[0]], ids)
            )
            res["kernels_capture"] = kernel_table(lambda: client.capture(batch, ids))
            # the host side of a capture call (7.8x plain on the 8-layer MoE shape, 2026-12-04)
            res["host_ops_capture"] = kernel_table(
                lambda: client.capture(batch, ids), 20, "self_cpu_time_total"
            )
            res["host_ops_plain_prefill"] = kernel_table(
                lambda: client.generate(batch, 1, [], 0.0), 20, "self_cpu_time_total"
            )
            res["python_capture"] = python_profile(lambda: client.capture(batch, ids))
        engine = EngineCaptureEngine(client, n, a.capture_batch)
        ds = out_dir / "dataset"
        shutil.rmtree(ds, ignore_errors=True)
        triples = [(i, s, [0] + [1] * (len(s) - 1)) for i, s in enumerate(samples)]
        man = {"target": {"name": Path(model_dir).name, "n_layers": n,
            "hidden_size": cfg["hidden_size"]}, "aux_boundaries": list(ids),
            "bench": "gpu_engines"}  # fmt: skip
        dt = getattr(torch, a.dtype)
        t0 = time.perf_counter()
        m = write_dataset(ds, triples, lambda xs: engine.capture(xs, ids), man, 64, dt)
        secs = time.perf_counter() - t0
        nbytes = sum(f.stat().st_size for f in ds.rglob("*") if f.is_file())
        res["dataset_write"] = {
            "what": "write_dataset (02a's writer): capture through vLLM + shards to disk",
            "seconds": round(secs, 3),
            "tokens_per_s": round(m["n_tokens"] / secs, 1),
            "bytes": nbytes,
            "bytes_per_s": round(nbytes / secs, 1),
            "path": str(ds),
        }
        shutil.rmtree(ds, ignore_errors=True)
        res["engine_info"] = client.info(live=True)
    finally:
        client.close()
    return res


def random_drafter(cfg: dict, bnds: list[int], out: Path, draft_vocab: int, k: int) -> Path:
    """A random EAGLE-3 drafter of the target's shape (one decoder layer, draft vocab
    ``draft_vocab``), exported by 03's :func:`eagle3nb.drafter.export.export_drafter` in bf16."""
    from eagle3nb.drafter.export import export_drafter
    from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
    from eagle3nb.drafter.vocab import build_draft_vocab
    from real_shape import _config_object

    torch.manual_seed(0)
    c = DrafterConfig.for_target(_config_object(cfg), draft_vocab, len(bnds))
    d = Eagle3Drafter(c)
    counts = torch.arange(cfg["vocab_size"]).flip(0)
    d.set_vocab(*build_draft_vocab(counts, draft_vocab))
    arch = cfg["architectures"][0]
    man = {"target": {"architecture": arch, "n_layers": cfg["num_hidden_layers"]}}
    d = d.to(torch.bfloat16).eval()
    return export_drafter(
        d, out, bnds, cfg["num_hidden_layers"], man, cfg["bos_token_id"], cfg["eos_token_id"],
        num_speculative_tokens=k,
    )  # fmt: skip


def serve_part(a, model_dir, cfg: dict, bnds: list[int], out_dir: Path) -> dict:
    """See the module docstring: one engine client per CUDA-graph setting."""
    from eagle3nb.steps.evaluate.served import serve_engine

    drafter = random_drafter(cfg, bnds, out_dir / "drafter", a.draft_vocab, a.k)
    # one full batch at the largest size (every size serves all prompts: batch size 1 serves them
    # one by one, the longest part)
    prompts = random_ids(max(a.batch_sizes), a.prompt_len, cfg["vocab_size"], 3)
    cats = ["random"] * len(prompts)
    res: dict = {"drafter": "random weights (tau near 1)", "k": a.k, "prompts": len(prompts),
        "max_new_tokens": a.serve_tokens, "prompt_len": a.prompt_len}  # fmt: skip
    for graphs in a.graphs:
        key = "cuda_graphs" if graphs else "eager"
        if a.left() < SERVE_ESTIMATE_S:
            res[key] = {"skipped": f"time budget: {a.left():.0f} s left, estimate "
                f"{SERVE_ESTIMATE_S} s"}  # fmt: skip
            continue
        client = _client(model_dir, a.dtype, a.vllm_options(eager=not graphs), a.vllm_python)
        try:
            t0 = time.perf_counter()
            runs, _ = serve_engine(
                client, "vllm", {"random": (str(drafter), [a.k], a.batch_sizes)}, prompts, cats,
                a.batch_sizes, a.serve_tokens, [],
            )  # fmt: skip
            res[key] = {
                "wall_s_incl_two_engine_starts": round(time.perf_counter() - t0, 1),
                "runs": [{x: r.get(x) for x in RUN_KEYS} for r in runs if r["category"] == "all"],
            }
        except Exception as e:  # noqa: BLE001 (one setting failing keeps the other's numbers)
            res[key] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
        finally:
            client.close()
    return res


SERVE_ESTIMATE_S = 200  # one CUDA-graph setting on the 8B shape: two engine starts + 3 sizes

RUN_KEYS = ("batch_size", "tau", "tokens_per_s", "plain_tokens_per_s", "speedup", "latency_s",
    "plain_latency_s", "greedy_mismatches", "cycles")  # fmt: skip


def hf_part(a, cfg: dict, bnds: list[int]) -> dict:
    """See the module docstring; the model is freed before returning."""
    from real_shape import hf_from_config

    from eagle3nb.steps.extract.sharded import capture_overhead
    from eagle3nb.target.capture import HFCaptureEngine
    from eagle3nb.text.generation import generate_batch

    t0 = time.perf_counter()
    model = hf_from_config(cfg, a.device, a.dtype, 0)
    res: dict = {"build_s": round(time.perf_counter() - t0, 2), "weights": "HF from_config"}
    try:
        V = cfg["vocab_size"]
        samples = [(i, s, None) for i, s in enumerate(random_ids(a.samples, a.sample_len, V, 1))]
        eng = HFCaptureEngine(model, "vllm", a.hf_batch)
        res["hooks"] = capture_overhead(model, eng, samples, bnds, max_samples=a.samples)
        prompts = random_ids(a.gen_prompts, a.prompt_len, V, 2)
        generate_batch(model, prompts[:2], 2, None)  # warm-up
        t0 = time.perf_counter()
        outs = []
        for i in range(0, len(prompts), a.hf_gen_batch):
            outs += generate_batch(model, prompts[i : i + a.hf_gen_batch], a.gen_tokens, None)
        secs = time.perf_counter() - t0
        n = sum(len(o) for o in outs)
        res["generate"] = {
            "what": "01's HF path (generate_batch), no stop id",
            "tokens": n,
            "seconds": round(secs, 3),
            "tokens_per_s": round(n / secs, 1),
            "batch": a.hf_gen_batch,
        }
        if torch.cuda.is_available():
            res["max_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    finally:
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return res
