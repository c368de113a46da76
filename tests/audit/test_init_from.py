"""03 starting from a drafter someone else trained (``init_from``, eagle3nb.training.init_from): the
drafter trained here at known boundaries (conftest.TRAINED), re-written in each format peers
publish, is adopted with the same weights and outputs as the original, fine-tuning starts from the
original's loss on the first batch (computed here with the original drafter) and lowers it; a
drafter for another target or other boundaries is refused, naming the field; 03 records where its
drafter came from."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import TRAINED, write_format
from safetensors.torch import load_file, save_file

from eagle3nb.dataset.read import AuxDataset
from eagle3nb.drafter.acceptance import draft_chain
from eagle3nb.drafter.export import load_drafter
from eagle3nb.drafter.model import Eagle3Drafter
from eagle3nb.target import models
from eagle3nb.target.capture import final_norm_of
from eagle3nb.training.init_from import adopt_drafter, adoption_plan, weights_sha256
from eagle3nb.training.loop import TrainConfig, make_source, train_drafter
from eagle3nb.training.objective import TTTObjective

CFG = dict(
    batch_size=16, eval_every=0, draft_intermediate_size=344, warmup_steps=2, log_every=1,
    ttt_steps=2, lr=1e-3,
)  # fmt: skip
# the formats peers publish, with the ids each writes for boundaries TRAINED
PEERS = [("eagle3nb", None), ("sglang", [0, 1, 3]), ("vllm", [1, 2, 4]), ("speculators", [1, 2, 4])]


@pytest.fixture(scope="module")
def ds(trained_export):
    """The dataset the drafter was trained on (conftest writes it beside the export)."""
    return AuxDataset(trained_export.parent / "ds")


@pytest.fixture(scope="module")
def tcfg(target):
    return models.text_config(models.read_model_config(target[2]))


def _peer(export, tmp_path, fmt, ids):
    return export if fmt == "eagle3nb" else write_format(export, tmp_path / fmt, fmt, ids)


def _loss(drafter, model, batch, cfg) -> float:
    """The TTT loss of ``drafter`` on ``batch`` (the objective the loop lowers), no update."""
    obj = TTTObjective(
        drafter, final_norm_of(model), model.get_output_embeddings(), cfg.ttt_steps, cfg.loss_decay
    )
    with torch.no_grad():
        return obj(batch, None).loss.item()


@pytest.mark.parametrize("fmt,ids", PEERS)
def test_each_peer_format_is_adopted_with_the_same_weights_and_outputs(
    trained_export, target, ds, tcfg, tmp_path, fmt, ids
):
    model, tok, _ = target
    folder = _peer(trained_export, tmp_path, fmt, ids)
    plan = adoption_plan(folder, tcfg, len(tok), TRAINED)
    assert (plan["format"], plan["declared"], plan["moved"]) == (fmt, TRAINED, False)
    d, info = adopt_drafter(plan, ds, model, TrainConfig(max_steps=1, **CFG))
    ref, _ = load_drafter(trained_export, model.get_input_embeddings().weight.detach().float())
    sd, sr = d.state_dict(), ref.state_dict()
    assert sd.keys() == sr.keys() and all(torch.equal(sd[k], sr[k]) for k in sr)
    torch.manual_seed(0)
    tokens, aux = torch.randint(0, 512, (9,)), torch.randn(8, 3 * 64)
    assert draft_chain(d, tokens, aux, 4) == draft_chain(ref, tokens, aux, 4)
    assert info["init_from"]["kept_from_drafter"] == {}  # CFG asks for its vocab size


def test_fine_tuning_starts_from_the_drafters_loss_and_lowers_it(
    trained_export, target, ds, tcfg, tmp_path
):
    model, tok, _ = target
    folder = write_format(trained_export, tmp_path / "sglang", "sglang", [0, 1, 3])
    cfg = TrainConfig(max_steps=20, **CFG)
    batches = list(make_source(ds, cfg, torch.device("cpu")).batches(0, 4, 0, 1, False))
    ref, _ = load_drafter(trained_export, model.get_input_embeddings().weight.detach().float())
    before = [_loss(ref, model, b, cfg) for b in batches]
    plan = adoption_plan(folder, tcfg, len(tok), TRAINED)
    d, rep = train_drafter(ds, model, cfg, tmp_path / "train", tracking=(), init=plan)
    # the loop's first step is computed before its first update: the original drafter's loss
    assert rep["history"][0]["step"] == 1 and rep["history"][0]["loss"] == before[0]
    after = [_loss(d, model, b, cfg) for b in batches]
    assert sum(after) < sum(before), (before, after)
    assert rep["init_from"]["sha256"] == weights_sha256(folder)
    assert rep["init_from"]["declared_how"].startswith("eagle_config.eagle_aux_hidden_state")


def test_moving_retrains_only_the_input_side(trained_export, target, ds, tcfg, tmp_path):
    """init_boundaries: params on a folder without ids: fc starts fresh (as a new drafter of the
    run's seed), every other weight is the drafter's."""
    model, tok, _ = target
    folder = write_format(trained_export, tmp_path / "none", "none", None)
    plan = adoption_plan(folder, tcfg, len(tok), TRAINED, "params")
    assert plan["moved"] and plan["declared"] is None
    d, info = adopt_drafter(plan, ds, model, TrainConfig(max_steps=1, seed=3, **CFG))
    ref, _ = load_drafter(trained_export, model.get_input_embeddings().weight.detach().float())
    sd, sr = d.state_dict(), ref.state_dict()
    assert [k for k in sr if not torch.equal(sd[k], sr[k])] == ["fc.weight"]
    torch.manual_seed(3)
    fresh = Eagle3Drafter(ref.config).fc.weight  # a new drafter of the run's seed
    assert torch.equal(sd["fc.weight"], fresh.detach())
    assert info["init_from"]["reinitialised"] == ["fc"]


def test_refusals_name_the_field(trained_export, target, tcfg, tmp_path):
    model, tok, _ = target
    folder = write_format(trained_export, tmp_path / "vllm", "vllm", [1, 2, 4])
    where = f"init_from={str(folder)!r} (vllm format, eagle_aux_hidden_state_layer_ids=[1, 2, 4] "
    where += "read as vLLM ids (id = boundary))"
    with pytest.raises(ValueError) as e:
        adoption_plan(folder, tcfg, len(tok), [2, 3, 5], "keep", lambda b: f"layer_ids: {b}")
    assert str(e.value) == (
        f"{where}: trained on boundaries [1, 2, 4], but this run captures and exports boundaries "
        "[2, 3, 5] (aux_boundaries); fine-tuned there it would read other tensors than it was "
        "trained on. Make the run capture [1, 2, 4] (layer_ids: [1, 2, 4]), or set "
        "init_boundaries: params to move it to [2, 3, 5] (its fc's input side is re-initialised "
        "and re-trained)"
    )
    none = write_format(trained_export, tmp_path / "none", "none", None)
    with pytest.raises(ValueError, match=r"declares no boundaries.*python -m eagle3nb.audit"):
        adoption_plan(none, tcfg, len(tok), TRAINED)
    with pytest.raises(ValueError, match=r"init_boundaries='move': use keep or params"):
        adoption_plan(folder, tcfg, len(tok), TRAINED, "move")
    cfg_file = folder / "config.json"
    good = cfg_file.read_text()
    for key, value, match in [
        ("target_hidden_size", 128, r"target_hidden_size=128 but the target's hidden_size is 64"),
        ("vocab_size", 1024, r"vocab_size=1024 but the target's vocab_size is 512"),
        ("draft_vocab_size", 200, r"d2t has 256 entries but config.json draft_vocab_size=200"),
    ]:
        cfg_file.write_text(json.dumps(dict(json.loads(good), **{key: value})))
        with pytest.raises(ValueError, match=match):
            adoption_plan(folder, tcfg, len(tok), TRAINED)
    cfg_file.write_text(good)
    sd = load_file(str(folder / "model.safetensors"))
    sd["d2t"] = sd["d2t"] + 600  # absolute ids of a larger vocabulary
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"d2t maps draft ids to target ids .*outside"):
        adoption_plan(folder, tcfg, len(tok), TRAINED)


def test_03_adopts_fine_tunes_and_records_the_source(trained_export, tmp_path):
    """03 end to end (01, 02b with HF capture, 03): preflight refuses other boundaries before any
    work; the drafter's manifest records the source's path, format, weights' hash and reading."""
    from eagle3nb.params import RunParams
    from eagle3nb.preflight import check_against_model
    from eagle3nb.rundir import RunDir
    from eagle3nb.steps.extract.from_sglang import extract_sglang_step
    from eagle3nb.steps.generate.step import generate_step
    from eagle3nb.steps.train.step import train_step

    peer = write_format(trained_export, tmp_path / "peer", "speculators", [1, 2, 4])
    p = RunParams(
        outputs_dir=str(tmp_path / "runs"), run_name="adopt", max_train_prompts=24,
        max_new_tokens=24, extract_engine="hf", max_steps=6, batch_size=8, warmup_steps=1,
        draft_intermediate_size=344, eval_every=0, interactive=False, init_from=str(peer),
        tracking=[], vllm_extract=False, eval_engines=["simulator"],
    )  # fmt: skip
    other = r"trained on boundaries \[1, 2, 4\], but this run captures and exports boundaries "
    other += r"\[2, 3, 4\].*\(layer_ids: \[0, 1, 3\] \(convention sglang\)\)"
    with pytest.raises(ValueError, match=other):
        check_against_model(p.model_copy(update={"layer_ids": [1, 2, 3]}))  # SGLang ids + 1
    check_against_model(p)
    generate_step(p, progress=False)
    extract_sglang_step(p, progress=False)
    out = train_step(p, progress=False)
    man = json.loads((RunDir(p).drafter / "manifest.json").read_text())["init_from"]
    assert man["path"] == str(peer.resolve()) and man["format"] == "speculators"
    assert man["sha256"] == weights_sha256(peer) and man["declared"] == TRAINED
    assert man["declared_how"].startswith("eagle_aux_hidden_state_layer_ids=[1, 2, 4]")
    assert (man["init_boundaries"], man["moved"], man["boundaries"]) == ("keep", False, TRAINED)
    assert out["stats"]["init_from"]["sha256"] == man["sha256"]
    shutil.rmtree(tmp_path / "runs")


@pytest.fixture(scope="module")
def seeded_export(target, tmp_path_factory):
    """An untrained drafter for the target, exported by eagle3nb at TRAINED (its manifest names the
    target by path and class): the folder checks below read no weights' values, so no training."""
    from eagle3nb.drafter.export import export_drafter
    from eagle3nb.drafter.model import DrafterConfig
    from eagle3nb.drafter.vocab import build_draft_vocab

    model, _, path = target
    torch.manual_seed(0)
    d = Eagle3Drafter(DrafterConfig.for_target(model.config, 256))
    d.set_vocab(*build_draft_vocab(torch.arange(512), 256))
    man = {"target": {"path": str(path), "architecture": "LlamaForCausalLM"}}
    return export_drafter(d, tmp_path_factory.mktemp("seeded") / "d", TRAINED, 5, man)


def test_a_manifest_naming_another_target_is_refused_or_warned(
    seeded_export, target, tcfg, tmp_path
):
    """Issue 43 item 6: same shapes, another target by sha256 (base vs instruct): refused naming
    both; init_from_target: warn fine-tunes it with the same words as a warning."""
    _, tok, _ = target
    folder = shutil.copytree(seeded_export, tmp_path / "other")
    man = json.loads((folder / "manifest.json").read_text())
    man["target"] = {"name": "stories260K-base", "sha256": "ab" * 32}
    (folder / "manifest.json").write_text(json.dumps(man))
    mine = {"name": "stories260K-hd32", "sha256": "cd" * 32}
    want = (
        f"init_from='{folder}' was trained for target 'stories260K-base' and this run's target is "
        f"'stories260K-hd32' (sha256 abababababab vs this run's cdcdcdcdcdcd; {folder}/manifest."
        "json): the shapes agree, but its weights learned another model's hidden states. Use the "
        "drafter made for this target"
    )
    with pytest.raises(ValueError) as e:
        adoption_plan(folder, tcfg, len(tok), TRAINED, target=mine)
    assert str(e.value) == want + "; or set init_from_target: warn to fine-tune it anyway"
    with pytest.warns(UserWarning) as w:
        plan = adoption_plan(folder, tcfg, len(tok), TRAINED, target=mine, on_other_target="warn")
    assert [str(x.message) for x in w] == [want] and plan["other_target"] == want
    # the same sha256: adopted without a word; no sha256 on one side: the names are compared
    assert (
        adoption_plan(folder, tcfg, len(tok), TRAINED, target={"sha256": "ab" * 32})["other_target"]
        is None
    )
    with pytest.raises(ValueError, match=r"\(by name \(no sha256 on one side\);"):
        adoption_plan(folder, tcfg, len(tok), TRAINED, target={"name": "stories260K-hd32"})


def test_pytorch_model_bin_names_the_formats_and_the_conversion(seeded_export, tmp_path):
    """Issue 43 item 6: a drafter shipped as pytorch_model.bin (EAGLE's official ones) is told
    what is read and how to convert; the command given converts it to the same weights."""
    import subprocess
    import sys

    from eagle3nb.audit.formats import read_drafter_folder

    folder = tmp_path / "eagle"
    folder.mkdir()
    shutil.copy2(seeded_export / "config.json", folder / "config.json")
    sd = load_file(str(seeded_export / "model.safetensors"))
    torch.save(sd, folder / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError) as e:
        read_drafter_folder(folder, 5)
    cmd = (
        "import torch; from safetensors.torch import save_file; sd = torch.load("
        f"'{folder}/pytorch_model.bin', map_location='cpu', weights_only=True); save_file({{k: "
        f"v.contiguous() for k, v in sd.items()}}, '{folder}/model.safetensors', {{'format': 'pt'}})"
    )
    assert str(e.value) == (
        f"drafter='{folder}': model.safetensors is missing; eagle3nb reads drafter weights from "
        "model.safetensors only, and this folder has pytorch_model.bin: convert it once (torch's "
        f'safe loader, no code runs from the file): python -c "{cmd}"'
    )
    subprocess.run([sys.executable, "-c", cmd], check=True, timeout=120)
    got = load_file(str(folder / "model.safetensors"))
    assert got.keys() == sd.keys() and all(torch.equal(got[k], sd[k]) for k in sd)
    assert read_drafter_folder(folder, 5).declared == TRAINED
