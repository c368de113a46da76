"""The audit (eagle3nb.audit) on a drafter trained here at known boundaries (conftest.TRAINED of
the embedded 5-layer target) and re-written as peers publish it: each format read back to the same
drafter, wrong ids found by measurement (the simulator), corrected copies that each engine's rule
reads back as the trained boundaries, and drafters for another target refused by field."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from conftest import TRAINED, write_format
from safetensors.torch import load_file, save_file

from eagle3nb.audit.core import heldout_prompt_ids, run_audit
from eagle3nb.audit.formats import check_belongs, loadable_copy, read_drafter_folder
from eagle3nb.audit.measure import verdict
from eagle3nb.drafter.acceptance import draft_chain
from eagle3nb.boundaries.engine_read import read_as_engine
from eagle3nb.drafter.export import load_drafter
from eagle3nb.boundaries.rules import engine_rule
from eagle3nb.viz.audit_plots import audit_figure

N, ARCH = 5, "LlamaForCausalLM"
VERSIONS = {"sglang": "0.5.23", "vllm": "0.32.0"}  # the rule table's rows (no venv needed)


def _digest(folder) -> dict:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in folder.iterdir()}


@pytest.fixture(scope="module")
def held(target):
    return heldout_prompt_ids(target[1], n=10)


# format, ids written, the boundaries that folder declares (read in that format's convention by hand)
FORMATS = [
    ("sglang", [0, 1, 3], [1, 2, 4]),  # SGLang ids: boundary - 1
    ("vllm", [1, 2, 4], [1, 2, 4]),  # vLLM ids = boundaries
    ("speculators", [1, 2, 4], [1, 2, 4]),  # top-level, as vLLM's speculators reader copies them
    ("none", None, None),
]


@pytest.mark.parametrize("fmt,ids,declared", FORMATS)
def test_each_format_reads_back_the_same_drafter(
    trained_export, target, tmp_path, fmt, ids, declared
):
    model = target[0]
    folder = write_format(trained_export, tmp_path / fmt, fmt, ids)
    got = read_drafter_folder(folder, N)
    assert (got.format, got.declared) == (fmt, declared)
    emb = model.get_input_embeddings().weight.detach().float()
    ref, _ = load_drafter(trained_export, emb)
    d, _ = load_drafter(loadable_copy(got, tmp_path / "loadable"), emb)
    assert d.config == ref.config
    sd, sr = d.state_dict(), ref.state_dict()
    assert sd.keys() == sr.keys() and all(torch.equal(sd[k], sr[k]) for k in sr)
    torch.manual_seed(0)
    tokens, aux = torch.randint(0, 512, (9,)), torch.randn(8, 3 * 64)
    assert draft_chain(d, tokens, aux, 4) == draft_chain(ref, tokens, aux, 4)


def test_eagle3nb_export_declares_its_recorded_boundaries(trained_export):
    got = read_drafter_folder(trained_export, N)
    assert (got.format, got.declared) == ("eagle3nb", TRAINED)


# the wrong ids of the issue: the folder, what it declares, and what each engine feeds as it stands
WRONG = {
    "one lower": ("vllm", [0, 1, 3], [0, 1, 3]),
    "one higher": ("vllm", [2, 3, 5], [2, 3, 5]),
    # vLLM's ids written into SGLang's key: SGLang adds one (llama.py:929-941)
    "other engine's convention": ("sglang", [1, 2, 4], [2, 3, 5]),
    "absent": ("none", None, None),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_wrong_ids_are_found_and_corrected(trained_export, target, held, tmp_path, case):
    fmt, ids, declared = WRONG[case]
    folder = write_format(trained_export, tmp_path / "peer", fmt, ids)
    before = _digest(folder)
    r = run_audit(
        folder, target[2], tmp_path / "out", None, held, 4, 48, versions=VERSIONS, target=target
    )
    v = r["verdict"]
    assert v["declared"] == declared
    assert v["trained_on"] == TRAINED, (case, sorted(r["candidates"], key=lambda c: c["nll"])[:3])
    assert v["nll_margin"] > 0 and v["recommended"] == TRAINED
    if declared is not None:  # the published ids cost acceptance
        assert v["declared_tau"] < v["trained_tau"] and v["declared_nll"] > v["trained_nll"]
    assert TRAINED in [c["boundaries"] for c in r["candidates"]]
    assert _digest(folder) == before  # the original folder is never touched
    patched = json.loads((tmp_path / "out" / "drafter" / "config.json").read_text())
    for engine, version in VERSIONS.items():  # read back by each engine's own rule, not the audit's
        rule = engine_rule(engine, version, ARCH)
        assert read_as_engine(patched, engine, N, rule)["boundaries"] == TRAINED, engine
        assert r["patched"]["engines"][engine]["ok"]
    # the readings of the folder as it stands, by hand: vLLM's top-level ids = boundaries, else the
    # nested ones as its own; SGLang's nested ids + 1, else its default 2, N//2, N-3
    # default [2, 2, 2] on this 5-layer target is one captured state: vLLM crashes on it, SGLang
    # serves it without fc (tests/audit/test_audit_servable.py)
    if ids is not None:
        assert r["readings"]["vllm"]["boundaries"] == ids
    else:
        assert "give 1 state [2]" in r["readings"]["vllm"]["refused"]
        assert r["readings"]["sglang"]["boundaries"] == [2] and r["readings"]["sglang"]["unfused"]
    if fmt == "sglang":
        assert r["readings"]["sglang"].get("boundaries") in ([b + 1 for b in ids], None)
    cmds = json.loads((tmp_path / "out" / "serve_commands.json").read_text())
    assert str(tmp_path / "out" / "drafter") in cmds["vllm"] and "EAGLE3" in cmds["sglang"]
    fig = audit_figure(r)
    names = {t.name for t in fig.data}
    assert names & {"measured (trained on)", "declared = measured"} and sum(
        len(t.y) for t in fig.data
    ) == len(r["candidates"])


def test_own_export_keeps_its_boundaries(trained_export, target, held, tmp_path):
    r = run_audit(
        trained_export,
        target[2],
        tmp_path / "out",
        None,
        held,
        4,
        48,
        versions=VERSIONS,
        target=target,
    )
    v = r["verdict"]
    assert r["format"] == "eagle3nb" and v["declared"] == v["recommended"] == TRAINED
    assert all(r["readings"][e]["boundaries"] == TRAINED for e in VERSIONS)  # exported by rule


def _row(bs, tau, nll):
    return {"boundaries": bs, "label": str(bs), "tau": tau, "nll": nll}


def test_verdict_switches_only_when_nll_and_tau_agree():
    # NLL favours [1, 2, 5], tau the declared [1, 2, 4]: the declared set is kept (the smoke run's
    # drafter, weakly trained, measured this way)
    rows = [_row([1, 3, 4], 1.54, 3.10), _row([1, 2, 4], 1.50, 3.06), _row([1, 2, 5], 1.48, 3.03)]
    v = verdict(rows, [1, 2, 4])
    assert (v["trained_on"], v["best"], v["recommended"]) == ([1, 2, 5], [1, 3, 4], [1, 2, 4])
    assert v["why"].startswith("inconclusive")
    rows[2]["tau"] = 1.51  # now [1, 2, 5] also accepts more than the declared set
    assert verdict(sorted(rows, key=lambda r: -r["tau"]), [1, 2, 4])["recommended"] == [1, 2, 5]
    assert verdict(rows, None)["recommended"] == [1, 2, 5]  # nothing declared: the NLL's set
    assert abs(verdict(rows, [1, 2, 4])["nll_margin"] - 0.03) < 1e-12


def _mutate(export, dst, cfg_change=None, sd_change=None):
    shutil.copytree(export, dst)
    if cfg_change:
        cfg = json.loads((dst / "config.json").read_text())
        cfg_change(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if sd_change:
        sd = load_file(str(dst / "model.safetensors"))
        sd_change(sd)
        save_file(sd, str(dst / "model.safetensors"))
    return dst


def _d2t_out_of_range(sd):
    sd["d2t"] = sd["d2t"] + 512  # every target id beyond the 512-token vocabulary


REFUSALS = {
    "target_hidden_size": (lambda c: c.update(target_hidden_size=128), None),
    "vocab_size": (lambda c: c.update(vocab_size=32000), None),
    "d2t": (None, _d2t_out_of_range),
    "fc_norm": (lambda c: c.update(fc_norm=True), None),
    "eagle3nb.target_num_hidden_layers": (
        lambda c: c["eagle3nb"].update(target_num_hidden_layers=32),
        None,
    ),
}


@pytest.mark.parametrize("field", list(REFUSALS))
def test_drafter_for_another_target_is_refused_naming_the_field(
    trained_export, target, tmp_path, monkeypatch, field
):
    from eagle3nb.target import models

    folder = _mutate(trained_export, tmp_path / "other", *REFUSALS[field])

    def fake_load_target(*a, **k):  # fake: the refusal must come before the target's weights load
        raise AssertionError("the target was loaded before the refusal")

    monkeypatch.setattr(models, "load_target", fake_load_target)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        run_audit(folder, target[2], tmp_path / "out", versions=VERSIONS)
    assert not (tmp_path / "out").exists()


def test_check_belongs_accepts_the_drafters_own_target(trained_export, target):
    model, tok, _ = target
    check_belongs(read_drafter_folder(trained_export, N), model.config.to_dict(), len(tok))


def test_cli_refusal_names_the_field(trained_export, target, tmp_path):
    from typer.testing import CliRunner

    from eagle3nb.audit.__main__ import app

    folder = _mutate(trained_export, tmp_path / "other", REFUSALS["vocab_size"][0])
    res = CliRunner().invoke(app, [str(folder), "--model", str(target[2])])
    assert res.exit_code == 2 and "vocab_size=32000" in res.output, res.output
