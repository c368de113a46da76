"""A whole run per class on an engine version outside the table (issue 42: "a run on an engine
version outside the table completes (capture, training, export, served check) on CPU, its manifests
naming the measured rule; a test shows it with a real engine whose row is hidden, for every class
the twins build").

Per (engine, class): the engine's version file is hidden (``$EAGLE3NB_HIDE_RULES``, the measured
store in tmp), the target is a tiny random-weight twin of the class's full-size config (the folders
of tests/engines/test_twin_engines.py, written with weights by ``eagle3nb.target.twin.build_twin``,
6 layers, vocab 512), and the workbook's own steps run on it: 01 generates (HF), 02a (vLLM) or 02b
(SGLang, ``capture_route: runner``) starts the engine on the target, its twin gate measures the rule
on the running worker (no version file: ``rule_measured_now``) and the engine captures the dataset,
03 trains (24 prompts, 40 steps of 8, k 3) and exports. Then:

- the dataset manifest's ``twin_check.engine_rule`` and the drafter config's
  ``eagle3nb.engine_ids.<engine>`` name the rule as ``measured`` (with its record), and the rule
  equals the hidden row (kind, lowest boundary, distance of the highest from N);
- the ids exported at the engine's own key equal what the hidden row gives for the trained
  boundaries (what the export would write were the row there);
- the served check: the engine serves the exported drafter (the worker 02 started, kept by
  ``eagle3nb.engines.pool``: no new start), its served output equals HF greedy (float32), and its
  own per-position acceptance counters equal eagle3nb's simulator (HF target + the same drafter,
  same held-out prompts), count for count; vLLM's gpt-oss within noise (its CPU kernels are
  bf16-level: HF and vLLM float32 forwards of the gpt-oss twin differ by ~1e-2).

Which classes (``RUN``): every class the twins build per engine (``CLASSES`` of
tests/engines/test_twin_engines.py: vLLM 7, SGLang 6), and vLLM's DeepSeek-V3, whose twin it
captures on CPU_MLA: its run trains and serves the MLA drafter head (``drafter_head: mla``, the
head vLLM serves on CPU), and the Llama head is refused by preflight with eagle3nb's CPU limit,
asserted by its exact message (``_llama_head_refused``: "No common block size for 128 (CPU_MLA:
[16]; CPU_ATTN: [MultipleOf(32)])", ``boundaries/versions/vllm_0_32_0.py``). Every other class run
here is served by its engine on CPU; the classes an engine does not capture on CPU (SGLang: gpt-oss,
Llama-4, DeepSeek/Kimi, MiniMax-M2; vLLM: MiniMax-M2, Kimi-K2.5) are refused by preflight by
name (tests/test_cpu_refusals.py), and those the table refuses outright (GLM-4.5 and Gemma-3 on
vLLM, Mixtral) have no rule to measure. The measured-rule assertions tests/engines/
test_measured_rules.py made per vLLM class are made here on the run's record (the rule, its
record, the probe sets, the kept file, the lookup falling back to it); that module keeps SGLang's
(its refusals of ids >= N by message, the re-set-equals-fresh-load proof).

Seconds (``-s`` prints them per step), 2026-12-06, 2-core box under the heavy lock, vLLM 0.32.0 and
SGLang 0.5.23 (``pytest -s --durations=0 tests/engines/test_measured_run_classes.py``): the 14 cases
took 728 and 738 s in two runs (vLLM 49-81 s a class, of which 02, with the worker's start, the
4-set measurement and the capture, 38-61 s, the served check 8-19 s; SGLang 40-52 s a class, 02
25-32 s); a first run, whose vLLM runs measured a fifth set, 636 s on a quieter machine. Less the
166 s vLLM's classes took in tests/engines/test_measured_rules.py, this adds about 8-9 minutes to
CI."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

from testkit import requires_engine, sglang_ctx
from eagle3nb.boundaries.config_ids import get_ids
from eagle3nb.boundaries.cpu_limits import cpu_limit
from eagle3nb.boundaries.measured import probe_plan
from eagle3nb.boundaries.measured_store import MEASURED
from eagle3nb.boundaries.rules import RULES, _MEASURED, engine_rule
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir
from eagle3nb.target import models
from eagle3nb.target.twin import build_twin

sys.path.insert(0, str(Path(__file__).parent))
from test_twin_engines import CLASSES, VERSION, _full_folder  # noqa: E402

# engine -> classes run whole here (docstring: why these)
RUN = {
    "vllm": CLASSES["vllm"] + ["DeepseekV3ForCausalLM"],
    "sglang": CLASSES["sglang"],
}
# per class: what its run sets apart (DeepSeek on vLLM: the MLA head, the one vLLM serves on CPU;
# Llama-4: the full draft vocab, whose export carries no d2t/t2d)
OWN = {
    "DeepseekV3ForCausalLM": {"drafter_head": "mla"},
    "Llama4ForCausalLM": {"draft_vocab_size": 512},
}
CASES = [pytest.param(e, a, marks=requires_engine(e), id=f"{e}-{a}") for e in RUN for a in RUN[e]]
pytestmark = pytest.mark.slow
K, NEW = 3, 16
ROUTE = {"vllm": "engine", "sglang": "runner"}  # how each engine captures the twin
# the run's boundaries: vLLM [1, 3, 4] (its ids [1, 3, 4]), SGLang [1, 4, 5] (its ids [0, 3, 4]),
# given as the run's (SGLang-convention) layer_ids: each engine's ids are one of the measurement's
# probe sets (probe_plan(6)), so the twin gate builds no fifth set
LAYER_IDS = {"vllm": [0, 2, 3], "sglang": [0, 3, 4]}
NOISY = {("vllm", "GptOssForCausalLM")}  # served counters compared within noise, not exactly


def _target(root: Path, arch: str) -> Path:
    """The run's target: a 6-layer random-weight twin of ``arch``'s full-size config (context 512)."""
    full = _full_folder(root / "full", arch)
    cfg = json.loads((full / "config.json").read_text())
    (cfg.get("text_config") or cfg)["max_position_embeddings"] = 512
    (full / "config.json").write_text(json.dumps(cfg))
    return build_twin(full, root / "target", 6, 0, arch, models.MODEL_TYPE_ALIASES)


def _params(engine: str, arch: str, target: Path, out: Path) -> RunParams:
    sglang = engine == "sglang"
    return RunParams(
        run_name=f"{engine}-measured",
        outputs_dir=str(out),
        model=str(target),
        interactive=False,
        max_train_prompts=24,
        max_new_tokens=24,
        extract_engine="sglang" if sglang else "hf",
        sglang_options={"capture_route": "runner"} if sglang else {},
        vllm_extract=not sglang,
        train_on=engine,
        drift_samples=0,
        ttt_steps=K,
        batch_size=8,
        max_steps=40,
        warmup_steps=3,
        lr=0.005,
        eval_every=0,
        k=K,
        max_eval_prompts=4,
        eval_max_new_tokens=NEW,
        eval_engines=[engine],
        layer_ids=LAYER_IDS[engine],
        **OWN.get(arch, {}),
    )


@pytest.fixture()
def hidden(tmp_path, monkeypatch):
    def hide(engine: str) -> Path:
        monkeypatch.setenv("EAGLE3NB_HIDE_RULES", f"{engine} {VERSION[engine]}")
        monkeypatch.setenv("EAGLE3NB_MEASURED_RULES", str(tmp_path / "kept"))
        monkeypatch.setenv("EAGLE3NB_TWIN_PROOFS", "off")
        return tmp_path / "kept"

    _MEASURED.clear()
    yield hide
    _MEASURED.clear()


def _engine(p: RunParams, engine: str, target: Path):
    """The worker 02a/02b started on the target, from the pool (same start arguments)."""
    if engine == "vllm":
        from eagle3nb.engines.vllm_helpers import start_vllm

        return start_vllm(p, target, p.dtype, RunDir(p).root)
    from eagle3nb.engines.sglang_helpers import start_sglang

    return start_sglang(
        target, p.dtype, "cpu", p.seed, p.sglang_python, RunDir(p).root, sglang_ctx(target),
        p.sglang_options,
    )  # fmt: skip


@pytest.mark.parametrize("engine,arch", CASES)
def test_a_run_per_class_with_the_row_hidden(hidden, engine, arch, tmp_path):
    from eagle3nb.steps.extract.from_sglang import extract_sglang_step
    from eagle3nb.steps.extract.from_vllm import extract_vllm_step
    from eagle3nb.steps.generate.step import generate_step
    from eagle3nb.steps.train.step import train_step

    version, row = VERSION[engine], RULES[(engine, VERSION[engine], arch)]
    kept = hidden(engine)
    with pytest.raises(ValueError, match="not measured here"):
        engine_rule(engine, version, arch)  # hidden: the lookup has nothing yet
    secs, t0 = {}, time.perf_counter()

    def lap(step):
        secs[step] = time.perf_counter() - t0 - sum(secs.values())

    target = _target(tmp_path, arch)
    p = _params(engine, arch, target, tmp_path / "runs")
    rd = RunDir(p)
    generate_step(p, progress=False)
    lap("01")
    (extract_vllm_step if engine == "vllm" else extract_sglang_step)(p, progress=False)
    lap("02")
    data = rd.dataset_vllm if engine == "vllm" else rd.dataset
    _check_measured(json.loads((data / "manifest.json").read_text()), engine, arch, row, kept)
    train_step(p, progress=False)
    lap("03")
    cfg = json.loads((rd.drafter / "config.json").read_text())
    ex = cfg["eagle3nb"]["engine_ids"][engine]
    assert ex["known_by"] == MEASURED and ex["rule_record"]["measured"]["arch"] == arch, ex
    assert ex["version"] == version
    bnds = cfg["eagle3nb"]["aux_boundaries"]
    assert get_ids(cfg, engine) == row.boundaries_to_ids(bnds, 6), (bnds, get_ids(cfg, engine))
    served, sim = _served_and_simulated(p, engine, arch, target, bnds)
    lap("serve")
    print(
        f"\n{engine} {arch}: rule {row.kind} measured; ids {get_ids(cfg, engine)} for {bnds}; "
        f"served {served['num_drafts']} drafts, accepted {served['accepted_per_pos']}; simulator "
        f"{sim['cycles']} cycles, {sim['per_position_acceptance']}; seconds "
        + ", ".join(f"{k} {v:.0f}" for k, v in secs.items())
        + f"; total {time.perf_counter() - t0:.0f}"
    )
    _compare(served, sim, exact=(engine, arch) not in NOISY)
    if (engine, arch) == ("vllm", "DeepseekV3ForCausalLM"):
        _llama_head_refused(p, target, bnds)


def _check_measured(man: dict, engine: str, arch: str, row, kept: Path) -> None:
    """02's dataset manifest names the rule its twin gate measured on the running worker, equal
    to the hidden row; the measurement is kept per user (here: tmp) and the lookup now finds it.
    (For vLLM these are the assertions tests/engines/test_measured_rules.py made per class.)"""
    tc = man["twin_check"]
    rule = tc["engine_rule"]
    assert rule["known_by"] == MEASURED and rule["source"].startswith(MEASURED), rule
    assert tc["rule_measured_now"] is True and tc["agrees"], tc["verdict"]
    assert (rule["kind"], rule["lo"], rule["hi_below_n"]) == (row.kind, row.lo, row.hi_below_n), (
        rule["measured"]["matrix"]
    )
    rec = rule["measured"]
    assert (rec["engine"], rec["version"], rec["arch"]) == (engine, VERSION[engine], arch)
    assert rec["capture_route"] == ROUTE[engine]
    assert [x["ids"] for x in rec["probes"]] == probe_plan(6), rec["probes"]
    assert len(rec["model_file_sha256"]) == 64 and rec["model_file"].startswith(engine)
    assert json.loads((kept / f"{engine}-{VERSION[engine]}-{arch}.json").read_text())["kind"] == (
        row.kind
    )
    again = engine_rule(engine, VERSION[engine], arch)  # the row still hidden: the kept rule
    assert again.known_by == MEASURED and again.same_rule(row)


def _served_and_simulated(p: RunParams, engine: str, arch: str, target: Path, bnds: list[int]):
    """The engine serves the exported drafter on the worker 02 started (from the pool, stopped
    after: no other test uses this target); eagle3nb's simulator on the same held-out prompts.
    Returns ``(served, simulated)``; the served output is checked against HF greedy here."""
    from eagle3nb.drafter.acceptance import evaluate_acceptance, greedy_generate
    from eagle3nb.drafter.export import load_drafter
    from eagle3nb.engines.pool import stop
    from eagle3nb.text.generation import read_jsonl

    rd = RunDir(p)
    model, tok = models.load_target(target)[:2]
    eos = models.stop_token_ids(model, tok)
    held = [r["prompt_ids"] for r in read_jsonl(rd.generated) if r["split"] == "heldout"]
    held = held[: p.max_eval_prompts]
    drafter, _ = load_drafter(rd.drafter, model.get_input_embeddings().weight.detach().float())
    sim = evaluate_acceptance(model, drafter, held, bnds, K, NEW, eos, check_greedy=True)
    client = _engine(p, engine, target)
    try:
        served = client.serve_acceptance(str(rd.drafter), held, K, NEW, eos)
    finally:
        stop(client)
    if (engine, arch) not in NOISY:
        assert served["outputs"] == [greedy_generate(model, h, NEW, eos) for h in held]
    return served, sim


def _compare(served: dict, sim: dict, exact: bool) -> None:
    """The engine's own per-position acceptance counters vs the simulator's: count for count, or
    (``exact`` False) within 3 sigma of binomial noise."""
    assert sim["greedy_mismatches"] == []
    sim_counts = [round(a * sim["cycles"]) for a in sim["per_position_acceptance"]]
    assert sum(sim_counts) > 0, "the trained drafter was never accepted: nothing compared"
    if exact:
        assert (served["num_drafts"], served["accepted_per_pos"]) == (sim["cycles"], sim_counts)
        return
    assert sum(served["accepted_per_pos"]) > 0
    nd = max(served["num_drafts"], 1)
    for i, (a, b) in enumerate(
        zip(served["per_position_acceptance"], sim["per_position_acceptance"])
    ):
        q = (a + b) / 2
        noise = 3 * math.sqrt(max(q * (1 - q), 0.01) * (1 / nd + 1 / sim["cycles"]))
        assert abs(a - b) <= noise, f"a_{i + 1}: served {a:.3f} vs simulator {b:.3f} ({noise:.3f})"


def _llama_head_refused(p: RunParams, target: Path, bnds: list[int]) -> None:
    """vLLM cannot serve the Llama drafter head for DeepSeek on CPU: preflight refuses it with
    eagle3nb's CPU limit (the measured rule, kept above, is read back: no engine starts)."""
    from eagle3nb.preflight import check_engine_rules

    q = RunParams(**{**p.model_dump(), "drafter_head": "llama"})
    cfg = models.text_config(models.read_model_config(target))
    arch = "DeepseekV3ForCausalLM"
    with pytest.raises(ValueError) as e:
        check_engine_rules(q, arch, 6, bnds, cfg)
    assert str(e.value) == (
        f"vllm_extract=True and eval_engines=['vllm'] on model={str(target)!r} ({arch}, 6 layers, "
        f"boundaries {bnds}): vllm 0.32.0 cannot serve {arch} on CPU: "
        f"{cpu_limit('vllm', '0.32.0', arch, 'serve')}; set vllm_extract: false and leave vllm "
        "out of eval_engines, or run on a GPU (device: cuda)"
    )
