"""params/kimi_case.yaml, the parts that run in seconds: the tiny DeepSeek-V3 twin is built at run
time from eagle3nb/data/deepseek_v3.config.json (no download; MLA ranks, YaRN and router kept),
preflight accepts the run (HF captures; vLLM 0.32.0 could capture it with CPU_MLA, SGLang's CPU MLA
is refused, tests/test_cpu_refusals.py; no engine serves its drafter here), and before training the
export's SGLang ids are flagged: SGLang 0.5.23 reads them for this class as boundaries [2, 6, 9]
(first id not 1: unshifted) while the drafter is trained on [3, 7, 10]; the same ids on a Llama
target read as trained. What SGLang would feed is HF's residual stream at [2, 6, 9] on the twin (HF
capture at SGLang's rule, labelled so), one layer off from the trained states at every slot. The run
itself (HF capture, training, simulator acceptance as served), shortened here: `python -m
eagle3nb.run params/kimi_case.yaml`; its acceptance cost of the mismatch is within seed noise on
this twin (docs/architectures.md, DeepSeek / Kimi), so the shortened run checks what was fed, not which tau is higher."""

import json

import pytest
from testkit import requires_engine

from eagle3nb.params import load_params
from eagle3nb.preflight import check_against_model
from eagle3nb.rundir import RunDir, read_metrics
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.steps.shared.checks import export_rule_check
from eagle3nb.target import models
from eagle3nb.boundaries.alignment import alignment_matrix
from eagle3nb.target.capture import reference_states
from eagle3nb.target.capture import HFCaptureEngine


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    import os

    twins = tmp_path_factory.mktemp("twins")
    old = os.environ.get("EAGLE3NB_TWINS")
    os.environ["EAGLE3NB_TWINS"] = str(twins)
    p = load_params(REPO_ROOT / "params" / "kimi_case.yaml", outputs_dir=str(twins / "out"))
    yield p, models.resolve_model(p.model)
    if old is None:
        os.environ.pop("EAGLE3NB_TWINS")
    else:
        os.environ["EAGLE3NB_TWINS"] = old


def test_twin_of_deepseek_v3_built_from_its_config(kimi):
    _, path = kimi
    cfg = json.loads((path / "config.json").read_text())
    src = json.loads((REPO_ROOT / "eagle3nb/data/deepseek_v3.config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["num_hidden_layers"] == 12
    for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        assert cfg[k] == src[k], k
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 576
    assert cfg["rope_parameters"]["rope_type"] == "yarn" and cfg["rope_parameters"]["factor"] == 40
    assert (cfg["scoring_func"], cfg["topk_method"]) == ("sigmoid", "noaux_tc")
    assert cfg["n_routed_experts"] == 4 and cfg["hidden_size"] < src["hidden_size"]
    assert models.resolve_model(kimi[0].model) == path  # built once, then found


@requires_engine("vllm")
def test_preflight_accepts_the_run(kimi):
    p, _ = kimi
    info = check_against_model(p)
    assert info["n_layers"] == 12 and info["boundaries"] == [3, 7, 10]
    assert info["layer_ids"] == [2, 6, 9] and info["engines"] == {}  # HF captures, no engine
    # vLLM captures DeepSeek on CPU through CPU_MLA (tests/engines/test_vllm_cpu_mla.py), cannot
    # serve its drafter there
    got = check_against_model(p.model_copy(update={"vllm_extract": True}))["engines"]["vllm"]
    assert got["ids"] == [3, 7, 10]
    with pytest.raises(ValueError, match=r"vllm 0\.32\.0 cannot serve DeepseekV3ForCausalLM"):
        check_against_model(p.model_copy(update={"eval_engines": ["vllm"]}))


def test_sglang_reading_flagged_before_training(kimi, tmp_path):
    p, _ = kimi
    p = p.model_copy(update={"outputs_dir": str(tmp_path)})
    rd = RunDir(p)
    rd.root.mkdir(parents=True)
    strict = p.model_copy(update={"allow_manifest_mismatch": False})
    with pytest.raises(
        ValueError,
        match=r"sglang 0\.5\.23 reads the exported sglang ids \[2, 6, 9\] of this "
        r"DeepseekV3ForCausalLM target as boundaries \[2, 6, 9\], the drafter is trained on "
        r"\[3, 7, 10\].*allow_manifest_mismatch",
    ):
        export_rule_check(strict, rd, "DeepseekV3ForCausalLM", 12, [3, 7, 10], [3, 7, 10])
    with pytest.warns(UserWarning, match="FLAGGED before training: sglang 0.5.23"):
        got = export_rule_check(p, rd, "DeepseekV3ForCausalLM", 12, [3, 7, 10], [3, 7, 10])
    assert got["sglang"]["reads"] == [2, 6, 9] and got["vllm"]["reads"] == [3, 7, 10]
    assert read_metrics(rd.metrics)["export_rules"]["engines"]["sglang"]["matches"] is False
    llama = export_rule_check(strict, rd, "LlamaForCausalLM", 12, [3, 7, 10], [3, 7, 10])
    assert llama["sglang"]["reads"] == [3, 7, 10]  # the same ids work on a Llama target


@requires_engine("sglang")  # its installed version names the reading
def test_alignment_figure_marks_what_03_flags(kimi, tmp_path):
    """02b's alignment figure marks, per engine, where it reads the ids 03 will export: with the
    params 02b's notebook declares (as eagle3nb.run passes them), SGLang's marker is the flagged
    [2, 6, 9] of export_layer_ids: convention, labelled in 03's wording (before, 02b did not
    declare export_layer_ids and marked the default export's [3, 7, 10])."""
    import papermill as pm

    from eagle3nb import params as params_mod
    from eagle3nb.steps.extract.twin_gate import export_readings

    p, _ = kimi
    p = p.model_copy(update={"outputs_dir": str(tmp_path)})
    nb = REPO_ROOT / "notebooks" / "02b_extract_sglang.ipynb"
    declared = pm.inspect_notebook(str(nb)).keys()
    seen = params_mod.collect({k: getattr(p, k) for k in declared if hasattr(p, k)})
    assert seen.export_layer_ids == "convention"
    man = {"target": {"n_layers": 12, "architecture": "DeepseekV3ForCausalLM"}}
    man["aux_boundaries"] = [3, 7, 10]
    marks = export_readings(seen, man)
    rd = RunDir(p)
    rd.root.mkdir(parents=True)
    flags = export_rule_check(p, rd, "DeepseekV3ForCausalLM", 12, [3, 7, 10], [3, 7, 10])
    assert "sglang" in flags, flags  # its installed version names the reading
    assert marks["sglang 0.5.23 reads exported ids [2, 6, 9] as boundaries [2, 6, 9]"] == [2, 6, 9]
    assert {tuple(v) for v in marks.values()} == {tuple(r["reads"]) for r in flags.values()}


def test_what_sglang_would_feed_is_one_layer_shallower(kimi):
    """HF capture (not an engine) at SGLang 0.5.23's reading [2, 6, 9] and at the trained [3, 7, 10]
    on the twin: each slot equals HF hidden_states of its boundary, and the two differ by the
    adjacent-boundary distance at every slot."""
    _, path = kimi
    model = models.load_target(path, "float32")[0]
    s = [1, 40, 50, 60, 70, 80, 90, 100, 110]
    eng = HFCaptureEngine(model, "vllm")  # vLLM's rule: id = boundary
    fed, trained = (eng.capture([s], b)[0].aux for b in ([2, 6, 9], [3, 7, 10]))
    ref = reference_states(model, s)
    for aux, bs in ((fed, [2, 6, 9]), (trained, [3, 7, 10])):
        err, cols = alignment_matrix(aux, ref, 3)
        assert [cols[int(err[i].argmin())] for i in range(3)] == bs
        assert float(err.sort(dim=1).values[:, 1].min()) > 0.3  # far from every other boundary
    err, cols = alignment_matrix(fed, {b: ref[b] for b in (3, 7, 10)}, 3)
    assert all(float(err[i, i]) > 0.3 for i in range(3))  # fed slot i is not trained slot i


# --- the run itself, shortened (HF captures at the old rule: no engine captures DeepSeek here) ----
SMALL = dict(max_train_prompts=48, max_new_tokens=32, max_steps=150, max_eval_prompts=8)
SMALL.update(eval_max_new_tokens=32, interactive=False)


@pytest.fixture(scope="module")
def kimi_run(kimi):
    """The run on the Kimi twin; its tests carry requires_engine("sglang") (the installed SGLang
    version names the reading)."""
    from eagle3nb.steps.evaluate.step import eval_step
    from eagle3nb.steps.extract.from_sglang import extract_sglang_step
    from eagle3nb.steps.generate.step import generate_step
    from eagle3nb.steps.train.step import train_step

    p = kimi[0].model_copy(update=SMALL)
    generate_step(p, progress=False)
    out = {"02b": extract_sglang_step(p, progress=False)}
    with pytest.warns(UserWarning, match="FLAGGED before training: sglang 0.5.23 reads"):
        out["03"] = train_step(p, progress=False)
    out["04"] = eval_step(p, progress=False)
    return p, out


@requires_engine("sglang")
def test_run_captured_the_trained_boundaries_with_hf(kimi_run):
    _, out = kimi_run
    m = out["02b"]["manifest"]
    assert m["engine"]["name"] == "hf-transformers"  # labelled as what ran
    assert m["engine"]["capture_point_of"] == "speculators_le_0.4"
    assert m["aux_boundaries"] == [3, 7, 10] and m["layer_ids"] == [2, 6, 9]
    assert out["02b"]["alignment"]["ok"] and m.get("twin_check") is None


@requires_engine("sglang")
def test_run_flags_and_measures_the_sglang_reading(kimi_run):
    p, out = kimi_run
    cfg = json.loads((RunDir(p).drafter / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]  # what users write
    assert read_metrics(RunDir(p).metrics)["export_rules"]["engines"]["sglang"]["reads"] == [
        2,
        6,
        9,
    ]
    st = out["04"]["stats"]
    assert st["served_boundaries"] == {"sglang": [2, 6, 9], "vllm": [3, 7, 10]}
    served = "trained, as served (ids -> [2, 6, 9])"
    assert st["engines"][served].startswith("eagle3nb simulator")  # never labelled as an engine
    assert st["boundaries_fed"][served] == [2, 6, 9] and st["boundaries_fed"]["trained"] == [
        3,
        7,
        10,
    ]
    print(f"\nkimi case: tau trained {st['tau']['trained']:.3f}, as SGLang 0.5.23 serves it "
          f"{st['tau'][served]:.3f}; per position {st['per_position_acceptance']}")  # fmt: skip
    # trained vs as served is NOT compared: on this random-weight twin their difference is within
    # seed noise (docs/architectures.md#the-same-failure-on-deepseek-kimi-paramskimi_caseyaml);
    # the drafter did learn, though
    assert st["tau"]["trained"] > st["tau"]["untrained"] + 0.3


def test_default_export_writes_ids_sglang_reads_as_meant(kimi, tmp_path):
    """eagle3nb's own export (export_layer_ids: trained) writes SGLang 0.5.23's ids by its DeepSeek
    rule: [3, 7, 10] unshifted (first id not 1), read back as the trained boundaries; the generic
    convention's [2, 6, 9] (export_layer_ids: convention) is what the flagged run reproduces."""
    from eagle3nb.drafter.export import engine_ids

    p, _ = kimi
    p = p.model_copy(update={"outputs_dir": str(tmp_path), "export_layer_ids": "trained"})
    RunDir(p).root.mkdir(parents=True)
    got = export_rule_check(p, RunDir(p), "DeepseekV3ForCausalLM", 12, [3, 7, 10], [3, 7, 10])
    assert got["sglang"]["ids"] == [3, 7, 10] and got["sglang"]["matches"] is True
    ids, rec = engine_ids("sglang", [3, 7, 10], 12, "DeepseekV3ForCausalLM", "0.5.23", False)
    assert ids == [2, 6, 9] and rec["ids_written_by"] == "convention"
