"""Bad input of every kind fails early with a message naming the parameter or file, the value and the fix.

Static cases live in ``tests/bad_inputs/``: ``params/*.yaml`` (first line ``# expect: <regex>``),
``models/<case>/config.json`` (config only, no weights) and ``manifests/<case>/manifest.json`` (key
``expect``). Broken drafters are made at runtime from a fresh export (safetensors are binary).
``exports/*.yaml`` are params 03's export refuses for one engine (named, the other exported).
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3nb.target import models
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.drafter.export import export_drafter, load_drafter
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.params import RunParams, load_params
from eagle3nb.preflight import check_against_model, check_inputs
from eagle3nb.drafter.vocab import build_draft_vocab

BAD = Path(__file__).parent / "bad_inputs"
PARAM_FILES = sorted((BAD / "params").glob("*.yaml"))
STORIES = models.resolve_model("stories260K-hd32")


def _expect(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    m = re.match(r"#\s*expect:\s*(.+)$", first)
    assert m, f"{path} must start with '# expect: <regex>'"
    return m.group(1).strip()


def test_every_params_kind_is_present():
    names = {f.stem for f in PARAM_FILES}
    assert {
        "unknown_key",
        "wrong_type",
        "k_zero",
        "layer_ids_unsorted",
        "layer_ids_duplicate",
        "layer_ids_out_of_range",
        "draft_vocab_too_big",
        "missing_model",
        "missing_prompts",
        "completion_with_template",
        "run_name_slash",
        "dataset_empty",
        "heldout_split_prompts",
        "heldout_split_dataset",
        "online_engine_torchrun",
    } <= names


@pytest.mark.parametrize("path", PARAM_FILES, ids=[f.stem for f in PARAM_FILES])
def test_bad_params_file(path):
    with pytest.raises((ValueError, FileNotFoundError), match=_expect(path)):
        p = load_params(path)
        check_against_model(p)
        check_inputs(p)  # 01's input: the prompts file or dataset, and its held-out split


@pytest.mark.parametrize(
    "path", sorted((REPO_ROOT / "params").glob("*.yaml")), ids=lambda f: f.stem
)
def test_shipped_params_pass_model_checks(path):
    p = load_params(path)
    if p.device.startswith("cuda") and not torch.cuda.is_available():
        # gpu.yaml: in-process vLLM needs the GPU host's vllm; the rest is checked on CPU with the
        # CPU vLLM venv (bench/params_files.py runs it end to end the same way)
        from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS

        p = load_params(path, device="cpu", vllm_python=DEFAULT_ENGINE_PYTHONS["vllm"])
    info = check_against_model(p)
    # expected from the model folder's own config.json, read here without eagle3nb's helpers
    # (kimi_case's target is a 12-layer DeepSeek twin, the others the 5-layer default)
    cfg = json.loads((Path(info["path"]) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    assert (info["n_layers"], info["vocab_size"]) == (
        cfg["num_hidden_layers"],
        cfg["vocab_size"],
    )
    if not p.model.startswith("twin:"):
        assert (info["n_layers"], info["vocab_size"]) == (5, 512)  # stories260K-hd32
    split = check_inputs(p)  # 01's input as shipped: both sides of the split hold one
    assert split["n_train"] >= 1 and split["n_heldout"] >= 1


def test_model_checks_return_what_the_run_captures():
    info = check_against_model(RunParams())
    assert info["boundaries"] == [1, 2, 4] and info["layer_ids"] == [
        0,
        1,
        3,
    ]  # sglang: id = boundary - 1
    info = check_against_model(
        RunParams(convention="vllm", layer_ids=[1, 3, 5], extract_engine="hf")
    )  # boundary N: HF only
    assert info["boundaries"] == [1, 3, 5]


def test_run_notebooks_checks_the_model_before_any_notebook(tmp_path):
    pytest.importorskip("papermill")
    from eagle3nb.run import run_notebooks

    with pytest.raises(ValueError, match=r"layer_ids=\[0, 1, 4\]"):
        run_notebooks(
            BAD / "params" / "layer_ids_out_of_range.yaml",
            overrides={"outputs_dir": str(tmp_path), "run_name": "bad"},
        )
    assert not (tmp_path / "bad").exists()


# --- model folders (config.json only: the checks must fire before any weight is read) -------------

MODEL_CASES = {
    "no_tokenizer": r"model='.*no_tokenizer' has no tokenizer\.json or tokenizer\.model; copy the tokenizer files into it",
    "bert_arch": r"model='.*bert_arch' has architectures=\['BertModel'\]; eagle3nb captures decoder-only models of \[.*'LlamaForCausalLM'.*\]; use one of those",
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_bad_model_folder(case):
    folder = (BAD / "models" / case).resolve()
    assert not list(folder.glob("*.safetensors"))
    with pytest.raises(ValueError, match=MODEL_CASES[case]):
        check_against_model(RunParams(model=str(folder)))
    with pytest.raises(ValueError, match=MODEL_CASES[case]):
        models.load_target(str(folder))


def _tiny_model(tmp_path, n_layers):
    cfg = json.loads((STORIES / "config.json").read_text())
    cfg["num_hidden_layers"] = n_layers
    d = tmp_path / f"model-{n_layers}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer.json").write_text("{}")  # only its presence is checked
    return str(d)


def test_too_few_layers_for_the_default_picker(tmp_path):
    m = _tiny_model(tmp_path, 2)
    with pytest.raises(
        ValueError,
        match=r"layer_ids=None: no default aux layers for model=.* \(num_hidden_layers=2\).*>= 3 layers.*set layer_ids explicitly",
    ):
        check_against_model(RunParams(model=m))
    assert check_against_model(
        RunParams(model=m, convention="vllm", layer_ids=[1, 2], extract_engine="hf")
    )["boundaries"] == [1, 2]


def test_default_boundaries_the_convention_cannot_capture(tmp_path):
    # 3 layers: the picker gives [1, 2, 3]; SGLang never captures boundary N
    with pytest.raises(ValueError, match=r"layer_ids=None: .*cannot be captured by 'sglang'"):
        check_against_model(RunParams(model=_tiny_model(tmp_path, 3)))


def test_kv_heads_from_target_must_divide(tmp_path):
    # draft_num_heads 0 = the target's 8 heads; 3 kv heads do not divide them
    with pytest.raises(
        ValueError, match=r"draft_num_heads=0 \(8 heads\) is not a multiple of draft_num_kv_heads=3"
    ):
        check_against_model(RunParams(draft_num_heads=0, draft_num_kv_heads=3))


# --- dataset manifests -----------------------------------------------------------------------------

MANIFESTS = sorted(p.parent for p in (BAD / "manifests").glob("*/manifest.json"))


@pytest.mark.parametrize("folder", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_bad_dataset_manifest(folder):
    expect = json.loads((folder / "manifest.json").read_text())["expect"]
    with pytest.raises(ValueError, match=expect):
        AuxDataset(folder)


# --- exported drafters, broken after export --------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from transformers import AutoConfig

    tc = AutoConfig.from_pretrained(str(STORIES), local_files_only=True)
    torch.manual_seed(1)
    d = Eagle3Drafter(DrafterConfig.for_target(tc, 256))
    counts = torch.randint(0, 100, (512,))  # a scattered draft vocab (offsets not all zero)
    d.set_vocab(*build_draft_vocab(counts, 256))
    out = export_drafter(
        d, tmp_path_factory.mktemp("drafter") / "d", [1, 2, 4], 5, {"kind": "test"}, 1, 2
    )
    load_drafter(out)  # the unbroken export loads
    return out


def _break_weights(sd):
    sd["d2t"] = torch.arange(256) + sd["d2t"]  # absolute target ids where offsets belong


DRAFTER_CASES = {
    "missing_lm_head": (
        lambda sd: sd.pop("lm_head.weight"),
        None,
        r"drafter .* lacks required tensors \['lm_head\.weight'\]; re-export it",
    ),
    "missing_d2t": (
        lambda sd: sd.pop("d2t"),
        None,
        r"lacks required tensors \['d2t'\]; re-export it",
    ),
    "missing_t2d": (
        lambda sd: sd.pop("t2d"),
        None,
        r"lacks required tensors \['t2d'\]; re-export it",
    ),
    "fc_width": (
        lambda sd: sd.__setitem__("fc.weight", torch.zeros(64, 2 * 64)),
        None,
        r"fc\.weight: file \(64, 128\) vs config \(64, 192\) \(fc input width must be n_aux x target_hidden_size = 3 x 64\).*re-export the drafter",
    ),
    "draft_vocab_size_config": (
        None,
        lambda cfg: cfg.__setitem__("draft_vocab_size", 200),
        r"lm_head\.weight: file \(256, 64\) vs config \(200, 64\) \(lm_head rows must equal draft_vocab_size=200\).*correct config\.json",
    ),
    "d2t_absolute_ids": (
        _break_weights,
        None,
        r"drafter .*model\.safetensors: d2t .*must hold offsets \(target = draft \+ d2t\[draft\]\).*rebuild",
    ),
    "d2t_out_of_range": (
        lambda sd: sd["d2t"].__setitem__(-1, 10_000),
        None,
        r"drafter .*model\.safetensors: d2t maps draft ids to target ids .*outside 0\.\.511.*rebuild it with build_draft_vocab",
    ),
}


@pytest.mark.parametrize("case", list(DRAFTER_CASES))
def test_broken_drafter_refused(exported, tmp_path, case):
    break_sd, break_cfg, expect = DRAFTER_CASES[case]
    out = shutil.copytree(exported, tmp_path / case)
    if break_sd:
        sd = load_file(str(out / "model.safetensors"))
        break_sd(sd)
        save_file(sd, str(out / "model.safetensors"))
    if break_cfg:
        cfg = json.loads((out / "config.json").read_text())
        break_cfg(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=expect):
        load_drafter(out)


# --- 01's input: empty, or too small for the held-out split (issue 32 items 3 and 4) ---------------


def _hand_split_message(items, unit, source, f=0.15, seed=0):
    """The refusal computed here by hand: the hash rule of split_prompts written out, and the grid
    fraction nearest ``f`` that puts one item on each side."""
    import hashlib

    h = [
        int.from_bytes(hashlib.sha256(f"{seed}\x00{x}".encode()).digest()[:8], "big") / 2**64
        for x in items
    ]
    held = sum(x < f for x in h)
    grid = sorted((round(0.05 * i, 2) for i in range(1, 20)), key=lambda g: abs(g - f))
    g = next(g for g in grid if 0 < sum(x < g for x in h) < len(h))
    n = len(items)
    return (
        f"heldout_fraction={f} holds out {held} of the {n} {unit} of {source} ({n - held} left to "
        f"train on); 03 needs one to train on and one held out, 04 one held out: set "
        f"heldout_fraction: {g} (holds out {sum(x < g for x in h)} of {n} at seed={seed}), or add {unit}"
    )


def test_split_refusal_names_both_numbers_and_the_fix(tmp_path):
    three = BAD / "prompts" / "three.txt"
    prompts = [x for x in three.read_text().splitlines() if x and not x.startswith("#")]
    want = _hand_split_message(
        prompts, "prompts", "prompts_file='tests/bad_inputs/prompts/three.txt'"
    )
    assert "holds out 0 of the 3 prompts" in want  # the file reproduces the case
    with pytest.raises(ValueError) as e:
        check_inputs(load_params(BAD / "params" / "heldout_split_prompts.yaml"))
    assert str(e.value) == want
    chat = BAD / "chat" / "three_conversations.jsonl"
    ids = [json.loads(x)["id"] for x in chat.read_text().splitlines()]
    src = "dataset='tests/bad_inputs/chat/three_conversations.jsonl'"
    with pytest.raises(ValueError) as e:
        check_inputs(load_params(BAD / "params" / "heldout_split_dataset.yaml"))
    assert str(e.value) == _hand_split_message(ids, "conversations", src)
    one = tmp_path / "one.txt"
    one.write_text("Tom had a red ball.\n")
    with pytest.raises(ValueError) as e:
        check_inputs(RunParams(prompts_file=str(one)))
    assert str(e.value) == (
        f"prompts_file={str(one)!r} holds 1 prompts; a run needs at least 2 (one to train on, one "
        "held out for evaluation at heldout_fraction=0.15): add prompts"
    )


@pytest.mark.parametrize(
    "case", ["heldout_split_prompts", "heldout_split_dataset", "dataset_empty"]
)
def test_01_refuses_before_the_target_loads(tmp_path, case):
    # 01 in a notebook (no runner): refused before the run folder is made or the model read
    from eagle3nb.steps.generate.step import generate_step

    p = load_params(
        BAD / "params" / f"{case}.yaml", outputs_dir=str(tmp_path), model="no/such/model"
    )
    with pytest.raises(ValueError, match=_expect(BAD / "params" / f"{case}.yaml")):
        generate_step(p, progress=False)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("case", ["heldout_split_prompts", "dataset_empty"])
def test_runner_refuses_01_input_before_any_notebook(tmp_path, case):
    pytest.importorskip("papermill")
    from eagle3nb.run import run_notebooks

    f = BAD / "params" / f"{case}.yaml"
    with pytest.raises(ValueError, match=_expect(f)):
        run_notebooks(f, overrides={"outputs_dir": str(tmp_path), "run_name": "bad"})
    assert not any(tmp_path.iterdir())


def test_malformed_benchmark_lines_are_refused_by_file_and_line():
    """Two malformed MT-Bench lines: refused one by one, named by file and line (04 prints them
    on the terminal: tests/steps/test_eval_progress.py), the other records kept."""
    from eagle3nb.text.benchmarks import load_benchmark

    got = load_benchmark(BAD / "bench" / "two_malformed_mtbench.jsonl")
    assert (got.format, len(got.records)) == ("mtbench", 6)
    assert [(x["where"], x["reason"]) for x in got.refused] == [
        ("two_malformed_mtbench.jsonl:line 3", "empty field: turns"),
        ("two_malformed_mtbench.jsonl:line 6", "not JSON (Expecting ',' delimiter at column 72)"),
    ]


# --- params whose boundaries 03's export refuses for one engine (issue 43 item 5) ------------------
# tests/bad_inputs/exports/*.yaml (first line ``# expect: <regex>``): the run goes on for the other
# engine; the refused one is named on 03's terminal (export_notices' first line)

EXPORT_FILES = sorted((BAD / "exports").glob("*.yaml"))


@pytest.mark.parametrize("path", EXPORT_FILES, ids=[f.stem for f in EXPORT_FILES])
def test_export_refuses_an_engine_by_name(path, target, tmp_path):
    from eagle3nb.drafter.export import drafter_config_json
    from eagle3nb.rundir import RunDir
    from eagle3nb.steps.shared.checks import resolve_aux
    from eagle3nb.steps.train.step import export_notices

    model, _, _ = target
    p = load_params(path, outputs_dir=str(tmp_path))
    check_against_model(p)  # not refused before the run: only one engine is
    n = model.config.num_hidden_layers
    _, bnds = resolve_aux(p, n)
    c = DrafterConfig.for_target(model.config, 256)
    cfg = drafter_config_json(c, bnds, n, 1, 2, target_arch="LlamaForCausalLM")
    lines = export_notices(p, RunDir(p), cfg, n)
    assert re.search(_expect(path), lines[0]), lines


# --- drafter folders the audit and init_from read (issue 43 items 3-6) ------------------------------
# tests/bad_inputs/drafters/<case>/: config.json (and manifest.json) as published, expect.json: which
# check refuses it ("readings": the audit's reading of each engine, "patched": its corrected copy,
# "init_from", "read"), the engine and field, and the message (regex). Weights are made here from
# config.json (safetensors are binary): a seeded drafter of those shapes, a draft vocab mapping
# draft id i to target id i, written as expect.json's "weights" says.

DRAFTER_FOLDERS = sorted(p.parent for p in (BAD / "drafters").glob("*/expect.json"))


def _weights_for(folder: Path, dst: Path, how: str | None) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    layer = {**cfg, **cfg.get("transformer_layer_config", {})}
    keys = ("hidden_size", "target_hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size")  # fmt: skip
    torch.manual_seed(0)
    d = Eagle3Drafter(DrafterConfig(**{k: int(layer[k]) for k in keys}))
    tmp = export_drafter(d, dst.parent / f"{dst.name}-export", [1, 2, 4], 5, {"kind": "test"})
    sd = load_file(str(tmp / "model.safetensors"))
    if how == "identity_d2t":  # SpecForge writes them even for the full vocabulary
        v = sd["lm_head.weight"].shape[0]
        sd.update(d2t=torch.zeros(v, dtype=torch.long), t2d=torch.ones(v, dtype=torch.bool))
    if how == "layers.0":  # speculators' decoder names
        sd = {k.replace("midlayer.", "layers.0."): v for k, v in sd.items()}
    if how == "pytorch_model.bin":
        torch.save(sd, dst / "pytorch_model.bin")
    else:
        save_file(sd, str(dst / "model.safetensors"))


@pytest.mark.parametrize("folder", DRAFTER_FOLDERS, ids=lambda p: p.name)
def test_bad_drafter_folder(folder, tmp_path):
    from eagle3nb.audit.formats import loadable_copy, read_drafter_folder
    from eagle3nb.audit.measure import engine_readings
    from eagle3nb.audit.patch import write_patched
    from eagle3nb.audit.servable import annotate_readings
    from eagle3nb.training.init_from import adoption_plan

    exp = json.loads((folder / "expect.json").read_text())
    dst = shutil.copytree(
        folder, tmp_path / folder.name, ignore=shutil.ignore_patterns("expect.json")
    )
    _weights_for(folder, dst, exp.get("weights"))
    tcfg = models.text_config(models.read_model_config(STORIES))
    versions = {"sglang": "0.5.23", "vllm": "0.32.0"}
    if exp["check"] == "read":
        with pytest.raises(FileNotFoundError, match=exp["expect"]):
            read_drafter_folder(dst, 5, "LlamaForCausalLM")
        return
    if exp["check"] == "init_from":
        mine = {"name": "stories260K-hd32", "sha256": models.model_hash(STORIES)}
        with pytest.raises(ValueError, match=exp["expect"]):
            adoption_plan(dst, tcfg, 512, [1, 2, 4], target=mine)
        return
    f = read_drafter_folder(dst, 5, "LlamaForCausalLM")
    if exp["check"] == "readings":
        got = engine_readings(f.config, 5, "LlamaForCausalLM", versions)
        annotate_readings(got, f, 3, True, "LlamaForCausalLM", tcfg)
    else:  # the audit's corrected copy written for the set the folder declares
        loadable = loadable_copy(f, tmp_path / "loadable")
        readings = {e: {"version": v} for e, v in versions.items()}
        got = write_patched(
            loadable, tmp_path / "out", f.declared, 5, "LlamaForCausalLM", readings, {}
        )
    assert re.search(exp["expect"], got[exp["engine"]][exp["field"]] or ""), got[exp["engine"]]
