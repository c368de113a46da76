"""Real SGLang 0.5.23 serving an exported EAGLE-3 drafter on CPU (its own venv, the CPU stand-ins of
eagle3nb.engines.sglang_spec_cpu installed in its scheduler), float32, greedy, against independent
references: HF greedy decoding, SGLang's own plain greedy output, and the workbook's simulator
(eagle3nb.drafter.acceptance.evaluate_acceptance) on the same prompts, cycle for cycle.

One drafter trained briefly by the workbook (as tests/engines/test_engine_vllm.py trains it), one
SGLang worker for the module; engine starts: the served drafter, the layer-offset copy, plain.
Skipped, with the reason, when the SGLang venv is absent (``bash .ci/setup_engines.sh``).
"""

import json
import shutil

import pytest

from testkit import requires_engine, sglang_ctx
from eagle3nb import params
from eagle3nb.drafter.acceptance import evaluate_acceptance, greedy_generate
from eagle3nb.drafter.export import load_drafter
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
from eagle3nb.rundir import RunDir
from eagle3nb.steps.evaluate.step import offset_boundaries
from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.steps.train.step import train_step
from eagle3nb.target import models
from eagle3nb.text.generation import read_jsonl

PY = DEFAULT_ENGINE_PYTHONS["sglang"]
pytestmark = requires_engine("sglang")


@pytest.fixture(scope="module")
def run(tmp_path_factory, target):
    """A drafter trained by the workbook on SGLang-captured data (SGLang ids [0, 1, 3]), its
    held-out prompts, the SGLang worker (the one 02b started, kept by eagle3nb.engines.pool)."""
    from eagle3nb.engines.sglang_helpers import start_sglang

    p = params.RunParams(
        outputs_dir=str(tmp_path_factory.mktemp("runs")),
        run_name="sglang-serve",
        max_train_prompts=96,
        max_new_tokens=48,
        draft_intermediate_size=344,
        batch_size=16,
        max_steps=150,
        warmup_steps=10,
        max_eval_prompts=12,
        eval_every=0,  # no held-out evaluation during training: this module is about serving
        eval_max_new_tokens=48,
        interactive=False,
    )
    generate_step(p, progress=False)
    extract_sglang_step(p, progress=False)
    train_step(p, progress=False)
    rd = RunDir(p)
    held = [r["prompt_ids"] for r in read_jsonl(rd.generated) if r["split"] == "heldout"][
        : p.max_eval_prompts
    ]
    path = models.resolve_model(p.model)
    client = start_sglang(
        path, "float32", "cpu", p.seed, None, tmp_path_factory.mktemp("sglang"), sglang_ctx(path)
    )
    eos = models.stop_token_ids(*target[:2])
    yield p, rd, held, eos, client
    client.close()


def _simulated(target, rd, held, bnds, p, eos):
    model = target[0]
    drafter, _ = load_drafter(rd.drafter, model.get_input_embeddings().weight.detach().float())
    return evaluate_acceptance(
        model, drafter, held, bnds, p.k, p.eval_max_new_tokens, eos, check_greedy=False
    )


def _assert_same_cycles(served, sim, what):
    """SGLang's counters against the simulator's, exact: cycles, accepted drafts per position."""
    assert served["num_drafts"] == sim["cycles"], what
    assert served["per_position_acceptance"] == sim["per_position_acceptance"], what
    assert served["tau"] == sim["tau"], what


@pytest.fixture(scope="module")
def served(run):
    p, rd, held, eos, client = run
    return client.serve_acceptance(rd.drafter, held, p.k, p.eval_max_new_tokens, eos)


def test_served_counters_equal_the_simulators_cycle_for_cycle(run, served, target):
    p, rd, held, eos, _ = run
    cfg = json.loads((rd.drafter / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]  # what SGLang reads
    sim = _simulated(target, rd, held, [1, 2, 4], p, eos)
    assert served["num_drafts"] > 50 and len(served["accepted_per_pos"]) == p.k
    assert served["tau"] > 1.3, f"trained drafter barely accepted by SGLang: tau {served['tau']}"
    _assert_same_cycles(served, sim, "trained drafter, SGLang ids [0, 1, 3]")
    # SGLang's own numbers, and how they relate (its histogram, its accept length)
    hist = served["spec_correct_drafts_histogram"]
    assert len(hist) == p.k + 1 and sum(hist) == served["spec_verify_ct"] == served["num_drafts"]
    assert served["accepted_per_pos"] == [sum(hist[i + 1 :]) for i in range(p.k)]
    assert served["spec_num_proposed_drafts"] == p.k * served["spec_verify_ct"]
    n_out = sum(len(o) for o in served["outputs"])
    assert served["completion_tokens"] == n_out
    assert served["engine_accept_length"] == n_out / served["spec_verify_ct"]


def test_served_output_equals_plain_greedy_and_hf(run, served, target):
    p, rd, held, eos, client = run
    plain = client.generate(held, p.eval_max_new_tokens, eos)
    hf = [greedy_generate(target[0], h, p.eval_max_new_tokens, eos) for h in held]
    assert served["outputs"] == plain == hf


def test_layer_offset_drafter_served_equals_simulated_offset(run, served, target, tmp_path):
    """The same weights with SGLang ids one lower ([-1, 0, 2]: boundaries [0, 1, 3], SGLang's
    capture of layer 0's input is the embedding): 04's layer-offset baseline, served."""
    p, rd, held, eos, client = run
    moved = offset_boundaries("sglang", [1, 2, 4], 5)
    assert moved == [0, 1, 3]
    off = tmp_path / "drafter-ids-one-lower"
    shutil.copytree(rd.drafter, off)
    cfg = json.loads((off / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [b - 1 for b in moved]
    (off / "config.json").write_text(json.dumps(cfg))
    got = client.serve_acceptance(off, held, p.k, p.eval_max_new_tokens, eos)
    _assert_same_cycles(got, _simulated(target, rd, held, moved, p, eos), "offset [0, 1, 3]")
    assert got["tau"] < served["tau"]
    assert got["outputs"] == served["outputs"]  # still lossless: only acceptance drops


def test_refusals_come_before_an_engine_start(run):
    p, rd, held, eos, client = run
    with pytest.raises(ValueError, match="k=0"):
        client.serve_acceptance(rd.drafter, held[:1], 0, 8, eos)
