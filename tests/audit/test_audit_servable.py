"""Issue 43 items 3-5: the audit reports what each engine does with a folder, not only what its
ids name: vLLM's loader refuses a full-vocabulary d2t (the corrected copy drops it), vLLM's CPU
attention refuses a head_dim-16 drafter, a repeated default id is one captured state (vLLM
crashes, SGLang serves that state without fc), a set SGLang cannot feed gives a copy SGLang cannot
load by mistake with the best set it can feed offered, and a speculators folder is refused by
SGLang. Expected values by hand from the engines' sources (eagle3nb.audit.servable's docstring)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TRAINED, with_identity_vocab, write_format
from safetensors.torch import load_file

from eagle3nb.audit.core import heldout_prompt_ids, run_audit, summary_lines
from eagle3nb.audit.formats import loadable_copy, read_drafter_folder
from eagle3nb.audit.measure import measure_candidates
from eagle3nb.audit.patch import REFUSED_MARK, write_patched
from eagle3nb.audit.servable import fed_states, unfused_drafter
from eagle3nb.boundaries.engine_read import read_as_engine
from eagle3nb.boundaries.rules import engine_rule
from eagle3nb.drafter.export import load_drafter

N, ARCH = 5, "LlamaForCausalLM"
VERSIONS = {"sglang": "0.5.23", "vllm": "0.32.0"}


@pytest.fixture(scope="module")
def held(target):
    return heldout_prompt_ids(target[1], n=6)


# target depth -> the states both engines capture for their default ids (2, N//2, N-3), by hand:
# one per distinct layer, in layer order (vLLM interfaces.py:1578 sorted(set()), SGLang llama.py:
# 486-493 `if i in layers_to_capture` in the layer loop)
DEFAULTS = {3: [0, 1, 2], 4: [1, 2], 5: [2], 6: [2, 3], 7: [2, 3, 4], 8: [2, 4, 5], 32: [2, 16, 29]}


@pytest.mark.parametrize("n", list(DEFAULTS))
def test_default_ids_are_read_as_the_engines_capture_them(n):
    for engine, version in VERSIONS.items():
        b = engine_rule(engine, version, ARCH).default_boundaries(n)
        want = DEFAULTS[n]
        if len(want) == 3:
            assert fed_states(engine, version, b, 3, True)["boundaries"] == want
        elif engine == "sglang" and len(want) == 1:  # one state: SGLang skips fc
            got = fed_states(engine, version, b, 3, True)
            assert got["unfused"] and got["boundaries"] == want
        else:
            with pytest.raises(ValueError, match=f"give {len(want)} state"):
                fed_states(engine, version, b, 3, True)


def test_no_ids_on_a_5_layer_target_vllm_refused_sglang_one_state_measured(
    trained_export, target, held, tmp_path
):
    model, _, _ = target
    folder = write_format(trained_export, tmp_path / "none", "none", None)
    r = run_audit(folder, target[2], None, None, held, 4, 48, versions=VERSIONS, target=target)
    vl, sg = r["readings"]["vllm"], r["readings"]["sglang"]
    assert vl["refused"] == (
        "vllm 0.32.0 captures one state per distinct layer (vllm/model_executor/models/"
        "interfaces.py:1577-1578, 1601-1611): boundaries [2, 2, 2] give 1 state [2], and the "
        "drafter reads 3; vllm/model_executor/models/llama_eagle3.py:397-418 applies fc (242-243) "
        "sized for 3 states, so the first draft fails with a shape error. Write the ids "
        "explicitly (the audit's corrected copy does)"
    )
    assert "boundaries" not in vl and vl["ids_boundaries"] == [2, 2, 2] and vl["tau"] is None
    assert sg["boundaries"] == [2] and sg["unfused"] and sg["ids_boundaries"] == [2, 2, 2]
    # SGLang's tau: the drafter with fc the identity on boundary 2 alone, by hand
    emb = model.get_input_embeddings().weight.detach().float()
    d, _ = load_drafter(trained_export, emb)
    with torch.no_grad():
        x = torch.randn(7, 64)
        assert torch.equal(unfused_drafter(d).fc(x), x)
    from eagle3nb.target import models

    eos = models.stop_token_ids(model, target[1])
    one = measure_candidates(model, unfused_drafter(d), [[2]], held, 4, 48, eos)[0]
    assert (sg["tau"], sg["cycles"]) == (one["tau"], one["cycles"])
    assert sg["tau"] < r["verdict"]["trained_tau"]
    assert [2, 2, 2] not in [c["boundaries"] for c in r["candidates"]]  # fed by no engine
    lines = summary_lines(r)
    assert any(x.startswith("  sglang 0.5.23: feeds [2] (engine default, one state without fc)")
               for x in lines)  # fmt: skip


def test_full_vocab_identity_d2t_refused_by_vllm_and_dropped_in_the_copy(
    full_vocab_export, target, held, tmp_path
):
    model = target[0]
    folder = with_identity_vocab(full_vocab_export, tmp_path / "specforge")
    r = run_audit(
        folder, target[2], tmp_path / "out", None, held, 4, 48, versions=VERSIONS, target=target
    )
    assert r["readings"]["vllm"]["refused"].startswith(
        "vllm 0.32.0 does not load it: a full-vocabulary drafter with d2t/t2d (SpecForge writes "
        "them always) fails with \"There is no module or parameter named 'draft_id_to_target_id'\""
    )
    assert "refused" not in r["readings"]["sglang"]
    copy = tmp_path / "out" / "drafter"
    sd = load_file(str(copy / "model.safetensors"))
    assert "d2t" not in sd and "t2d" not in sd  # as 03's export writes a full vocabulary
    ref = load_file(str(full_vocab_export / "model.safetensors"))
    assert sd.keys() == ref.keys() and all(torch.equal(sd[k], ref[k]) for k in ref)
    assert all(e["ok"] and e["cpu_refused"] is None for e in r["patched"]["engines"].values())
    emb = model.get_input_embeddings().weight.detach().float()
    assert load_drafter(copy, emb)[0].config.draft_vocab_size == 512


def test_full_vocab_permuted_d2t_moves_lm_head_rows(full_vocab_export, tmp_path):
    folder = with_identity_vocab(full_vocab_export, tmp_path / "perm")
    sd = load_file(str(folder / "model.safetensors"))
    v = sd["d2t"].numel()
    perm = torch.roll(torch.arange(v), 1)  # draft id i -> target id i - 1 (mod v)
    sd["d2t"] = perm - torch.arange(v)
    from safetensors.torch import save_file

    save_file(sd, str(folder / "model.safetensors"))
    got = load_file(
        str(loadable_copy(read_drafter_folder(folder, N), tmp_path / "l") / "model.safetensors")
    )
    assert "d2t" not in got
    assert torch.equal(got["lm_head.weight"][perm], sd["lm_head.weight"])


def test_head_dim_16_drafter_is_refused_on_cpu_by_vllm(trained_export, target, held, tmp_path):
    from eagle3nb.drafter.export import export_drafter
    from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter

    model, _, path = target
    c = DrafterConfig.for_target(model.config, 256, 3, num_attention_heads=4, num_key_value_heads=4)
    assert c.head_dim == 32  # for_target keeps the target's head_dim: set 16 as a peer would
    from dataclasses import replace

    torch.manual_seed(0)
    d = Eagle3Drafter(replace(c, head_dim=16))
    d.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight.detach())
    vocab = load_file(str(trained_export / "model.safetensors"))  # a consistent draft vocab
    d.d2t.copy_(vocab["d2t"])
    d.t2d.copy_(vocab["t2d"])
    man = {"target": {"path": str(path), "architecture": ARCH}}
    hd16 = export_drafter(d, tmp_path / "hd16", TRAINED, N, man, num_speculative_tokens=4)
    r = run_audit(
        hd16, path, tmp_path / "out", None, held, 4, 16, radius=0, versions=VERSIONS, target=target
    )
    want = (
        "the drafter's head_dim=16 is not a head size of vLLM 0.32.0's CPU attention [32, 64, 80, "
        "96, 112, 128, 160, 192, 224, 256, 512] (v1/attention/backends/cpu_attn.py:69-70, checked "
        "at engine build: 'head_size not supported', v1/attention/backend.py:103, 300); serve it "
        "on GPU, or retrain with a head_dim it takes (draft_num_heads so that hidden_size / heads "
        "is one of them)"
    )
    assert r["readings"]["vllm"]["cpu_refused"] == want
    assert r["patched"]["engines"]["vllm"]["cpu_refused"] == want
    assert r["patched"]["engines"]["sglang"]["cpu_refused"] is None  # none known for SGLang
    assert f"  vllm: ids {TRAINED} -> {TRAINED}; on CPU refused: {want}" in summary_lines(r)


def test_a_set_sglang_cannot_feed_gives_a_copy_sglang_cannot_load(trained_export, tmp_path):
    folder = read_drafter_folder(trained_export, N)
    loadable = loadable_copy(folder, tmp_path / "l")
    readings = {e: {"version": v} for e, v in VERSIONS.items()}
    rows = [  # the audit's table, best tau first: [1, 3, 5] and [1, 2, 5] need boundary 5 = N
        {"boundaries": [1, 3, 5], "tau": 2.21},
        {"boundaries": [1, 2, 5], "tau": 2.0},
        {"boundaries": [2, 3, 4], "tau": 1.9},
        {"boundaries": [1, 2, 4], "tau": 1.8},
    ]
    dst = tmp_path / "out"
    got = write_patched(loadable, dst, [1, 3, 5], N, ARCH, readings, {}, rows)
    why = (
        "sglang 0.5.23 on LlamaForCausalLM: boundaries=[1, 3, 5]: sglang 0.5.23 on "
        "LlamaForCausalLM captures boundaries 1..4 of a 5-layer target, not [5]"
    )
    assert got["sglang"]["refused"].startswith(why)
    by = "highest tau among the sets sglang 0.5.23 captures in the audit's table"
    assert got["sglang"]["retrain"] == {
        "boundaries": [2, 3, 4], "tau": 1.9, "ids": [1, 2, 3], "chosen_by": by
    }  # fmt: skip
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        1,
        f"{REFUSED_MARK}: {got['sglang']['refused']}",
    ]
    assert cfg["num_aux_hidden_states"] == 3  # fc sized without the marked list, both engines
    # SGLang: [val + 1 for val in layer_ids] (srt/models/llama.py:941) fails on the mark at start
    with pytest.raises(TypeError):
        [val + 1 for val in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    with pytest.raises(ValueError, match="sglang cannot serve this config"):
        read_as_engine(cfg, "sglang", N, engine_rule("sglang", "0.5.23", ARCH))
    assert got["vllm"]["ok"] and read_as_engine(cfg, "vllm", N)["boundaries"] == [1, 3, 5]


def test_speculators_folder_is_refused_by_sglang(trained_export, target, tmp_path):
    from eagle3nb.audit.measure import engine_readings
    from eagle3nb.audit.servable import annotate_readings

    folder = read_drafter_folder(
        write_format(trained_export, tmp_path / "spec", "speculators", TRAINED), N, ARCH
    )
    r = engine_readings(folder.config, N, ARCH, VERSIONS)
    annotate_readings(r, folder, 3, True, ARCH, target[0].config.to_dict())
    assert r["sglang"]["refused"] == (
        "sglang 0.5.23 does not load it: config.json has no top-level model_type (speculators "
        "nests it in transformer_layer_config), and transformers' AutoConfig refuses it (\"Should "
        'have a `model_type` key in its config.json", transformers 5.19 models/auto/'
        "configuration_auto.py:444); serve the corrected copy"
    )
    assert r["vllm"]["boundaries"] == TRAINED and "refused" not in r["vllm"]
