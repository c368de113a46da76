"""The audit and 03's ``init_from`` on MLA drafters (``Eagle3DeepseekV2ForCausalLM``,
drafter/mla.py), the head DeepSeek-V3 / Kimi-K2 targets serve: a drafter exported by eagle3nb for
a tiny random-weight DeepSeek-V3 target (built from a config here, no download), and the same
folder as SGLang / SpecForge publish it (ids only in ``eagle_config``, decoder weights named
``layers.0.*``, the names SGLang's ``kimi_k25_eagle3.py`` load_weights maps to its midlayer) and
with vLLM's top-level ids only. Each is read back, through the audit's loadable copy, as the
drafter ``load_drafter`` reads from the export (same weights, same logits), declares the exported
boundaries (SGLang's DeepSeek rule, not the Llama one), is refused for another target naming the
field, is adopted by ``init_from`` with the same weights, and fine-tuning starts from its own loss.

speculators has no MLA form: its Eagle-3 layers are Llama and Qwen3 only
(vllm-project/speculators ``src/speculators/models/eagle3/model_definitions.py`` ``model_classes``),
and vLLM 0.32's speculators reader refuses any other ``model_type``
(``transformers_utils/configs/speculators/algos.py:39-45``); such a folder is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3nb.audit.core import run_audit
from eagle3nb.audit.formats import check_belongs, loadable_copy, read_drafter_folder
from eagle3nb.drafter.export import export_drafter, load_drafter
from eagle3nb.drafter.mla import MLA_ARCH, MLAConfig, MLADrafter
from eagle3nb.drafter.vocab import build_draft_vocab, count_loss_tokens
from eagle3nb.training.init_from import INPUT_SIDE, adopt_drafter, adoption_plan
from eagle3nb.training.loop import TrainConfig, make_source, train_drafter
from eagle3nb.training.objective import TTTObjective
from eagle3nb.target.capture import final_norm_of

ARCH, N = "DeepseekV3ForCausalLM", 6
BOUNDARIES = [2, 3, 5]  # both engines can capture them on DeepSeek (SGLang: not N, first not 1)
VERSIONS = {"sglang": "0.5.23", "vllm": "0.32.0"}
YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
CFG = dict(batch_size=8, eval_every=0, warmup_steps=1, log_every=1, ttt_steps=2, lr=1e-3,
           draft_vocab_size=128, fc_norm=True, norm_output=True)  # fmt: skip


@pytest.fixture(scope="module")
def ds_target(target, tmp_path_factory):
    """A 6-layer DeepSeek-V3 (MLA ranks, YaRN, sigmoid router, 4 experts) with the shipped tiny
    tokenizer's vocabulary, random weights; its config.json written to a folder."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    tok = target[1]
    cfg = DeepseekV3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=N,
        num_attention_heads=4, num_key_value_heads=4, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, rope_scaling=YARN, max_position_embeddings=4096,
        architectures=[ARCH],
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(cfg).float().eval()
    path = tmp_path_factory.mktemp("ds_target")
    cfg.save_pretrained(path)
    return model, tok, path


@pytest.fixture(scope="module")
def mla_export(ds_target, tmp_path_factory):
    """An HF-captured dataset at ``BOUNDARIES`` and an MLA drafter for the target (random weights,
    norms too, so a misplaced weight shows; draft vocab from the dataset), exported by eagle3nb.
    Returns (export folder, dataset folder)."""
    from eagle3nb.dataset.read import AuxDataset
    from eagle3nb.dataset.write import write_dataset
    from eagle3nb.target.capture import HFCaptureEngine

    model, tok, _ = ds_target
    root = tmp_path_factory.mktemp("mla")
    g = torch.Generator().manual_seed(1)
    samples = [
        (i, torch.randint(3, len(tok), (20,), generator=g).tolist(), [0] * 8 + [1] * 12)
        for i in range(16)
    ]
    eng = HFCaptureEngine(model, "vllm")  # vLLM ids = boundaries
    man = {
        "target": {}, "engine": {}, "convention": "vllm", "layer_ids": BOUNDARIES,
        "aux_boundaries": BOUNDARIES, "final_boundary": N, "dtype": "float32", "template": {},
    }  # fmt: skip
    write_dataset(root / "ds", samples, lambda xs: eng.capture(xs, BOUNDARIES), man, 64)
    c = MLAConfig.for_target(model.config, 128, 3)
    c = MLAConfig(**{**c.to_dict(), "fc_norm": True, "norm_output": True})
    d = MLADrafter(c, model.get_input_embeddings().weight.detach().float())
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in d.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    counts = count_loss_tokens(AuxDataset(root / "ds").token_masks(), c.vocab_size)
    d.set_vocab(*build_draft_vocab(counts, 128))
    export_drafter(d, root / "export", BOUNDARIES, N, {"target": {"architecture": ARCH}})
    return root / "export", root / "ds"


def peer_form(export: Path, dst: Path, fmt: str) -> Path:
    """The export as a peer publishes it: ``sglang`` (SpecForge / SGLang: ids only in
    ``eagle_config``, weights ``layers.0.*``), ``vllm`` (top-level ids only); no eagle3nb block."""
    cfg = json.loads((export / "config.json").read_text())
    cfg.pop("eagle3nb")
    sd = load_file(str(export / "model.safetensors"))
    if fmt == "sglang":
        cfg.pop("eagle_aux_hidden_state_layer_ids")
        sd = {k.replace("midlayer.", "layers.0.", 1): v for k, v in sd.items()}
        assert any(k.startswith("layers.0.self_attn.kv_b_proj") for k in sd)
    else:
        cfg["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(sd, str(dst / "model.safetensors"))
    return dst


def _tcfg(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _logits(d, seed: int = 0):
    """Two TTT steps of ``d`` on one fixed input: the logits of each [2, 7, draft vocab]."""
    g = torch.Generator().manual_seed(seed)
    B, T = 2, 7
    tok = torch.randint(0, d.config.vocab_size, (B, T), generator=g)
    aux = torch.randn(B, T, 3 * d.config.target_hidden_size, generator=g)
    pos, qi = torch.arange(T)[None].expand(B, T), torch.arange(T)
    with torch.no_grad():
        h, l1, kv = d.step(tok, aux, pos, [], qi)
        _, l2, _ = d.step(tok, h, pos + 1, [kv], qi)
    return l1, l2


@pytest.mark.parametrize("fmt", ["eagle3nb", "sglang", "vllm"])
def test_each_form_reads_back_as_the_exported_mla_drafter(mla_export, ds_target, tmp_path, fmt):
    model, tok, tpath = ds_target
    export = mla_export[0]
    folder = export if fmt == "eagle3nb" else peer_form(export, tmp_path / fmt, fmt)
    got = read_drafter_folder(folder, N, ARCH)
    # SGLang's DeepSeek rule reads first id 2 unshifted (the Llama rule would say [3, 4, 6])
    assert (got.format, got.declared) == (fmt, BOUNDARIES), got.declared_how
    check_belongs(got, _tcfg(tpath), len(tok))
    emb = model.get_input_embeddings().weight.detach().float()
    ref, _ = load_drafter(export, emb)
    d, _ = load_drafter(loadable_copy(got, tmp_path / "loadable"), emb)
    assert type(d) is MLADrafter and d.config == ref.config
    sd, sr = d.state_dict(), ref.state_dict()
    assert sd.keys() == sr.keys() and all(torch.equal(sd[k], sr[k]) for k in sr)
    (a1, a2), (b1, b2) = _logits(d), _logits(ref)
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert json.loads((folder / "config.json").read_text()) == got.config  # never touched


def test_refusals_name_the_field(mla_export, ds_target, tmp_path):
    _, tok, tpath = ds_target
    folder = peer_form(mla_export[0], tmp_path / "sglang", "sglang")
    got = read_drafter_folder(folder, N, ARCH)
    tcfg = _tcfg(tpath)
    for key, value, match in [
        ("hidden_size", 128, r"hidden_size is 128"),
        ("vocab_size", 1024, r"vocab_size=512 but the target's vocab_size is 1024"),
    ]:
        with pytest.raises(ValueError, match=match):
            check_belongs(got, {**tcfg, key: value}, len(tok))
    # other ranks than the target's: accepted (the engines size the drafter from its own config)
    check_belongs(got, {**tcfg, "kv_lora_rank": 64, "qk_rope_head_dim": 16}, len(tok))
    llama = {k: v for k, v in tcfg.items() if k not in ("kv_lora_rank", "q_lora_rank")}
    llama["architectures"] = ["LlamaForCausalLM"]
    with pytest.raises(ValueError, match=rf"{MLA_ARCH}.*\(LlamaForCausalLM\) has no kv_lora_rank"):
        check_belongs(got, llama, len(tok))
    good = json.loads((folder / "config.json").read_text())
    for edit, match in [
        ({"q_lora_rank": None}, r"lacks \['q_lora_rank'\].*take them from the target"),
        ({"norm_before_fc": True}, r"norm_before_fc=True with drafter_head='mla'"),
        ({"rope_interleave": False}, r"rope_interleave=false"),
    ]:
        (folder / "config.json").write_text(json.dumps({**good, **edit}))
        with pytest.raises(ValueError, match=match):
            check_belongs(read_drafter_folder(folder, N, ARCH), tcfg, len(tok))


def test_a_speculators_mla_folder_is_refused_by_name(mla_export, tmp_path):
    """speculators writes no MLA layer; a folder claiming one is refused, not read as Llama."""
    cfg = json.loads((mla_export[0] / "config.json").read_text())
    layer = {k: cfg[k] for k in ("model_type", "hidden_size", "kv_lora_rank", "q_lora_rank")}
    spec = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "speculators_config": {}, "transformer_layer_config": layer,
            "draft_vocab_size": 128, "eagle_aux_hidden_state_layer_ids": BOUNDARIES}  # fmt: skip
    folder = tmp_path / "spec"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(spec))
    shutil.copy2(mla_export[0] / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"transformer_layer_config.model_type='deepseek_v2'"):
        read_drafter_folder(folder, N, ARCH)
    # a Qwen3 layer (vLLM's Eagle3Qwen3ForCausalLM, q/k norms) is refused by name too
    qwen3 = {"model_type": "qwen3", "hidden_size": cfg["hidden_size"]}
    (folder / "config.json").write_text(json.dumps({**spec, "transformer_layer_config": qwen3}))
    with pytest.raises(ValueError, match=r"model_type='qwen3'.*Eagle3Qwen3ForCausalLM"):
        read_drafter_folder(folder, N, ARCH)


def _loss(drafter, model, batch, cfg) -> float:
    """The TTT loss of ``drafter`` on ``batch`` (the objective the loop lowers), no update."""
    obj = TTTObjective(
        drafter, final_norm_of(model), model.get_output_embeddings(), cfg.ttt_steps, cfg.loss_decay
    )
    with torch.no_grad():
        return obj(batch, None).loss.item()


def test_init_from_adopts_it_and_fine_tuning_starts_from_its_loss(mla_export, ds_target, tmp_path):
    from eagle3nb.dataset.read import AuxDataset

    model, tok, tpath = ds_target
    export, ds_dir = mla_export
    ds = AuxDataset(ds_dir)
    folder = peer_form(export, tmp_path / "sglang", "sglang")
    plan = adoption_plan(folder, _tcfg(tpath), len(tok), BOUNDARIES)
    assert (plan["format"], plan["declared"], plan["moved"]) == ("sglang", BOUNDARIES, False)
    cfg = TrainConfig(max_steps=2, **CFG)
    d, info = adopt_drafter(plan, ds, model, cfg)
    ref, _ = load_drafter(export, model.get_input_embeddings().weight.detach().float())
    assert type(d) is MLADrafter
    sd, sr = d.state_dict(), ref.state_dict()
    assert sd.keys() == sr.keys() and all(torch.equal(sd[k], sr[k]) for k in sr)
    assert info["init_from"]["kept_from_drafter"] == {
        "drafter_head": {"params": "llama", "drafter": "mla"}
    }
    batch = next(iter(make_source(ds, cfg, torch.device("cpu")).batches(0, 1, 0, 1, False)))
    want = _loss(ref, model, batch, cfg)
    _, rep = train_drafter(ds, model, cfg, tmp_path / "train", tracking=(), init=plan)
    assert rep["history"][0]["step"] == 1 and rep["history"][0]["loss"] == want


def test_init_from_moves_an_mla_drafter_keeping_its_attention(mla_export, ds_target, tmp_path):
    """init_boundaries: params: the input side starts fresh as a new MLA drafter of the run's seed;
    the MLA attention and everything else are the drafter's."""
    from eagle3nb.dataset.read import AuxDataset

    model, tok, tpath = ds_target
    export, ds_dir = mla_export
    plan = adoption_plan(export, _tcfg(tpath), len(tok), [2, 4, 5], "params")
    assert plan["moved"] and plan["declared"] == BOUNDARIES
    d, info = adopt_drafter(
        plan, AuxDataset(ds_dir), model, TrainConfig(max_steps=1, seed=3, **CFG)
    )
    ref, _ = load_drafter(export, model.get_input_embeddings().weight.detach().float())
    assert type(d) is MLADrafter
    sd, sr = d.state_dict(), ref.state_dict()
    assert sorted(k for k in sr if not torch.equal(sd[k], sr[k])) == [
        "fc.weight", "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"
    ]  # fmt: skip
    assert all(k.startswith(INPUT_SIDE) for k in sr if not torch.equal(sd[k], sr[k]))
    torch.manual_seed(3)
    fresh = MLADrafter(ref.config)  # a new drafter of the run's seed
    assert torch.equal(sd["fc.weight"], fresh.fc.weight.detach())
    assert info["init_from"]["reinitialised"] == ["fc", "fc_norm"]


def test_run_audit_reads_an_sglang_mla_folder_and_writes_a_loadable_copy(
    mla_export, ds_target, tmp_path
):
    model, tok, tpath = ds_target
    export = mla_export[0]
    folder = peer_form(export, tmp_path / "sglang", "sglang")
    prompts = [[1, 40, 41, 42, 43], [1, 300, 301, 302]]
    r = run_audit(
        folder, tpath, tmp_path / "out", prompts_ids=prompts, k=2, max_new_tokens=6, radius=0,
        versions=VERSIONS, target=ds_target,
    )  # fmt: skip
    assert (r["format"], r["declared"]) == ("sglang", BOUNDARIES)
    assert r["readings"]["sglang"]["boundaries"] == BOUNDARIES  # what SGLang feeds on DeepSeek
    emb = model.get_input_embeddings().weight.detach().float()
    ref, _ = load_drafter(export, emb)
    fixed, cfg = load_drafter(r["patched"]["folder"], emb)
    assert type(fixed) is MLADrafter and cfg["architectures"] == [MLA_ARCH]
    sd, sr = fixed.state_dict(), ref.state_dict()
    assert all(torch.equal(sd[k], sr[k]) for k in sr)
