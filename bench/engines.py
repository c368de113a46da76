"""Engine speed, same workload and same run for every engine: plain generation, prefill without
capture, and aux-state extraction (tokens/s), and the capture overhead ratio.

    PYTHONPATH=. .venv/bin/python bench/engines.py [--engines hf,vllm] [--dtype float32] \
        [--n-prompts 384] [--max-new-tokens 64] [--repeats 3] [--out bench/results/engines.json]

Workload: the first ``n_prompts`` train prompts of the default prompts file (completion mode), greedy
``max_new_tokens`` each; the samples for prefill and extraction are prompt + generated ids (what
02a/02b capture), at the default boundaries of the model (+ boundary N). vLLM and SGLang are timed
by the function 02a and 02b call in a run (:func:`eagle3nb.engines.speed.measure_speed`,
with the notebooks' settings: calls of 32, warm engines, vLLM's separate plain and capture engines
the fastest of 3 passes each, SGLang's two kinds alternating call by call on one engine); HF is the
median of ``repeats`` one-batch calls after a warm-up. Engine starts are excluded (reported apart).
``--random-target 8x1024`` benches a random-weight Llama of 8 layers x hidden 1024 instead
(the default target's config and tokenizer, head_dim 64, MLP 8/3 x hidden, seed 0; written once
under ``bench/results/``): a target where the forward's compute is not negligible next to the
hand-over of the captured states (issue 16 asks for the overhead on both).
Engines: ``hf`` (transformers, in this process, one batch), ``vllm`` (through the engine worker in its
venv), ``sglang`` when ``eagle3nb.engines.sglang_helpers`` is present (its loopback-only start). CPU threads
are whatever the machine gives; the load average is recorded because a shared machine skews them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from eagle3nb.text import chat
from eagle3nb.boundaries import conventions
from eagle3nb.target import models
from eagle3nb.target.capture import HFCaptureEngine
from eagle3nb.text.generation import generate_batch
from eagle3nb.manifest import atomic_write_json
from eagle3nb.params import RunParams
from eagle3nb.repo_paths import resolve_path
from eagle3nb.text.prompts import load_prompts, split_prompts


def _median_time(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up (engine start, lazy init)
    ts, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def _numbers(gen_s, n_gen, pre_s, n_pre, ext_s, n_ext) -> dict:
    pre, ext = n_pre / pre_s, n_ext / ext_s
    return {
        "generate_tokens_per_s": round(n_gen / gen_s, 1),
        "generated_tokens": n_gen,
        "prefill_tokens_per_s_without_capture": round(pre, 1),
        "extract_tokens_per_s": round(ext, 1),
        "capture_overhead_ratio": round(pre / ext, 3),
        "sample_tokens": n_pre,
    }


def bench_hf(model, prompts, samples, ids_hf, eos, max_new, repeats) -> dict:
    """HF transformers: one left-padded ``generate`` batch; one right-padded forward with and without
    the boundary hooks."""
    eng = HFCaptureEngine(model, "vllm", batch_size=len(samples))
    gen_s, outs = _median_time(lambda: generate_batch(model, prompts, max_new, eos), repeats)
    T = max(len(s) for s in samples)
    ids = torch.zeros(len(samples), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(samples):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        pre_s, _ = _median_time(
            lambda: model.model(input_ids=ids, attention_mask=mask, use_cache=False), repeats
        )
    ext_s, _ = _median_time(lambda: eng.capture(samples, ids_hf), repeats)
    n_tok = sum(len(s) for s in samples)
    return dict(
        _numbers(gen_s, sum(len(o) for o in outs), pre_s, n_tok, ext_s, n_tok),
        engine_version=__import__("transformers").__version__,
    )


def bench_client(client, prompts, samples, ids, eos, max_new, interleave: bool) -> dict:
    """An engine client (vLLM, SGLang) measured as 02a / 02b measure it in a run:
    :func:`eagle3nb.engines.speed.measure_speed` with the notebooks' settings (calls of 32;
    vLLM, whose plain and capture engines are separate: the fastest of ``PASS_REPEATS`` passes
    over ``SPEED_SAMPLES // PASS_REPEATS`` samples each; SGLang: plain requests on the running
    capture engine, alternating call by call with the captures over ``SPEED_SAMPLES``)."""
    from eagle3nb.engines.speed import measure_speed, speed_settings

    r = measure_speed(
        client, prompts, samples, max_new, eos, 0, lambda xs: client.capture(xs, ids),
        generate_kw={"on_capture_engine": True} if interleave else None, interleave=interleave,
        **speed_settings(interleave),
    )  # fmt: skip
    r.pop("dataset_pass_tokens_per_s", None)  # no dataset pass here
    return dict(r, engine_version=client.info()["engine_version"])


def random_target(spec: str, base: str, out_root: Path) -> Path:
    """A random-weight Llama (``LxH``: L layers, hidden H) from ``base``'s config and tokenizer,
    saved once to ``out_root/random-LxH`` (temp folder, then rename); returns the folder."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    L, H = (int(x) for x in spec.lower().split("x"))
    out = out_root / f"random-{L}x{H}"
    if (out / "config.json").is_file():
        return out
    src = models.resolve_model(base)
    cfg = AutoConfig.from_pretrained(src)
    cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim = L, H, 64
    cfg.num_attention_heads = cfg.num_key_value_heads = H // 64
    cfg.intermediate_size = (H * 8 // 3 + 63) // 64 * 64
    torch.manual_seed(0)
    tmp = out_root / f".random-{L}x{H}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tmp / f.name)
    tmp.rename(out)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--model", default="stories260K-hd32")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--n-prompts", type=int, default=384)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--vllm-python",
        default=None,
        help="vLLM venv python (default: the cached one; '' = in-process)",
    )
    ap.add_argument("--random-target", default="", help="LxH, e.g. 8x1024 (see the docstring)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "engines.json"))
    a = ap.parse_args(argv)
    if a.random_target:
        (REPO / "bench" / "results").mkdir(parents=True, exist_ok=True)
        a.model = str(random_target(a.random_target, a.model, REPO / "bench" / "results"))
    p = RunParams(model=a.model, dtype=a.dtype, vllm_python=a.vllm_python)
    model, tok, path = models.load_target(a.model, a.dtype)
    n = model.config.num_hidden_layers
    bnds = conventions.pick_default_boundaries(n)
    eos = models.stop_token_ids(model, tok)
    train, _ = split_prompts(load_prompts(resolve_path(p.prompts_file)), p.heldout_fraction, 0)
    prompts = [chat.encode_prompt(tok, t, "completion", None) for t in train[: a.n_prompts]]
    outs = generate_batch(model, prompts, a.max_new_tokens, eos)
    samples = [q + o for q, o in zip(prompts, outs)]
    res = {
        "workload": {
            "model": a.model,
            "dtype": a.dtype,
            "n_prompts": len(prompts),
            "max_new_tokens": a.max_new_tokens,
            "boundaries": bnds + [n],
            "repeats": a.repeats,
            "sample_tokens": sum(len(s) for s in samples),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_start": os.getloadavg(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "definitions": "hf: tokens/s = tokens / median seconds of one call over the whole workload (--repeats); vllm, sglang: eagle3nb.engines.speed.measure_speed as 02a/02b call it (each engine's ratio_is says how); generate: new tokens; prefill and extract: prompt + generated tokens of the samples timed; capture_overhead_ratio = prefill tokens/s without capture / extract tokens/s (same engine, same samples)",
        "engines": {},
    }
    for eng in a.engines.split(","):
        t0 = time.perf_counter()
        if eng == "hf":
            res["engines"]["hf-transformers"] = bench_hf(
                model,
                prompts,
                samples,
                conventions.get_convention("vllm").boundaries_to_ids(bnds, n),
                eos,
                a.max_new_tokens,
                a.repeats,
            )
        elif eng == "vllm":
            from eagle3nb.engines.vllm_helpers import start_vllm

            with start_vllm(p, path, a.dtype, REPO / "bench" / "results") as c:
                t_start = time.perf_counter() - t0
                r = bench_client(
                    c,
                    prompts,
                    samples,
                    conventions.get_convention("vllm").boundaries_to_ids(bnds, n),
                    eos,
                    a.max_new_tokens,
                    interleave=False,
                )
            res["engines"]["vllm"] = dict(r, worker_start_seconds=round(t_start, 1))
        elif eng == "sglang":
            from eagle3nb.engines.sglang_helpers import start_sglang

            with start_sglang(
                path,
                a.dtype,
                "cpu",
                0,
                None,
                REPO / "bench" / "results",
                model.config.max_position_embeddings,
            ) as c:
                r = bench_client(
                    c,
                    prompts,
                    samples,
                    conventions.get_convention("sglang").boundaries_to_ids(bnds, n),
                    eos,
                    a.max_new_tokens,
                    interleave=True,
                )
            res["engines"]["sglang"] = r
        else:
            raise SystemExit(f"--engines: unknown engine {eng!r}; use hf, vllm, sglang")
        res["engines"][list(res["engines"])[-1]]["wall_seconds_incl_start"] = round(
            time.perf_counter() - t0, 1
        )
        print(eng, json.dumps(res["engines"][list(res["engines"])[-1]]), flush=True)
    res["machine"]["loadavg_end"] = os.getloadavg()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, res)
    print("wrote", out)
    return res


if __name__ == "__main__":
    main()
