"""A drafter trained here on known boundaries of the embedded target, and folders of it written at
test time in each format engines and peers publish (no download)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3nb.drafter.export import export_drafter
from eagle3nb.text.prompts import load_prompts, split_prompts

TRAINED = [1, 2, 4]  # boundaries the drafter is trained on (N = 5)
STEPS, LR = 300, 8e-3  # the trained set then leads its neighbours by ~0.05 nats/token (NLL)
CONTINUATION = 48  # target tokens per train prompt
FULL_STEPS = 150  # the full-vocabulary drafter: trained enough for drafts to be accepted


@pytest.fixture(autouse=True)
def one_thread():
    """The 64-wide target and drafter run fastest on one thread (no work to share; on a loaded
    2-core machine more threads spun ~20x slower, measured), and the same on any machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def trained_export(target, tmp_path_factory):
    """A drafter trained offline on HF-captured states at boundaries ``TRAINED`` of the shipped
    prompts' train split continued by the target, exported by eagle3nb (both engines' ids by their
    rules for Llama). Returns the export folder."""
    model, tok, path = target
    root = tmp_path_factory.mktemp("audit")
    train, _ = split_prompts(load_prompts(), 0.15)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see one_thread
    try:
        samples = _continued(model, [tok(t).input_ids for t in train], CONTINUATION)
        return _train_and_export(model, path, samples, root)
    finally:
        torch.set_num_threads(threads)


def _continued(model, prompts: list[list[int]], n: int) -> list[tuple]:
    """(id, prompt + the target's greedy continuation of n tokens, loss mask on the continuation),
    all prompts in one left-padded HF generate (what 01 trains on, as 04 evaluates)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(q)) + q for q in prompts])
    mask = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in prompts])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return [(i, q + out[i, width:].tolist(), [0] * len(q) + [1] * n) for i, q in enumerate(prompts)]


@pytest.fixture(scope="session")
def full_vocab_export(trained_export, target):
    """A full-vocabulary drafter (draft vocab = the target's 512 tokens) trained briefly on the
    dataset of ``trained_export`` (boundaries ``TRAINED``), exported by eagle3nb (no d2t/t2d)."""
    from eagle3nb.dataset.read import AuxDataset
    from eagle3nb.drafter.export import export_drafter
    from eagle3nb.training.loop import TrainConfig, train_drafter

    model, _, path = target
    root = trained_export.parent
    cfg = TrainConfig(
        max_steps=FULL_STEPS, batch_size=16, eval_every=0, draft_intermediate_size=344,
        warmup_steps=10, log_every=100, ttt_steps=2, lr=LR, draft_vocab_size=512,
    )  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see one_thread
    try:
        d, _ = train_drafter(AuxDataset(root / "ds"), model, cfg, root / "train-full", tracking=())
    finally:
        torch.set_num_threads(threads)
    manifest = {"target": {"path": str(path), "architecture": "LlamaForCausalLM"}}
    return export_drafter(d, root / "export-full", TRAINED, 5, manifest, num_speculative_tokens=4)


def with_identity_vocab(export: Path, dst: Path) -> Path:
    """``export`` (a full-vocabulary drafter) as SpecForge writes it: SGLang's nested ids only
    (boundary - 1) and identity ``d2t`` (zeros) / ``t2d`` (all True) of the full vocabulary."""
    folder = write_format(export, dst, "sglang", [b - 1 for b in TRAINED])
    sd = load_file(str(folder / "model.safetensors"))
    assert "d2t" not in sd  # eagle3nb's export writes none for a full vocabulary
    v = sd["lm_head.weight"].shape[0]
    sd.update(d2t=torch.zeros(v, dtype=torch.long), t2d=torch.ones(v, dtype=torch.bool))
    save_file(sd, str(folder / "model.safetensors"))
    return folder


def _train_and_export(model, path, samples, root: Path) -> Path:
    from eagle3nb.dataset.read import AuxDataset
    from eagle3nb.dataset.write import write_dataset
    from eagle3nb.target.capture import HFCaptureEngine
    from eagle3nb.training.loop import TrainConfig, train_drafter

    eng = HFCaptureEngine(model, "vllm")  # vLLM ids = boundaries
    man = {
        "target": {}, "engine": {}, "convention": "vllm", "layer_ids": TRAINED,
        "aux_boundaries": TRAINED, "final_boundary": 5, "dtype": "float32", "template": {},
    }  # fmt: skip
    write_dataset(root / "ds", samples, lambda xs: eng.capture(xs, TRAINED), man, shard_size=128)
    cfg = TrainConfig(
        max_steps=STEPS, batch_size=16, eval_every=0, draft_intermediate_size=344,
        warmup_steps=10, log_every=100, ttt_steps=2, lr=LR,
    )  # fmt: skip
    d, _ = train_drafter(AuxDataset(root / "ds"), model, cfg, root / "train", tracking=())
    manifest = {"target": {"path": str(path), "architecture": "LlamaForCausalLM"}}
    return export_drafter(d, root / "export", TRAINED, 5, manifest, num_speculative_tokens=4)


def write_format(export: Path, dst: Path, fmt: str, ids: list[int] | None) -> Path:
    """The exported drafter re-written as ``fmt`` publishes it, carrying ``ids`` (None: no ids):

    - ``sglang``: SpecForge / SGLang, ids only in ``eagle_config.eagle_aux_hidden_state_layer_ids``;
    - ``vllm``: ids only at the top level;
    - ``speculators``: ``Eagle3Speculator`` with the widths in ``transformer_layer_config``, the
      speculators keys, top-level ids, decoder weights named ``layers.0.*``;
    - ``none``: no ids anywhere.
    No ``eagle3nb`` block (a peer's folder does not record the trained boundaries)."""
    cfg = json.loads((export / "config.json").read_text())
    cfg.pop("eagle3nb")
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg["eagle_config"].pop("eagle_aux_hidden_state_layer_ids", None)
    spec_keys = ("speculators_model_type", "speculators_config", "transformer_layer_config")
    spec = {k: cfg.pop(k) for k in spec_keys}
    dst.mkdir(parents=True)
    sd = load_file(str(export / "model.safetensors"))
    if fmt == "sglang" and ids is not None:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    elif fmt == "vllm" and ids is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = ids
    elif fmt == "speculators":
        layer = spec["transformer_layer_config"]
        keep = ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "torch_dtype")
        cfg = {k: v for k, v in cfg.items() if k in keep}
        cfg.update(spec, architectures=["Eagle3Speculator"], speculators_version="0.3.0")
        assert layer["hidden_size"] and "hidden_size" not in cfg
        if ids is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = ids
        sd = {k.replace("midlayer.", "layers.0."): v for k, v in sd.items()}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(sd, str(dst / "model.safetensors"))
    shutil.copy2(export / "manifest.json", dst / "manifest.json")
    return dst
