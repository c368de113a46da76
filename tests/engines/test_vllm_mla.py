"""The MLA drafter head (eagle3nb/drafter/mla.py) trained on the DeepSeek-V3 twin and served by real
vLLM 0.32.0 on CPU (its own venv): vLLM loads the export as its ``Eagle3DeepseekV2ForCausalLM``
(``model_executor/models/deepseek_eagle3.py``) and serves it beside the twin with CPU_MLA for target
and drafter (eagle3nb's backend asks it for both); its output equals HF's greedy output and its
own per-position acceptance counters equal the workbook simulator's, so the engine computes the
drafter eagle3nb trained; and the drafter's RoPE equals vLLM's own DeepSeek YaRN rotary. The twin: ``twin:eagle3nb/data/deepseek_v3.config.json`` (12 layers,
hidden 224, MLA ranks 1536/512 + 64, YaRN), the drafter 2 heads, draft vocab 256.

SGLang 0.5.23 cannot serve it on CPU: its ``kimi_k25_eagle3.py:415`` ``set_embed`` calls
``torch.cuda.synchronize()`` unconditionally (measured: "Cannot re-initialize CUDA in forked
subprocess"), so it is refused by preflight (tests/test_cpu_refusals.py names the reason)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from testkit import requires_engine
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.dataset.write import write_dataset
from eagle3nb.drafter.acceptance import evaluate_acceptance, greedy_generate
from eagle3nb.drafter.export import export_drafter, load_drafter
from eagle3nb.drafter.mla import MLA_ARCH, MLAConfig, MLADrafter, mla_rope, rope_inv_freq
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
from eagle3nb.engines.pool import open_engine
from eagle3nb.target import models
from eagle3nb.target.capture import HFCaptureEngine
from eagle3nb.training.loop import TrainConfig, train_drafter

pytestmark = requires_engine("vllm")
TWIN = "twin:eagle3nb/data/deepseek_v3.config.json"
B, N, K, NEW = [2, 6, 9], 12, 3, 24  # vLLM DeepSeek: id = boundary (engine_rules)


@pytest.fixture(scope="module")
def twin():
    folder = models.resolve_model(TWIN)
    model, tok = models.load_target(folder, "float32")[:2]
    return folder, model, tok, models.stop_token_ids(model, tok)


@pytest.fixture(scope="module")
def trained(twin, tmp_path_factory):
    folder, model, tok, eos = twin
    src = Path(models.__file__).parent.parent / "data" / "prompts_tinystories.txt"
    lines = [ln for ln in src.read_text().splitlines() if ln and not ln.startswith("#")]
    prompts = [tok(ln).input_ids for ln in lines[:40]]
    rows = []
    for i, p in enumerate(prompts[:32]):
        gen = greedy_generate(model, p, 24, eos)
        rows.append((i, p + gen, [0] * len(p) + [1] * len(gen)))
    tmp = tmp_path_factory.mktemp("mla")
    eng = HFCaptureEngine(model, "vllm")
    man = {"target": {"architecture": "DeepseekV3ForCausalLM"}, "engine": {}, "convention": "vllm",
           "layer_ids": B, "aux_boundaries": B, "final_boundary": N, "dtype": "float32",
           "template": {}}  # fmt: skip
    write_dataset(tmp / "ds", rows, lambda xs: eng.capture(xs, B), man, shard_size=32)
    cfg = TrainConfig(batch_size=8, max_steps=40, warmup_steps=5, ttt_steps=K, lr=3e-3,
                      draft_vocab_size=256, draft_num_heads=2, log_every=10, eval_every=0,
                      seed=0, drafter_head="mla")  # fmt: skip
    drafter, rep = train_drafter(AuxDataset(tmp / "ds"), model, cfg, tmp / "train")
    man = {"target": {"architecture": "DeepseekV3ForCausalLM"}}
    out = export_drafter(drafter, tmp / "drafter", B, N, man, None, None, None, K)
    return out, rep, prompts[32:]


@pytest.fixture(scope="module")
def vllm(twin, tmp_path_factory):
    with open_engine(
        "vllm", twin[0], "float32", options={"max_model_len": 256},
        python=DEFAULT_ENGINE_PYTHONS["vllm"], param="vllm_python",
        workdir_parent=tmp_path_factory.mktemp("engine"),
    ) as c:  # fmt: skip
        yield c


def test_mla_training_on_the_twin_lowers_the_loss(trained):
    _, rep, _ = trained
    losses = [h["loss"] for h in rep["history"]]
    assert losses[-1] < losses[0], losses


def test_vllm_serves_the_mla_drafter_as_the_simulator_computes_it(twin, trained, vllm):
    folder, model, _, eos = twin
    out, _, held = trained
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [MLA_ARCH] and cfg["eagle_aux_hidden_state_layer_ids"] == B
    served, _ = load_drafter(out, model.get_input_embeddings().weight.detach())
    assert isinstance(served, MLADrafter)
    sim = evaluate_acceptance(model, served, held, B, K, NEW, eos, check_greedy=True)
    assert sim["greedy_mismatches"] == []
    got = vllm.serve_acceptance(out, held, K, NEW, eos)
    assert vllm.info(live=True)["attention_backend"] == "CPU_MLA"
    assert got["outputs"] == [greedy_generate(model, p, NEW, eos) for p in held]  # lossless
    # vLLM's own counters equal the simulator's, position by position
    sim_counts = [round(a * sim["cycles"]) for a in sim["per_position_acceptance"]]
    assert got["num_drafts"] == sim["cycles"], (got, sim["cycles"])
    assert got["accepted_per_pos"] == sim_counts, (got["accepted_per_pos"], sim_counts)
    assert got["tau"] == pytest.approx(sim["tau"], abs=1e-9)
    print(f"\nMLA drafter on the DeepSeek-V3 twin: vLLM tau {got['tau']:.4f} "
          f"{got['accepted_per_pos']}/{got['num_drafts']}, simulator tau {sim['tau']:.4f}")  # fmt: skip


# vLLM's own rotary embedding for DeepSeek (get_rope with deepseek_yarn, is_neox_style False, as
# deepseek_v2.py:1115-1127 builds it for the MLA attention both target and drafter use)
_VLLM_ROPE = """
import json, sys, torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding import get_rope
rp = {"rope_type": "deepseek_yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}
with set_current_vllm_config(VllmConfig()):
    r = get_rope(64, max_position=163840, rope_parameters=rp, is_neox_style=False,
                 dtype=torch.float32)
q, pos = torch.tensor(json.loads(sys.argv[1])), torch.tensor(json.loads(sys.argv[2]))
qo, ko = r.forward_native(pos, q.clone(), q[:, :1].clone())
print(json.dumps({"cls": type(r).__name__, "q": qo.tolist()}))
"""


def test_rope_equals_vllms_deepseek_yarn_rotary():
    """The drafter's RoPE (interleaved pairs, DeepSeek YaRN: the twin's and DeepSeek-V3's rope
    parameters) equals vLLM's DeepseekScalingRotaryEmbedding on the same vectors and positions."""
    yarn = {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
    q = torch.randn(5, 2, 64, generator=torch.Generator().manual_seed(0))  # [T, heads, rope]
    pos = [0, 3, 100, 5000, 20000]  # past the 4096 original positions too
    out = subprocess.run(
        [DEFAULT_ENGINE_PYTHONS["vllm"], "-c", _VLLM_ROPE, json.dumps(q.tolist()), json.dumps(pos)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["cls"] == "DeepseekScalingRotaryEmbedding"
    c = MLAConfig(hidden_size=16, target_hidden_size=16, intermediate_size=16,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=64, vocab_size=8,
                  draft_vocab_size=8, qk_rope_head_dim=64, rope_scaling=yarn)  # fmt: skip
    inv, mul, _ = rope_inv_freq(c)
    ours = mla_rope(q.transpose(0, 1)[None], torch.tensor([pos]), inv, mul)[0].transpose(0, 1)
    assert torch.allclose(ours, torch.tensor(got["q"]), atol=1e-5), (
        (ours - torch.tensor(got["q"])).abs().max()
    )
