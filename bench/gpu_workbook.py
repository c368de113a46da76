"""The workbook and its engine code paths on a GPU, each number next to its baseline measured in
the same run (issue 33, items 3 and 4); one JSON per stage in ``--out``, rewritten as it goes.

    python bench/gpu_workbook.py --stages env,boundaries,default --out DIR --time-budget-s 520
    python bench/gpu_workbook.py --stages env,shape:llama-3.1-8b,shape:qwen3-moe --out DIR
    python bench/gpu_workbook.py --cpu --stages env,boundaries,shape:tiny --out DIR   # plumbing

Stages (each in try/except: an error is written into its JSON and the next stage runs; a stage
whose estimate exceeds the time left is skipped, saying so):

- ``env``: device, versions (torch, vllm, transformers), git commit, measured copy bandwidth and
  bf16 matmul rate, the disk's write rate (1 GiB, fsync) where datasets are written.
- ``boundaries``: the default target (stories260K-hd32) captured by vLLM (the notebooks'
  ``EngineClient``, in-process on the GPU) at vLLM ids [1, 2, 4] + final, float32 and bfloat16,
  every slot against HF's states at every boundary on the same device (relative error): each
  slot must name the same boundary as on CPU (id L = boundary L, final = N).
- ``default``: ``python -m eagle3nb.run params/gpu.yaml`` (papermill, the notebooks) and its
  metrics.json next to the CPU reference numbers (:data:`CPU_REFERENCE`), with the tolerances
  of :func:`default_checks`.
- ``shape:<name>`` (``llama-3.1-8b``, ``qwen3-moe``; ``tiny`` for ``--cpu``): a random-weight
  target of that shape (bench/real_shape.py, no weights written: vLLM ``load_format=dummy``, HF
  ``from_config`` on the device; the two hold different random weights, so only speeds are
  compared) through bench/gpu_engines.py: capture vs plain prefill vs HF hooks vs disk, vLLM
  vs HF generation, served tokens/s with and without a drafter at each batch size, CUDA graphs
  off and on, engine start times, kernel tables.
- ``workbook:<name>``: the whole workbook (``eagle3nb.run`` on params/gpu.yaml, shrunk) on a
  random-weight folder of that shape written to disk (bf16 safetensors, timed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

# the default job on CPU (docs/results.md, 2026-12-04): held-out tau of
# the simulator = vLLM-served = SGLang-served; the layer offset; vLLM served on the H200 vs CPU on
# the same drafter and 40 prompts (../shared/reference/gpu_engines_h200.md)
CPU_REFERENCE = {
    "tau_trained": 3.9507,
    "tau_offset": 2.9666,
    "boundaries": [1, 2, 4],
    "h200_vllm_served_tau_same_drafter": {"gpu": 4.2098, "cpu": 4.2015, "prompts": 40},
}
TAU_TOLERANCE = 0.15  # |GPU - CPU| simulator tau: other data (vLLM GPU greedy) and GPU kernels
SERVED_TOLERANCE = 0.02  # |vLLM served - simulator| / simulator on the same GPU run
ESTIMATE_S = {"env": 20, "boundaries": 150, "default": 420, "shape": 300, "workbook": 420}


def log(msg: str) -> None:
    print(f"[gpu_workbook {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for d in ("torch", "transformers", "vllm", "tokenizers", "safetensors", "papermill"):
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = None
    out["cuda"] = torch.version.cuda
    try:
        out["commit"] = (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or None
        )
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "eagle3nb",
            "bench", "params"], capture_output=True, text=True).stdout.strip()  # fmt: skip
        out["dirty"] = bool(dirty)
    except OSError:
        out["commit"] = None
    out["code_sha256"] = code_sha256()
    return out


def code_sha256() -> str:
    """sha256 over the code this bench runs (eagle3nb/**/*.py, bench/*.py, bench/*.sh,
    params/*.yaml: relative path and bytes, sorted), so a JSON names its code where the git
    metadata beside the files is not the tree's (the device tool's copy carries the session's first
    commit): ``python -c "import sys; sys.path.insert(0, 'bench'); import gpu_workbook;
    print(gpu_workbook.code_sha256())"`` in a checkout gives the same digest for the same files."""
    import hashlib

    h = hashlib.sha256()
    files = [*ROOT.glob("eagle3nb/**/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("bench/*.sh"),
        *ROOT.glob("params/*.yaml")]  # fmt: skip
    for f in sorted(files):
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def device_info(dev: str) -> dict:
    if not dev.startswith("cuda"):
        return {"device": "cpu", "name": platform.processor() or platform.machine()}
    pr = torch.cuda.get_device_properties(0)
    return {"device": dev, "name": pr.name, "sms": pr.multi_processor_count,
        "mem_gib": round(pr.total_memory / 2**30, 1), "capability": f"{pr.major}.{pr.minor}"}  # fmt: skip


# ---- stages -------------------------------------------------------------------------------
def stage_env(a) -> dict:
    res = {"device": device_info(a.device), "float32_matmul": torch.get_float32_matmul_precision()}
    if a.device.startswith("cuda"):
        x = torch.empty(2**30 // 2, dtype=torch.bfloat16, device="cuda")  # 1 GiB
        y = torch.empty_like(x)
        m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        for _ in range(3):
            y.copy_(x)
            m @ m
        ev[0].record()
        for _ in range(10):
            y.copy_(x)
        ev[1].record()
        for _ in range(10):
            m @ m
        ev[2].record()
        torch.cuda.synchronize()
        res["copy_gb_per_s"] = round(10 * 2 * 2**30 / (ev[0].elapsed_time(ev[1]) / 1e3) / 1e9, 1)
        res["bf16_matmul_tflops"] = round(
            10 * 2 * 8192**3 / (ev[1].elapsed_time(ev[2]) / 1e3) / 1e12, 1
        )
        del x, y, m
        torch.cuda.empty_cache()
    from writer import disk_write_seconds  # bench/writer.py: the writer bench's disk baseline

    Path(a.work).mkdir(parents=True, exist_ok=True)
    secs = disk_write_seconds(Path(a.work), 1, 2**30)
    res["disk_write"] = {"path": str(Path(a.work)), "bytes": 2**30, "seconds": round(secs, 3),
        "bytes_per_s": round(2**30 / secs, 1), "how": "16 x 64 MiB random, fsync"}  # fmt: skip
    return res


def stage_boundaries(a) -> dict:
    from eagle3nb.engines.client import EngineClient
    from eagle3nb.target import models
    from eagle3nb.boundaries.alignment import alignment_matrix, tolerance
    from eagle3nb.target.capture import reference_states

    path = models.resolve_model("stories260K-hd32")
    probe = [1] + list(range(20, 60))  # 41 tokens
    n = 5
    out = {"model": str(path), "vllm_ids": [1, 2, 4], "probe_tokens": len(probe)}
    for key, dtype, ids, eager in BOUNDARY_RUNS:
        if not a.device.startswith("cuda") and not eager:
            continue  # the CPU plumbing run builds eager engines only
        t0 = time.perf_counter()
        c = EngineClient("vllm", path, dtype, a.vllm_options(eager=eager, tiny=True),
            python=a.vllm_python, param="vllm_python")  # fmt: skip
        try:
            got = c.capture([probe], ids)[0]
            start_s = round(time.perf_counter() - t0, 2)
            info = c.info(live=True)
        finally:
            c.close()
        model = models.load_target(path, dtype, a.device)[0]
        ref = reference_states(model, probe)
        del model
        cap = torch.cat([got["aux"], got["final"]], dim=1)
        err, bnds = alignment_matrix(cap.float(), ref, len(ids) + 1)
        slots = []
        for i, want in enumerate(ids + [n]):
            row = err[i].tolist()
            best = int(err[i].argmin())
            other = min(e for j, e in enumerate(row) if j != best)
            slots.append({"slot": i, "cpu_boundary": want, "gpu_boundary": bnds[best],
                "error": row[best], "next_error": other})  # fmt: skip
        tol = tolerance(dtype, a.device)
        out[key] = {
            "vllm_ids": ids,
            "enforce_eager": eager,
            "slots": slots,
            "same_as_cpu": all(s["cpu_boundary"] == s["gpu_boundary"] for s in slots),
            "max_error": max(s["error"] for s in slots),
            "tolerance": tol,
            "within_tolerance": all(s["error"] <= tol for s in slots),
            "engine_start_plus_capture_s": start_s,
            "engine": {
                k: info.get(k)
                for k in (
                    "engine_version",
                    "device",
                    "attention_backend",
                    "hidden_states_transport",
                )
            },  # fmt: skip
            "float32_matmul_after_engine": torch.get_float32_matmul_precision(),
        }
        log(f"boundaries {key}: same as CPU {out[key]['same_as_cpu']}, max rel error "
            f"{out[key]['max_error']:.2e} (tolerance {tol:g}), start {start_s} s")  # fmt: skip
    return out


# (key, dtype, vLLM ids, enforce_eager): the default's ids in both dtypes, then the layer-offset
# copy's ids [0, 1, 3] (04's "layer offset" row) with CUDA graphs off and on: vLLM 0.26.0 served
# that copy at tau 1.8655 on the H200 against 2.9951 simulated (equal on CPU), and id 0 is the one
# state vLLM keeps without a new tensor (`_maybe_add_hidden_state`: residual None at layer 0)
BOUNDARY_RUNS = [
    ("float32", "float32", [1, 2, 4], True),
    ("bfloat16", "bfloat16", [1, 2, 4], True),
    ("float32_offset_ids_eager", "float32", [0, 1, 3], True),
    ("float32_offset_ids_graphs", "float32", [0, 1, 3], False),
]


def _run_job(a, params: str, sets: dict, timeout: float) -> tuple[int, Path, list[str]]:
    cmd = [sys.executable, "-m", "eagle3nb.run", params]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    log(" ".join(cmd[1:]))
    lines: list[str] = []
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)  # fmt: skip
    t0 = time.time()
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith(("[eagle3nb]", "[train]", "[eval]", "eagle3nb:", "run finished")):
            print("   " + line.rstrip(), flush=True)
        if time.time() - t0 > timeout:
            os.killpg(proc.pid, 15)
            lines.append(f"[gpu_workbook] killed after {timeout:.0f} s")
            break
    rc = proc.wait()
    return rc, Path(sets["outputs_dir"]) / sets["run_name"], lines


def default_checks(m: dict) -> dict:
    """The GPU run's numbers against :data:`CPU_REFERENCE` (None where the run has no value)."""
    ev = m.get("eval", {})
    tau = ev.get("tau", {})
    tr, off = tau.get("trained"), tau.get("trained, layer offset")
    served = next((v for k, v in tau.items() if k.startswith("trained, served by vLLM")), None)
    al = m.get("alignment", {}).get("vllm", {})
    return {
        "tau_trained": tr,
        "tau_trained_minus_cpu": None if tr is None else round(tr - CPU_REFERENCE["tau_trained"], 4),
        "tau_within_tolerance": None if tr is None
        else abs(tr - CPU_REFERENCE["tau_trained"]) <= TAU_TOLERANCE,
        "tau_tolerance": TAU_TOLERANCE,
        "tau_offset": off,
        "tau_vllm_served": served,
        "served_vs_simulator_rel": None if served is None or not tr else round(abs(served - tr) / tr, 5),
        "served_within_tolerance": None if served is None or not tr
        else abs(served - tr) / tr <= SERVED_TOLERANCE,
        "served_tolerance": SERVED_TOLERANCE,
        "boundaries_trained": ev.get("trained_boundaries"),
        "same_boundaries_as_cpu": ev.get("trained_boundaries") == CPU_REFERENCE["boundaries"],
        "vllm_alignment": al,
        "greedy_mismatches": ev.get("greedy_mismatches"),
    }  # fmt: skip


def _pick(m: dict) -> dict:
    """The parts of the run's metrics.json this bench reports."""
    eng = m.get("engines", {}).get("vllm", {})
    gen = m.get("generate", {})
    return {
        "timing": m.get("timing"),
        "generate": {
            k: gen.get(k)
            for k in (
                "engine",
                "engine_version",
                "tokens_per_s",
                "generated_tokens",
                "speed_by_engine",
            )
        },  # fmt: skip
        "vllm_speed_02a": eng,
        "hf_capture_speed_02b": m.get("extract", {}).get("capture_speed"),
        "engine_drift": m.get("engine_drift"),
        "twin_check_vllm": m.get("twin_check", {}).get("vllm"),
        "served_table": (m.get("eval", {}).get("served") or {}).get("table"),
        "served_by_vllm": m.get("eval", {}).get("served_by", {}).get("vllm"),
        "k_sweep": m.get("eval", {}).get("k_sweep"),
    }


def stage_default(a) -> dict:
    od = Path(a.work) / "runs"
    sets = {"outputs_dir": str(od), "run_name": "gpu", **a.default_sets}
    rc, run, lines = _run_job(a, "params/gpu.yaml", sets, a.left() - 15)
    res = {"rc": rc, "run": str(run), "sets": sets, "cpu_reference": CPU_REFERENCE,
        "tail": lines[-60:] if rc else lines[-8:]}  # fmt: skip
    mf = run / "metrics.json"
    if mf.is_file():
        m = json.loads(mf.read_text())
        res["checks"] = default_checks(m)
        res["metrics"] = _pick(m)
    return res


def stage_shape(a, name: str) -> dict:
    """``name``: a shape of :data:`real_shape.SHAPES` (or ``tiny``), optionally ``/part+part``
    of vllm, serve, hf (default all three) so that a 10-minute device call holds one part."""
    import gpu_engines
    from real_shape import SHAPES, llama31_8b_config, write_target

    from eagle3nb.boundaries import conventions

    name, _, which = name.partition("/")
    which = which.split("+") if which else ["vllm", "serve", "hf"]

    if name == "tiny":  # CPU plumbing: Llama-3.1's config at tiny width (head_dim 32 for CPU vLLM)
        cfg = llama31_8b_config(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1024,
            bos_token_id=1000, eos_token_id=1001)  # fmt: skip
    else:
        cfg = SHAPES[name]()
    n = cfg["num_hidden_layers"]
    _, bnds = conventions.aux_ids_and_boundaries("sglang", None, n)  # the default low/mid/high
    folder = write_target(cfg, Path(a.work) / "models" / name, weights="none")
    res = {"shape": name, "config": cfg, "boundaries": bnds, "dtype": a.dtype,
        "weights": "random: vLLM load_format=dummy, HF from_config (different weights)",
        "prompts": "random token ids"}  # fmt: skip
    out = Path(a.work) / "shape" / name
    for part, fn in (("vllm", lambda: gpu_engines.vllm_part(a, folder, cfg, bnds, out)),
                     ("serve", lambda: gpu_engines.serve_part(a, folder, cfg, bnds, out)),
                     ("hf", lambda: gpu_engines.hf_part(a, cfg, bnds))):  # fmt: skip
        if part not in which:
            continue
        if a.left() < 30:
            res[part] = {"skipped": f"time budget: {a.left():.0f} s left"}
            continue
        t0 = time.perf_counter()
        try:
            res[part] = fn()
        except Exception as e:  # noqa: BLE001
            res[part] = {
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-4000:],
            }
        res[part]["wall_s"] = round(time.perf_counter() - t0, 1)
        log(
            f"shape {name} {part}: {res[part]['wall_s']} s"
            + (" ERROR" if "error" in res[part] else "")
        )
        a.write(a.stem, res)  # keep what is done
    return res


def stage_workbook(a, name: str) -> dict:
    from real_shape import SHAPES

    cfg = SHAPES[name]()
    from real_shape import write_target

    t0 = time.perf_counter()
    folder = write_target(cfg, Path(a.work) / "models" / f"{name}-weights", "random", a.device)
    wsecs = time.perf_counter() - t0
    nbytes = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    sets = {"outputs_dir": str(Path(a.work) / "runs"), "run_name": f"wb-{name}",
        "model": str(folder), "dtype": "bfloat16", **WORKBOOK_SETS, **a.default_sets}  # fmt: skip
    rc, run, lines = _run_job(a, "params/gpu.yaml", sets, a.left() - 15)
    res = {"weights_written": {"bytes": nbytes, "seconds": round(wsecs, 1)}, "rc": rc,
        "sets": sets, "tail": lines[-60:] if rc else lines[-8:]}  # fmt: skip
    mf = run / "metrics.json"
    if mf.is_file():
        res["metrics"] = _pick(json.loads(mf.read_text()))
    return res


# the workbook on a real shape, shrunk to fit a call: 32 prompts x 64 tokens, 30 training steps of
# an 8B-shaped drafter (draft vocab 32000), 8 held-out prompts served by vLLM only (no float32 copy)
WORKBOOK_SETS = {
    "max_train_prompts": 32, "max_new_tokens": 64, "sampled_continuations": 0,
    "sampled_prefix_tokens": 0, "generate_speed_engines": [], "drift_both_dtypes": False,
    "drift_samples": 0, "draft_vocab_size": 32000, "draft_num_heads": 0, "draft_num_kv_heads": 0,
    "draft_intermediate_size": 0, "max_steps": 30, "eval_every": 0, "precision": "bf16-mixed",
    "max_eval_prompts": 8, "eval_max_new_tokens": 64, "eval_engines": ["vllm"],
    "eval_dataset": None, "baselines": False, "k_sweep": False, "eval_batch_sizes": [1, 8],
    "vllm_options": {"max_model_len": 4096, "enforce_eager": True,
        "llm_kwargs": {"gpu_memory_utilization": 0.45}},
}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--stages", default="env,boundaries,default")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_workbook"))
    ap.add_argument(
        "--work", default=None, help="run folders, models, datasets (default OUT/../work)"
    )
    ap.add_argument("--time-budget-s", type=float, default=520)
    ap.add_argument("--cpu", action="store_true", help="plumbing on CPU with the CPU vLLM venv")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--sample-len", type=int, default=None)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--graphs", default="off,on")
    a = ap.parse_args(argv)
    cpu = a.cpu or not torch.cuda.is_available()
    from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS

    a.device = "cpu" if cpu else "cuda"
    a.vllm_python = DEFAULT_ENGINE_PYTHONS["vllm"] if cpu else ""
    a.dtype = a.dtype or ("float32" if cpu else "bfloat16")
    a.samples = a.samples or (16 if cpu else 256)
    a.sample_len = a.sample_len or (64 if cpu else 1024)
    a.capture_batch, a.hf_batch = 32, (8 if cpu else 16)
    a.gen_prompts, a.prompt_len = (8, 32) if cpu else (64, 128)
    a.gen_tokens, a.serve_tokens, a.hf_gen_batch = (16, 16, 8) if cpu else (128, 128, 64)
    a.k, a.draft_vocab = 5, (256 if cpu else 32000)
    a.batch_sizes = [int(x) for x in a.batch_sizes.split(",")]
    if cpu:  # plumbing: two sizes, 2 x 4 prompts served
        a.batch_sizes = a.batch_sizes[:1] + [4]
    a.graphs = [g == "on" for g in a.graphs.split(",")] if not cpu else [False]
    a.default_sets = {}
    if cpu:  # plumbing: params_files' shrunk sizes, the CPU vLLM venv
        import yaml
        from params_files import shrink

        a.default_sets = {**shrink(yaml.safe_load((ROOT / "params" / "gpu.yaml").read_text())),
            "device": "cpu", "vllm_python": a.vllm_python, "max_train_prompts": 8}  # fmt: skip

    def vllm_options(eager: bool, tiny: bool = False) -> dict:
        if cpu:
            return {"max_model_len": 512, "enforce_eager": True,
                **({} if tiny else {"llm_kwargs": {"load_format": "dummy"}})}  # fmt: skip
        kw = {"gpu_memory_utilization": 0.3 if tiny else 0.6}
        if not tiny:
            kw["load_format"] = "dummy"
        return {"max_model_len": 512 if tiny else 4096, "enforce_eager": eager,
            "max_num_seqs": max(a.batch_sizes), "llm_kwargs": kw}  # fmt: skip

    a.vllm_options = vllm_options
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    a.work = a.work or str(out.parent / "work")
    Path(a.work).mkdir(parents=True, exist_ok=True)
    t_end = time.time() + a.time_budget_s
    a.left = lambda: t_end - time.time()
    head = {"versions": versions(), "device": device_info(a.device), "argv": sys.argv[1:],
        "env": {k: os.environ.get(k) for k in ("PYTHONPATH", "VLLM_USE_FLASHINFER_SAMPLER")}}  # fmt: skip

    def write(stem: str, body: dict) -> None:
        (out / f"{stem}.json").write_text(
            json.dumps({**head, "stage": stem, **body}, indent=1, default=str)
        )

    a.write = write
    failed = []
    for st in [s for s in a.stages.split(",") if s]:
        kind, _, name = st.partition(":")
        stem = a.stem = st.replace(":", "_").replace("/", "_").replace("+", "_")
        if a.left() < ESTIMATE_S.get(kind, 60) * (0.3 if kind in ("shape", "default") else 1):
            write(
                stem,
                {
                    "skipped": f"time budget: {a.left():.0f} s left, estimate {ESTIMATE_S.get(kind)} s"
                },
            )
            log(f"{st}: skipped (time budget)")
            continue
        log(f"{st}: start ({a.left():.0f} s left)")
        t0 = time.perf_counter()
        try:
            fn = {"env": stage_env, "boundaries": stage_boundaries, "default": stage_default}.get(
                kind
            )
            body = (
                fn(a) if fn else {"shape": stage_shape, "workbook": stage_workbook}[kind](a, name)
            )
        except Exception as e:  # noqa: BLE001 (one stage failing keeps the others)
            body = {
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-4000:],
            }
            failed.append(st)
        body["wall_s"] = round(time.perf_counter() - t0, 1)
        write(stem, body)
        log(
            f"{st}: {'ERROR ' + body['error'][:300] if 'error' in body else 'done'} in {body['wall_s']} s"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
