"""An engine version's layer-id rule for a class no version file holds, measured on the running
engine: it captures a tiny random twin of the target at the id sets of
:func:`eagle3nb.boundaries.measured.probe_plan` (each in the worker, ``capture_model``: no new
process), every slot is named by the HF boundary it equals (as the twin proof does,
:mod:`eagle3nb.engines.twin_check`), and :func:`eagle3nb.boundaries.measured.derive_rule` turns
the matrix into a rule, registered for the run and kept per user
(:func:`eagle3nb.boundaries.rules.register_measured`). An id set the engine refuses is recorded as
refused with the engine's message.

Imported on the notebook's side (it needs transformers and the rest of ``eagle3nb``).
"""

from __future__ import annotations

import datetime
import hashlib
import re
from pathlib import Path
from typing import Callable, Sequence

from eagle3nb.boundaries.alignment import tolerance
from eagle3nb.boundaries.measured import derive_rule, probe_plan
from eagle3nb.boundaries.rules import EngineRule, measured_rule, register_measured, table_rule
from eagle3nb.target import models
from eagle3nb.target.twin import build_twin, probe_samples, twin_ids, twin_layers

__all__ = [
    "measure_rule",
    "engine_model_file",
    "measure_capture",
    "measure_options",
    "measure_facts",
    "rule_for_run",
    "measure_in_preflight",
    "RUNNER_TWIN_OPTIONS",
]

# SGLang's in-process ModelRunner (sglang_runner): one model load per twin, the probe sets applied
# between forwards (sglang_capture_ids); a KV pool for the twin's two short samples (16 + 9 tokens)
# instead of one sized from host memory
RUNNER_TWIN_OPTIONS = {"capture_route": "runner", "max_total_tokens": 1024}


def engine_model_file(engine: str, python: str | None, arch: str) -> dict:
    """The engine's model file for class ``arch`` in the venv of ``python`` and its sha256, found
    without starting the engine: vLLM's ``model_executor/models/registry.py`` maps the class to
    its module; SGLang's ``srt/models/*.py`` defining ``class <arch>(``. ``{"path", "sha256"}``,
    both None where not found (the record then says so)."""
    import sys

    root = Path(python or sys.executable).expanduser().parent.parent
    sp = sorted(root.glob("lib/python*/site-packages"))
    hit, site = None, None
    for site in sp:
        if engine == "vllm":
            reg = site / "vllm/model_executor/models/registry.py"
            if reg.is_file():
                m = re.search(rf'"{re.escape(arch)}":\s*\(\s*"(\w+)"', reg.read_text())
                f = site / f"vllm/model_executor/models/{m.group(1)}.py" if m else None
                hit = f if f is not None and f.is_file() else None
        elif engine == "sglang":
            pat = re.compile(rf"^class {re.escape(arch)}\(", re.M)
            for f in sorted((site / "sglang/srt/models").glob("*.py")):
                if pat.search(f.read_text(errors="replace")):
                    hit = f
                    break
        if hit is not None:
            break
    if hit is None:
        return {"path": None, "sha256": None}
    rel = hit.relative_to(site)
    return {"path": str(rel), "sha256": hashlib.sha256(hit.read_bytes()).hexdigest()}


def measure_rule(
    capture: Callable[[str, list[list[int]], list[int]], list[dict]],
    engine: str,
    version: str,
    target_path: str | Path,
    run_ids: Sequence[int],
    dtype: str,
    twin_dir: str | Path,
    seed: int = 0,
    device: str = "cpu",
    facts: dict | None = None,
    keep: bool = True,
) -> EngineRule:
    """Measure ``engine`` ``version``'s id rule for the target's class on its twin.

    Args:
        capture: ``(model_path, samples, ids) -> [{"aux": [T, n_ids*H]}, ...]`` (the engine's
            ``capture_model``); an exception is that id set refused (its message recorded).
        run_ids: the run's ids for this engine, on the target (asked of the twin too).
        dtype, device: the engine's (they set the naming tolerance,
            :func:`eagle3nb.boundaries.alignment.tolerance`).
        facts: further record fields (``torch``, ``model_file``, ``model_file_sha256``,
            ``capture_route``: :func:`measure_facts`).
        keep: also keep the rule per user (:mod:`eagle3nb.boundaries.measured_store`).

    Returns:
        The measured :class:`~eagle3nb.boundaries.rules.EngineRule` (``source`` ``"measured on a
        <n>-layer twin (<device>, <dtype>)"``, ``measured`` the record), registered for this run.

    Raises:
        ValueError: slots that cannot be named, a rule that is not one offset per id set, or one
            that disagrees with the version file's row (:func:`derive_rule`, ``check_against``).
    """
    from eagle3nb import __version__
    from eagle3nb.engines.twin_check import ENGINE_TOLERANCE, MIN_SEPARATION_FACTOR, _measure
    from eagle3nb.manifest import git_commit

    cfg = models.text_config(models.read_model_config(target_path))
    arch = models.target_arch(cfg, str(target_path))
    n = int(cfg["num_hidden_layers"])
    nt = twin_layers(n)
    tdir = build_twin(target_path, twin_dir, nt, seed, arch, models.MODEL_TYPE_ALIASES)
    tcfg = models.text_config(models.read_model_config(tdir))
    samples = probe_samples(int(tcfg["vocab_size"]), seed)
    tol = ENGINE_TOLERANCE.get((engine, arch), tolerance(dtype, device))
    probes = []
    for ids in probe_plan(nt, twin_ids(run_ids, n, nt)):
        try:
            got = capture(str(tdir), samples, ids)
        except Exception as e:  # noqa: BLE001 - the engine's refusal of this id set, recorded
            probes.append({"ids": ids, "error": f"{type(e).__name__}: {e}"[-2000:]})
            continue
        meas = _measure(got, samples, tdir, len(ids), tol)
        named = meas["separation"] >= MIN_SEPARATION_FACTOR * tol
        probes.append(
            {
                "ids": ids,
                "boundaries": [s["boundary"] if named else None for s in meas["slots"]],
                "errors": [round(float(s["error"]), 8) for s in meas["slots"]],
                "separation": meas["separation"],
            }
        )
    record = {
        "engine": engine,
        "version": version,
        "arch": arch,
        "device": device,
        "dtype": dtype,
        "tolerance": tol,
        "twin_config": str(Path(tdir) / "config.json"),
        "eagle3nb_commit": git_commit(),
        "eagle3nb_version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **(facts or {}),
    }
    rule = derive_rule(engine, version, arch, nt, probes, record)
    register_measured(rule, keep=keep)
    return rule


def measure_options(engine: str, route: str = "engine", device: str = "cpu") -> dict:
    """The engine options every probe capture runs with (over the client's own): the twin options
    (:data:`eagle3nb.engines.twin_check.TWIN_ENGINE_OPTIONS`); SGLang on ``route`` ``runner``
    also :data:`RUNNER_TWIN_OPTIONS`; vLLM on CUDA also ``enforce_eager: False``. Why the last:
    with CUDA graphs off vLLM captures boundary N, not boundary 0, at aux id 0 (measured on an
    H200 with vLLM 0.26.0, :mod:`eagle3nb.engines.vllm_eager`), so an eager measurement names
    no rule at all (id 0's set is not one offset) even for a run whose ids omit 0. The version
    files' rows describe the compiled engine and :func:`eagle3nb.engines.vllm_eager.refuse_id0`
    refuses id 0 for an eager run on top of them; a measured rule is taken the same way."""
    from eagle3nb.engines.twin_check import TWIN_ENGINE_OPTIONS

    opts = dict(TWIN_ENGINE_OPTIONS.get(engine) or {})
    if engine == "sglang" and route == "runner":
        opts.update(RUNNER_TWIN_OPTIONS)
    if engine == "vllm" and str(device).startswith("cuda"):
        opts["enforce_eager"] = False
    return opts


def measure_capture(client, engine: str, route: str = "engine", device: str = "cpu") -> Callable:
    """The ``capture`` a measurement calls: ``client.capture_model`` on the twin with
    :func:`measure_options` (``device``: the engine's). SGLang on ``route`` ``runner``: its
    in-process ModelRunner: one model load per twin, each id set applied to the loaded model
    between forwards, a set SGLang refuses raised there (:mod:`eagle3nb.engines.sglang_capture_ids`);
    ``engine`` (vLLM, SGLang's aux API): one engine build per id set."""
    opts = measure_options(engine, route, device)

    def capture(path, samples, ids):
        return client.capture_model(path, samples, ids, opts)

    return capture


def measure_facts(info: dict, python, arch: str, route: str | None = None) -> dict:
    """The record fields a measurement adds (:func:`measure_rule` ``facts``): ``torch``, the
    engine's ``model_file`` for ``arch`` and its ``model_file_sha256``
    (:func:`engine_model_file`), ``capture_route``: which path captured the twin (``route``,
    else the engine's own ``info()["capture_route"]``, else ``engine``), and ``capture_options``:
    the engine options of the probes (:func:`measure_options` on ``info()["device"]``)."""
    mf = engine_model_file(info["engine_name"], python, arch)
    route = route or info.get("capture_route") or "engine"
    return {
        "torch": info.get("torch_version"),
        "model_file": mf["path"],
        "model_file_sha256": mf["sha256"],
        "capture_route": route,
        "capture_options": measure_options(info["engine_name"], route, info.get("device", "cpu")),
    }


def rule_for_run(
    client, target_path, run_ids, dtype, twin_dir, seed=0, python=None, keep=True
) -> dict:
    """The id rule of the engine behind ``client`` for the target's class: its version file's row
    (``{"known_by": "read from source"}``), else a measured rule kept from an earlier run on the same
    engine build and capture route (same torch, model-file sha256 and route), else measured now on
    the running engine (:func:`measure_rule`, through the route the engine captures the run with:
    SGLang's in-process ModelRunner where ``sglang_options.capture_route`` is runner or the
    installed SGLang has no aux API, :func:`measure_capture`; ``keep`` False for a fake engine:
    never kept per user). Returns ``{"rule": EngineRule, "known_by", "measured_now"}``.

    Raises:
        ValueError: as :func:`measure_rule`.
    """
    info = client.info()
    engine, version = info["engine_name"], str(info["engine_version"]).split("+")[0]
    cfg = models.text_config(models.read_model_config(target_path))
    arch = models.target_arch(cfg, str(target_path))
    row = table_rule(engine, version, arch)
    if row is not None:
        return {"rule": row, "known_by": row.known_by, "measured_now": False}
    facts = measure_facts(info, python or getattr(client, "python", None), arch)
    kept = measured_rule(engine, version, arch)
    same = kept is not None and all(
        (kept.measured or {}).get(k) == v for k, v in facts.items() if k != "model_file"
    )
    if same:
        return {"rule": kept, "known_by": kept.known_by, "measured_now": False}
    device = info.get("device", "cpu")
    capture = measure_capture(client, engine, facts["capture_route"], device)
    rule = measure_rule(
        capture, engine, version, target_path, run_ids, dtype, twin_dir, seed, device, facts, keep
    )
    return {"rule": rule, "known_by": rule.known_by, "measured_now": True}


def measure_in_preflight(
    engine, python, target_path, run_ids, dtype, device, workdir, seed=0, options=None
):
    """Preflight's measurement for an engine version no file holds: start ``engine`` (``python``'s
    venv) on the target's twin, with ``options`` (SGLang: the run's ``sglang_options``, so its
    ``capture_route`` picks the path the run captures with), take :func:`rule_for_run` (a kept
    measurement of the same engine build and route, else measured now), close the engine. Returns
    as :func:`rule_for_run`.

    Raises:
        ValueError: as :func:`measure_rule`; whatever starting the engine raises.
    """
    from eagle3nb.engines.pool import open_engine
    from eagle3nb.engines.sglang_helpers import start_sglang

    work = Path(workdir)
    cfg = models.text_config(models.read_model_config(target_path))
    arch = models.target_arch(cfg, str(target_path))
    nt = twin_layers(int(cfg["num_hidden_layers"]))
    tdir = build_twin(target_path, work / "twin", nt, seed, arch, models.MODEL_TYPE_ALIASES)
    if engine == "sglang":
        client = start_sglang(tdir, dtype, device, seed, python, work, 256, options)
    else:
        client = open_engine(engine, tdir, dtype, python=python, workdir_parent=work)
    try:
        return rule_for_run(client, target_path, run_ids, dtype, work / "twin", seed, python)
    finally:
        client.close()
