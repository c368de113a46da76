"""04's notices and progress on the terminal (issue 43 item 2): refused benchmark records with file
and line, an engine [auto] leaves out and why, and the runner echoing 04's eval.log live and
counting the notices into its "done" line."""

import io

from eagle3nb import run as runner
from eagle3nb.engines import versions
from eagle3nb.params import RunParams, load_params
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.rundir import RunDir
from eagle3nb.steps.evaluate import bench as eval_bench
from eagle3nb.steps.evaluate.progress import EvalLog, report_left_out, report_refused
from eagle3nb.target import models

BAD = "tests/bad_inputs/bench/two_malformed_mtbench.jsonl"


def test_two_malformed_mtbench_lines_are_printed_with_file_and_line(tmp_path):
    p = RunParams(eval_dataset=BAD)
    recs, block = eval_bench.read_eval_dataset(p)
    out = io.StringIO()
    log = EvalLog(tmp_path / "eval.log", out)
    report_refused(log, block)
    want = [
        f"[04] notice: eval_dataset={BAD}: 2 of 8 records refused, 6 kept",
        "[04] notice: refused two_malformed_mtbench.jsonl:line 3: empty field: turns",
        "[04] notice: refused two_malformed_mtbench.jsonl:line 6: not JSON (Expecting ',' "
        "delimiter at column 72)",
    ]
    assert out.getvalue().splitlines() == want
    assert (tmp_path / "eval.log").read_text().splitlines() == want
    assert len(recs) == 6 and log.notices == 3


def test_vllm_of_an_unknown_version_left_out_of_auto_is_printed(monkeypatch, tmp_path):
    # vLLM "installed" at a version eagle3nb has no rule for (the installed venv's version read
    # is replaced; the python path must exist, any file does); twin_check off: such a version is
    # refused instead of measured on a twin (which would start the engine)
    monkeypatch.setattr(versions, "installed_engine_version", lambda engine, py: "0.99.0")
    p = RunParams(vllm_python=str(REPO_ROOT / "README.md"), vllm_extract=False, twin_check="off")
    path = models.resolve_model(p.model)
    cfg = {"eagle3nb": {"aux_boundaries": [1, 2, 4]}}
    monkeypatch.setattr(eval_bench, "_free_bytes", lambda device: 1 << 40)
    monkeypatch.setattr(eval_bench, "_engine_reason", _only_vllm(eval_bench._engine_reason))
    engines, left_out = eval_bench.resolve_eval_engines(p, path, cfg, "cpu")
    assert engines == ["simulator", "sglang"] and list(left_out) == ["vllm"]
    out = io.StringIO()
    report_left_out(EvalLog(None, out), p.eval_engines, left_out)
    line = out.getvalue().splitlines()[0]
    assert line.startswith(
        "[04] notice: eval_engines=['auto']: vllm left out: eval_engines=['vllm'] on "
        "model='stories260K-hd32' (LlamaForCausalLM, 5 layers, boundaries [1, 2, 4]): vllm "
        "0.99.0 is not in the table (known versions: "
    )


def test_sglang_without_cpu_stand_ins_left_out_of_auto_on_cpu(monkeypatch):
    # SGLang serves EAGLE-3 on CPU only through stand-ins read from 0.5.22's and 0.5.23's sources
    # (sglang_spec_versions.VERSIONS); another version is left out of auto with the engine's own
    # refusal before 04 starts it. The venv's version read is replaced.
    from eagle3nb.engines import sglang_spec_versions

    got = {"v": "0.5.21"}
    monkeypatch.setattr(versions, "installed_engine_version", lambda engine, py: got["v"])
    p = RunParams(sglang_python=str(REPO_ROOT / "README.md"), vllm_extract=False)
    path = models.resolve_model(p.model)
    mcfg = models.read_model_config(path)
    cfg = {"eagle3nb": {"aux_boundaries": [1, 2, 4]}}
    why = eval_bench._engine_reason(p, "sglang", path, mcfg, cfg, "cpu")
    assert why.startswith("SGLang 0.5.21: eagle3nb's CPU speculative stand-ins are written for ")
    assert "SGLang 0.5.22 and 0.5.23 only" in why
    assert sglang_spec_versions.VERSIONS == ("0.5.22", "0.5.23")
    for got["v"] in sglang_spec_versions.VERSIONS:  # 0.5.22 is no longer left out by name
        assert eval_bench._engine_reason(p, "sglang", path, mcfg, cfg, "cpu") is None
        assert eval_bench._engine_reason(p, "sglang", path, mcfg, cfg, "cuda:0") is None


def _only_vllm(real):
    def reason(p, engine, *a):
        return real(p, engine, *a) if engine == "vllm" else None  # SGLang: not this test's

    return reason


def test_runner_echoes_04_lines_live_and_counts_its_notices(tmp_path, capsys):
    p = load_params(REPO_ROOT / "params" / "smoke.yaml", outputs_dir=str(tmp_path))
    rd = RunDir(p).make()
    (rd.root / "eval.log").write_text("[04] notice: a stale line of an earlier run\n")
    with runner._live_lines(rd, "04_eval_acceptance", log_output=False):
        log = EvalLog(rd.root / "eval.log", None)  # as 04's kernel writes it
        log("notice: refused x.jsonl:line 2: not JSON")
        log("vllm 0.32.0: trained, k=5, batch size 1: 3/6 prompts served, 2s elapsed, ETA 2s")
    assert capsys.readouterr().out.splitlines() == [
        "[04] notice: refused x.jsonl:line 2: not JSON",
        "[04] vllm 0.32.0: trained, k=5, batch size 1: 3/6 prompts served, 2s elapsed, ETA 2s",
    ]
    assert runner._notices(rd, "04_eval_acceptance") == ", 1 notice above (refused or left out)"
    assert runner._notices(rd, "03_train") == ""
