"""The notebooks, headless through papermill on the smoke params (the ``smoke_run`` fixture of
tests/conftest.py, ``outputs/smoke``), checked via metrics.json."""

import json

import plotly.offline
import pytest
from testkit import requires_engine

from eagle3nb.drafter.export import load_drafter
from eagle3nb.params import RunParams, load_params
from eagle3nb.params.sync import declared_by
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.run import NOTEBOOKS as ALL_NOTEBOOKS

# every test here reads the smoke run (``smoke_run``), whose steps start both engines
pytestmark = [requires_engine("vllm"), requires_engine("sglang")]

# the smoke run leaves audit_drafter null, so eagle3nb.run skips 06_audit (tests/audit/ runs it)
NOTEBOOKS = [n for n in ALL_NOTEBOOKS if n != "06_audit"]


def test_run_leaves_every_artefact(smoke_run):
    r = smoke_run
    for nb in NOTEBOOKS:
        assert (r / "notebooks" / f"{nb}.ipynb").is_file()
    assert (r / "data" / "generated.jsonl").is_file() and (
        r / "data" / "generation_manifest.json"
    ).is_file()
    man = json.loads((r / "dataset" / "manifest.json").read_text())
    # aux states from SGLang's own model path; boundary N from HF, and the manifest says so
    assert (
        man["complete"]
        and man["engine"]["name"] == "sglang"
        and man["engine"]["version"] == "0.5.23"
        and man["engine"]["layer_ids"] == [0, 1, 3]
    )
    assert (
        man["final_state"]["engine"] == "hf-transformers"
        and man["final_state"]["check_vs_sglang_logprobs"]["ok"]
    )
    assert man["aux_boundaries"] == [1, 2, 4] and man["layer_ids"] == [0, 1, 3]
    for key in ("target", "dtype", "template", "seed", "git_commit", "eagle3nb_version"):
        assert key in man, key
    assert all(len(s["sha256"]) == 64 for s in man["shards"])
    js = r / "figures" / "plotly.min.js"  # one plotly.js for all figures of the run (offline)
    assert js.read_text() == plotly.offline.get_plotlyjs()
    for fig in (
        "hidden_states",
        "alignment",
        "engine_drift",
        "training",
        "acceptance",
        "quant_drift",
        "drift_matrix",
    ):
        html = (r / "figures" / f"{fig}.html").read_text()
        assert '<script charset="utf-8" src="plotly.min.js"></script>' in html, fig
    assert sum(f.stat().st_size for f in (r / "figures").iterdir()) < 8e6
    # boundary N (5) came from HF, not SGLang: no trace says otherwise
    hs = (r / "figures" / "hidden_states.html").read_text()
    assert "hf-transformers b=5" in hs and "sglang b=5" not in hs
    # no frozen progress bar (transformers' "Loading weights") in the headless notebooks
    for nb in NOTEBOOKS:
        assert "Loading weights" not in (r / "notebooks" / f"{nb}.ipynb").read_text(), nb
    d, cfg = load_drafter(r / "drafter")
    assert cfg["eagle3nb"]["aux_boundaries"] == [1, 2, 4]


def test_metrics(smoke_run):
    m = json.loads((smoke_run / "metrics.json").read_text())
    assert set(m) >= {"generate", "extract", "train", "eval", "timing"}
    e = m["eval"]
    assert e["greedy_mismatches"] == 0 and e["k"] == 5
    # what a new user sees first: the smoke defaults already rank the drafters (measured 1.50 >
    # 1.38 > 1.02); the offset baseline is the trained boundaries as vLLM reads SGLang's ids (-1)
    t = e["tau"]
    assert t["trained"] > t["trained, layer offset"] > t["untrained"], t
    assert e["boundaries_fed"]["trained, layer offset"] == [b - 1 for b in e["trained_boundaries"]]
    for label, tau in e["tau"].items():
        a = e["per_position_acceptance"][label]
        assert 1.0 <= tau <= 6.0 and abs(tau - (1 + sum(a))) < 1e-3, label
    served = {
        f"{d}, served by {name}"
        for d in ("trained", "trained, layer offset")
        for name in ("vLLM 0.32.0", "SGLang 0.5.23")
    }
    assert set(e["tau"]) == {"trained", "untrained", "trained, layer offset"} | served
    # each engine's own counters for the same drafter and prompts as the simulator's "trained"
    assert set(e["served_by"]) == {"vllm", "sglang"}
    for engine, v in e["served_by"].items():
        assert (
            v["greedy_mismatches_vs_engine_plain"] == v["mismatches_vs_hf_greedy"] == 0
            and v["compared_with"] == "trained"
        ), engine
        assert (
            v["counters"]["num_drafts"] == v["simulator_cycles"]
            and max(v["abs_diff_per_position"]) <= 0.05
        ), (engine, v)
        # the layer offset served by the engine: the simulator's offset on the same prompts
        off = v["baselines"]["trained, layer offset"]["tau"]
        assert abs(off - e["tau"]["trained, layer offset"]) <= 0.05, (engine, off)
    assert "| heldout |" in e["served"]["table"] and e["served"]["left_out"] == {}
    sp = m["engines"]["vllm"]
    assert (
        sp["generate_tokens_per_s"] > 0
        and sp["extract_tokens_per_s"] > 0
        and sp["capture_overhead_ratio"] > 0
    )
    assert m["extract_vllm"]["n_samples"] == 24 and m["alignment"]["vllm"]["measured"] == [1, 2, 4]
    assert m["extract"]["n_samples"] == m["generate"]["n_train_prompts"] == 24
    assert m["train"]["steps"] == load_params(REPO_ROOT / "params" / "smoke.yaml").max_steps
    assert (
        set(m["timing"]["notebook_seconds"]) == set(NOTEBOOKS) and m["timing"]["total_seconds"] > 0
    )
    assert set(m["checks"]) == set(NOTEBOOKS) and all(m["checks"].values())
    al = m["alignment"]["sglang"]
    assert (
        al["declared"] == al["measured"] == [1, 2, 4]
        and al["verdicts"] == ["matches"] * 3
        and al["max_error"] <= 1e-5
    )
    assert (
        m["extract"]["engine"] == "sglang"
        and m["extract"]["final_state_engine"] == "hf-transformers"
    )
    drift = m["engine_drift"][
        "median_relative_deviation_from_hf_float32"
    ]  # same probe tokens, same boundaries
    assert (
        max(drift["sglang float32"].values()) <= 1e-5
        and 1e-3 < max(drift["hf-transformers bfloat16"].values()) < 5e-2
    )
    assert any(k.startswith("vllm float32") for k in drift)  # 02a's dataset is in the run folder
    dm = m["drift_matrix"]  # 05 with the notebook defaults: HF float32, w8a8, w4a16
    assert dm["matrix"]["rows"][-1] == "layer offset" and dm["offset_boundaries"] == [0, 1, 3]
    assert dm["matrix"]["cols"] == ["hf:float32:none", "hf:float32:w8a8", "hf:float32:w4a16"]
    ref = dm["checks"]["hf:float32:none"]["drafters"]["hf:float32:none"]
    assert ref["greedy_mismatches_vs_own_plain"] == 0
    for q in ("hf:float32:w8a8", "hf:float32:w4a16"):
        assert 1e-4 < dm["drift"][q]["logits"]["relative_error"] < 0.2, q
    eng = m["export"]["engines"]
    assert (
        eng["sglang"]["boundaries"] == eng["vllm"]["boundaries"] == [1, 2, 4]
        and eng["sglang"]["ok"]
        and eng["vllm"]["ok"]
    )


def test_mismatched_boundaries_refused_before_training(smoke_run, tmp_path):
    """03 refuses a dataset whose boundaries differ from those the drafter will be served with."""
    import shutil

    from eagle3nb.manifest import ManifestMismatch
    from eagle3nb.params import RunParams
    from eagle3nb.steps.train.step import train_step

    shutil.copytree(smoke_run / "dataset", tmp_path / "ci-smoke" / "dataset")
    p = RunParams(outputs_dir=str(tmp_path), run_name="ci-smoke", layer_ids=[1, 2, 3])
    with pytest.raises(ManifestMismatch, match="aux_boundaries"):
        train_step(p, progress=False)


@pytest.mark.parametrize(
    "field, value",
    [
        ("dtype", "bfloat16"),
        ("convention", "vllm"),
        ("template", {"mode": "chat", "sha256": "0" * 64}),
        ("target", {"sha256": "f" * 64}),
    ],
)
def test_dataset_from_other_settings_refused_by_03_unless_overridden(
    smoke_run, tmp_path, field, value
):
    import shutil

    from eagle3nb.manifest import ManifestMismatch, atomic_write_json
    from eagle3nb.params import RunParams
    from eagle3nb.steps.train.step import train_step

    d = tmp_path / "ci-smoke" / "dataset"
    shutil.copytree(smoke_run / "dataset", d)
    shutil.copytree(smoke_run / "data", tmp_path / "ci-smoke" / "data")  # 01's output: 03 reads it
    man = json.loads((d / "manifest.json").read_text())
    man[field] = value if not isinstance(value, dict) else {**man[field], **value}
    atomic_write_json(d / "manifest.json", man)
    with pytest.raises(ManifestMismatch, match=field):
        train_step(RunParams(outputs_dir=str(tmp_path), run_name="ci-smoke"), progress=False)
    out = train_step(
        RunParams(
            outputs_dir=str(tmp_path),
            run_name="ci-smoke",
            max_steps=2,
            allow_manifest_mismatch=True,
        ),
        progress=False,
    )
    assert out["stats"]["steps"] == 2


def test_rerun_reads_the_recorded_results_back_without_engines(smoke_run, monkeypatch):
    """A finished notebook run again (JupyterLab after a kernel restart, nbval) reads the result
    its step recorded: no engine starts, and what comes back is what the run wrote to
    metrics.json (recorded by the real run, not by this test)."""
    from eagle3nb.engines import sglang_helpers, vllm_helpers
    from eagle3nb.steps.drift.step import drift_matrix_step
    from eagle3nb.steps.evaluate.step import eval_step
    from eagle3nb.steps.extract.from_sglang import extract_sglang_step
    from eagle3nb.steps.extract.from_vllm import extract_vllm_step

    def no_engine(*a, **k):
        raise AssertionError("an engine was started for a recorded result")

    monkeypatch.setattr(sglang_helpers, "start_sglang", no_engine)
    for mod in ("extract.from_vllm", "evaluate.step", "drift.step"):
        monkeypatch.setattr(f"eagle3nb.steps.{mod}.start_vllm", no_engine, raising=False)
    monkeypatch.setattr(vllm_helpers.EngineClient, "__init__", no_engine)
    full = load_params(
        REPO_ROOT / "params" / "smoke.yaml",
        outputs_dir=str(smoke_run.parent),
        run_name=smoke_run.name,
        interactive=True,  # only picks widgets or HTML: not part of the record's key
    )

    def as_notebook(nb):  # what the notebook's kernel had: its declared fields, others default
        return RunParams(
            **{k: getattr(full, k) for k in RunParams.model_fields if nb in declared_by(k)}
        )

    m = json.loads((smoke_run / "metrics.json").read_text())
    as_json = lambda x: json.loads(json.dumps(x))  # noqa: E731
    runs = [
        (extract_vllm_step, "02a_extract_vllm", "extract_vllm", "stats"),
        (extract_sglang_step, "02b_extract_sglang", "extract", "stats"),
        (eval_step, "04_eval_acceptance", "eval", "stats"),
        (drift_matrix_step, "05_drift", "drift_matrix", None),
    ]
    for step, nb, section, key in runs:
        out = step(as_notebook(nb), progress=False)
        assert out["recorded"]["read_back"], step.__name__
        got = as_json(out[key] if key else {k: out[k] for k in m[section]})
        assert got == {k: m[section][k] for k in got}, step.__name__
    # what the notebooks draw from besides metrics: tensors and the tokenizer come back too
    out = extract_sglang_step(as_notebook("02b_extract_sglang"), progress=False)
    assert out["alignment_error"].shape[0] == len(out["manifest"]["aux_boundaries"])
    p = as_notebook("04_eval_acceptance")
    assert eval_step(p, progress=False)["tokenizer"]("Once upon").input_ids
    # a parameter that changes the measurement runs the step again (here: reaches the engine)
    with pytest.raises(AssertionError, match="engine was started"):
        eval_step(p.model_copy(update={"k": p.k - 1}), progress=False)
