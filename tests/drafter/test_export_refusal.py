"""Issue 43 item 5 for 03's own export: a drafter trained at boundaries SGLang cannot capture ([1, 3,
5] on the 5-layer smoke target: 5 = N, which SGLang 0.5.23's Llama never captures) is exported with
SGLang's ids key holding eagle3nb's refusal mark, the mechanism the audit's corrected copy uses
(:mod:`eagle3nb.boundaries.refusal`), so SGLang cannot serve its default ids by mistake; 03 says so
on the terminal with the set to retrain at; vLLM's export is that of any other set; 04 leaves SGLang
out by name as for the audit's copy. SGLang's and vLLM's own readers of the ids are run in their
venvs on the written file (no engine started: a scheduler that dies at start hangs the worker)."""

from __future__ import annotations

import json
import sys

import pytest
from testkit import requires_engine, sglang_reads_ids

from eagle3nb.boundaries.refusal import REFUSED_MARK, nearest_capturable, retrain_set
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir

ARCH, N, TRAINED = "LlamaForCausalLM", 5, [1, 3, 5]
WHY = (
    "sglang 0.5.23 refused: boundaries=[1, 3, 5]: sglang 0.5.23 on LlamaForCausalLM captures "
    "boundaries 1..4 of a 5-layer target, not [5] (the final norm captures nothing, so boundary N "
    "never comes back; sglang/srt/models/llama.py:929-941); pick boundaries in that range"
)


@pytest.fixture(scope="module")
def refused_run(tmp_path_factory):
    """01, 02 (HF capture) and 03 on the smoke target at vLLM ids [1, 3, 5] (boundaries [1, 3, 5]),
    a few steps: the run folder's params and 03's result."""
    from eagle3nb.steps.extract.from_sglang import extract_sglang_step
    from eagle3nb.steps.generate.step import generate_step
    from eagle3nb.steps.train.step import train_step

    p = RunParams(
        outputs_dir=str(tmp_path_factory.mktemp("runs")), run_name="n-for-sglang",
        convention="vllm", layer_ids=TRAINED, max_train_prompts=24, max_new_tokens=24,
        extract_engine="hf", max_steps=4, batch_size=8, warmup_steps=1, eval_every=0,
        interactive=False, tracking=[], vllm_extract=False, eval_engines=["simulator"],
    )  # fmt: skip
    generate_step(p, progress=False)
    extract_sglang_step(p, progress=False)
    return p, train_step(p, progress=False)


def _cfg(p) -> dict:
    return json.loads((RunDir(p).drafter / "config.json").read_text())


def test_03_marks_sglang_refused_and_says_so(refused_run):
    p, _ = refused_run
    rd = RunDir(p)
    cfg = _cfg(p)
    assert cfg["eagle3nb"]["refused_engines"] == {"sglang": WHY}
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, f"{REFUSED_MARK}: {WHY}"]
    # the set SGLang captures nearest to [1, 3, 5] by hand: boundaries 0..4 (the rule), total shift
    # 1 only by moving 5 to 4; SGLang ids = boundary - 1
    nearest = {
        "boundaries": [1, 3, 4], "ids": [0, 2, 3], "tau": None,
        "chosen_by": "the set nearest to [1, 3, 5] that sglang 0.5.23 captures (total shift 1; "
        "no tau table measured for this drafter)",
    }  # fmt: skip
    assert cfg["eagle3nb"]["retrain"] == {"sglang": nearest}
    man = json.loads((rd.drafter / "manifest.json").read_text())
    assert man["refused_engines"] == {"sglang": {"why": WHY, "retrain": nearest}}
    want = [
        f"[03] notice: sglang: NOT servable ({WHY})",
        "[03] notice: sglang cannot serve this config.json by mistake: its ids key "
        "eagle_config.eagle_aux_hidden_state_layer_ids holds eagle3nb's refusal mark, on which "
        "SGLang stops at start (set_eagle3_layers_to_capture raises TypeError) instead of serving "
        "its default ids",
        "[03] notice: to serve with sglang: retrain or fine-tune at boundaries [1, 3, 4] (sglang "
        "ids [0, 2, 3]), the set nearest to [1, 3, 5] that sglang 0.5.23 captures (total shift 1; "
        "no tau table measured for this drafter) (layer_ids: [1, 3, 4] (convention vllm), then 02 "
        f"and 03 again; or fine-tune this drafter there: init_from: {rd.drafter}, "
        "init_boundaries: params)",
    ]
    log = (rd.train / "train.log").read_text().splitlines()
    assert [x for x in log if x.startswith("[03] notice: ")] == want
    m = json.loads(rd.metrics.read_text())
    assert m["export"]["engines"]["sglang"]["refused"] == WHY
    assert m["export"]["engines"]["sglang"]["boundaries"] is None  # not its default ids
    assert m["export"]["engines"]["vllm"]["ok"]
    from eagle3nb import run as runner

    assert runner._notices(rd, "03_train") == ", 3 notices above (refused or left out)"
    from eagle3nb.drafter.card import serve_commands_markdown

    md = serve_commands_markdown("r", cfg, "T", str(rd.drafter), 3)
    assert "--speculative-algorithm EAGLE3" not in md  # no SGLang command for a refused export
    assert f"# sglang: NOT servable ({WHY}); its ids key holds eagle3nb's refusal mark" in md


def test_vllm_export_is_that_of_any_other_set(refused_run, tmp_path):
    """vLLM's side of the refused export: ids [1, 3, 5] at its top-level key (vLLM id = boundary,
    interfaces.py:1601-1611), by vLLM's own lookup order (top-level first); every other key of
    config.json but eagle3nb's record equal to the same drafter exported at [1, 2, 4] (both
    engines served) with its ids; the weights load back."""
    from eagle3nb.boundaries.config_ids import vllm_ids
    from eagle3nb.drafter.export import export_drafter, load_drafter

    p, _ = refused_run
    cfg = _cfg(p)
    assert vllm_ids(cfg) == ([1, 3, 5], "config")
    assert cfg["eagle3nb"]["engine_ids"]["vllm"]["ids"] == [1, 3, 5]
    d, _ = load_drafter(RunDir(p).drafter)
    man = json.loads((RunDir(p).drafter / "manifest.json").read_text())
    other = export_drafter(d, tmp_path / "d", [1, 2, 4], N, {"target": man["target"]}, 1, 2)
    plain = json.loads((other / "config.json").read_text())
    drop = ("eagle3nb", "eagle_aux_hidden_state_layer_ids", "eagle_config", "bos_token_id")
    assert {k: v for k, v in cfg.items() if k not in drop + ("eos_token_id",)} == {
        k: v for k, v in plain.items() if k not in drop + ("eos_token_id",)
    }
    assert plain["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    assert {
        k: v for k, v in cfg["eagle_config"].items() if k != "eagle_aux_hidden_state_layer_ids"
    } == {"use_aux_hidden_state": True}


def test_04_leaves_sglang_out_by_name_as_for_the_audits_copy(refused_run, tmp_path):
    """04's reading of the export (``_served``) and its engine choice (``_engine_reason``) name
    SGLang refused, without an error, for 03's export and for the audit's corrected copy alike."""
    from eagle3nb.audit.patch import write_patched
    from eagle3nb.steps.evaluate.bench import _engine_reason
    from eagle3nb.steps.evaluate.step import _served
    from eagle3nb.target import models

    p, _ = refused_run
    rd = RunDir(p)
    readings = {"sglang": {"version": "0.5.23"}, "vllm": {"version": "0.32.0"}}
    write_patched(rd.drafter, tmp_path / "audit", TRAINED, N, ARCH, readings, {})
    audit_cfg = json.loads((tmp_path / "audit" / "config.json").read_text())
    q = p.model_copy(update={"sglang_python": sys.executable})  # "installed": the export decides
    tcfg = models.read_model_config(models.resolve_model(p.model))
    for cfg in (_cfg(p), audit_cfg):
        assert _served(q, cfg, N, ARCH) == {"vllm": TRAINED}
        why = cfg["eagle3nb"]["refused_engines"]["sglang"]
        assert (
            _engine_reason(q, "sglang", p.model, tcfg, cfg, "cpu")
            == f"the export refused it: {why}"
        )


def test_retrain_set_from_a_tau_table_else_nearest():
    rows = [{"boundaries": [1, 3, 5], "tau": 2.21}, {"boundaries": [2, 3, 4], "tau": 2.398}]
    got = retrain_set(TRAINED, "sglang", "0.5.23", ARCH, N, rows, "audit.json")
    assert (got["boundaries"], got["ids"], got["tau"]) == ([2, 3, 4], [1, 2, 3], 2.398)
    assert got["chosen_by"] == "highest tau among the sets sglang 0.5.23 captures in audit.json"
    # nearest, by hand: an 80-layer Llama captures 1..79 for SGLang; [0, 40, 80] moves 0 -> 1 and
    # 80 -> 79 (total 2; no set at total 1 avoids both ends)
    assert nearest_capturable([0, 40, 80], "sglang", "0.5.23", ARCH, 80) == {
        "boundaries": [1, 40, 79], "ids": [0, 39, 78], "shift": 2
    }  # fmt: skip
    assert retrain_set(TRAINED, "sglang", "0.5.23", None, N) is None  # no class: never assumed


@requires_engine("sglang")
def test_sglang_0_5_23_cannot_load_the_refused_export(refused_run):
    """SGLang 0.5.23's own ``set_eagle3_layers_to_capture``, called at start with the drafter
    config's ids, raises on 03's export for each rule kind (Llama + 1, gpt-oss unless N,
    DeepSeek + 1 when the first id is 1); a mark without the leading 1 passes DeepSeek's."""
    p, _ = refused_run
    ids = _cfg(p)["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    got = sglang_reads_ids(ids, N, more=[ids[1:]])  # and the mark without its leading 1
    assert got[0::3] == [
        "LlamaForCausalLM ok [1, 2, 4]",
        "GptOssForCausalLM ok [1, 2, 4]",
        "DeepseekV2ForCausalLM ok [0, 1, 3]",
    ]
    assert got[1::3] == [
        'LlamaForCausalLM raised TypeError can only concatenate str (not "int") to str',
        "GptOssForCausalLM raised TypeError '>' not supported between instances of 'str' and 'int'",
        'DeepseekV2ForCausalLM raised TypeError can only concatenate str (not "int") to str',
    ]
    assert got[8] == f"DeepseekV2ForCausalLM ok {json.dumps(ids[1:])}"  # passes: captures nothing


_VLLM_READ = """
import json, sys, types
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.model_executor.models.interfaces import EagleModelMixin
for cfg in json.loads(sys.argv[1]):
    hf = types.SimpleNamespace(**cfg)
    spec = types.SimpleNamespace(draft_model_config=types.SimpleNamespace(hf_config=hf))
    ids = GPUModelRunner._get_eagle3_aux_layers_from_config(types.SimpleNamespace(
        speculative_config=spec))
    try:
        EagleModelMixin._set_aux_hidden_state_layers(types.SimpleNamespace(), ids)
        print("ok", json.dumps(ids))
    except TypeError as e:
        print("raised", json.dumps(ids), e)
    except AttributeError:  # past the sort: the stand-in lacks vLLM's layout cache
        print("ok", json.dumps(ids))
"""


@requires_engine("vllm")
def test_vllm_reads_its_own_ids_and_stops_on_its_mark(refused_run):
    """vLLM 0.32.0's own lookup (``_get_eagle3_aux_layers_from_config``) and setter
    (``_set_aux_hidden_state_layers``), run in its venv: 03's export gives it [1, 3, 5]; a config
    whose vLLM ids are marked refused (:func:`eagle3nb.boundaries.refusal.refuse_engine`) raises
    where vLLM loads the target; with no top-level key it would take SGLang's nested ids."""
    import subprocess

    from eagle3nb.boundaries.refusal import refuse_engine
    from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS

    p, _ = refused_run
    cfg = _cfg(p)
    marked = json.loads(json.dumps(cfg))
    refuse_engine(marked, "vllm", "why", 3, None)
    nested = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 3]}}
    keys = ("eagle_aux_hidden_state_layer_ids", "eagle_config")
    cfgs = [{k: c[k] for k in keys if k in c} for c in (cfg, marked)] + [nested]
    out = subprocess.run(
        [DEFAULT_ENGINE_PYTHONS["vllm"], "-c", _VLLM_READ, json.dumps(cfgs)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3, out.stdout + out.stderr[-3000:]
    assert (lines[0], lines[2]) == ("ok [1, 3, 5]", "ok [0, 1, 3]")
    # the set's order (str hashing) decides which type the message names first
    assert lines[1].startswith(f"raised [1, \"{REFUSED_MARK}: why\"] '<' not supported between")
