"""chat_template_kwargs through 03 and 04 (issue 32 item 1): 03's held-out evaluation measures the
prompts 01 rendered with them (equal to a hand render of the template with the kwargs) and refuses
01's output rendered with other kwargs; 03 refuses a dataset made with other kwargs; the export
records the kwargs of the data the drafter was trained on; 04 refuses a drafter trained with other
kwargs (accepted with allow_template_mismatch, and a manifest from before the kwargs were recorded
counts as {}). 01 recording them is tested in tests/text/test_chat.py.

Tiny target (stories260K-hd32, CPU); no engine starts. Expected ids come from the template's text
(jinja through transformers, tokenised once by hand); expected messages are written out in full.
"""

import json

import pytest
import torch

from eagle3nb.manifest import ManifestMismatch
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.text import chat

STORIES_TEMPLATE = REPO_ROOT / "eagle3nb" / "data" / "chat_template_stories.jinja"
KW = {"enable_thinking": False}


def _params(tmp_path, name, kwargs, **kw):
    return RunParams(
        outputs_dir=str(tmp_path),
        run_name=name,
        mode="chat",
        chat_template=str(STORIES_TEMPLATE),
        chat_template_kwargs=kwargs,
        **kw,
    )


@pytest.fixture(scope="module")
def run01(tmp_path_factory):
    """01 on a prompts file in chat mode with enable_thinking false: its params, output, target."""
    from eagle3nb.steps.generate.step import generate_step
    from eagle3nb.target import models

    tmp = tmp_path_factory.mktemp("kw")
    f = tmp / "p.txt"
    f.write_text("".join(f"Tom saw cat number {i}.\n" for i in range(12)))
    p = _params(tmp, "kw", KW, prompts_file=str(f), heldout_fraction=0.3, max_new_tokens=4)
    out = generate_step(p, progress=False)
    model, tok, path = models.load_target(p.model, "float32", "cpu")
    return p, out, model, tok, path


def _hand_ids(tok, prompt, kwargs):
    msgs = [{"role": "user", "content": prompt}]
    text = tok.apply_chat_template(
        msgs,
        chat_template=STORIES_TEMPLATE.read_text(),
        add_generation_prompt=True,
        tokenize=False,
        **kwargs,
    )
    return tok(text, add_special_tokens=False).input_ids


# --- 03's held-out evaluation ---------------------------------------------------------------------


def test_03_heldout_measures_01s_rendering_with_the_kwargs(run01):
    from eagle3nb.steps.train.heldout_slice import heldout_eval

    p, out, model, tok, _ = run01
    q = p.model_copy(update={"eval_every": 1, "eval_prompts": 2, "eval_max_new_tokens": 4})
    ev = heldout_eval(q, RunDir(q), model, tok, [1, 2, 3])
    held = [r["prompt"] for r in out["records"] if r["split"] == "heldout"][-2:]
    assert len(held) == 2
    want = [_hand_ids(tok, t, KW) for t in held]
    assert ev.prompts == want
    assert all(tok.decode(w).endswith("Assistant: <think></think>") for w in want)
    assert want != [_hand_ids(tok, t, {}) for t in held]  # the kwargs change these ids
    assert ev.source.endswith(
        "prompts rendered by 01 with template kwargs {'enable_thinking': False}"
    )


def test_03_heldout_refuses_01_output_rendered_with_other_kwargs(run01):
    from eagle3nb.steps.train.heldout_slice import heldout_eval

    p, _, model, tok, _ = run01
    q = p.model_copy(update={"eval_every": 1, "eval_prompts": 2, "chat_template_kwargs": {}})
    rd = RunDir(q)
    with pytest.raises(ManifestMismatch) as e:
        heldout_eval(q, rd, model, tok, [1, 2, 3])
    assert str(e.value) == (
        f"held-out prompts {rd.generated} (rendered by 01) does not match this run: "
        "template_kwargs: artefact has {'enable_thinking': False}, expected {}. Fix the inputs, "
        "or set allow_manifest_mismatch=True to continue anyway."
    )
    r = q.model_copy(update={"allow_manifest_mismatch": True, "eval_max_new_tokens": 4})
    assert heldout_eval(r, rd, model, tok, [1, 2, 3]).prompts  # overridden: 01's ids as they are


# --- 03's dataset check and the export ----------------------------------------------------------


def _dataset_manifest(p, rd, model, tok, path, kwargs):
    """A dataset manifest as 02 writes it for this run (target, dtype, convention, template,
    boundaries) with ``kwargs`` (None: an older manifest without the key)."""
    from eagle3nb.manifest import provenance
    from eagle3nb.steps.shared.checks import resolve_aux, target_info, template_of
    from eagle3nb.target.capture import n_layers_of

    ids, bnds = resolve_aux(p, n_layers_of(model))
    man = provenance(
        p.seed,
        target=target_info(path, model, rd.root),
        engine={"name": "hf"},
        convention=p.convention,
        layer_ids=ids,
        aux_boundaries=bnds,
        dtype=p.dtype,
        template={"mode": "chat", "sha256": chat.template_hash(template_of(p, tok))},
    )
    if kwargs is not None:
        man["template_kwargs"] = kwargs
    return man


def test_03_refuses_a_dataset_made_with_other_kwargs(run01, tmp_path):
    from eagle3nb.steps.train.step import _check_dataset

    p, _, model, tok, path = run01
    q = p.model_copy(update={"outputs_dir": str(tmp_path)})
    rd = RunDir(q).make()
    _check_dataset(q, rd, _dataset_manifest(q, rd, model, tok, path, KW), "ds", model, tok, path)
    for have, shown in (
        ({}, "{}"),
        (None, "{}"),
        ({"enable_thinking": True}, "{'enable_thinking': True}"),
    ):
        man = _dataset_manifest(q, rd, model, tok, path, have)
        with pytest.raises(ManifestMismatch) as e:
            _check_dataset(q, rd, man, "ds", model, tok, path)
        assert str(e.value) == (
            f"dataset ds does not match this run: template_kwargs: artefact has {shown}, "
            "expected {'enable_thinking': False}. Fix the inputs, or set "
            "allow_manifest_mismatch=True to continue anyway."
        )


def test_export_records_the_datasets_kwargs_and_04_refuses_others(run01, tmp_path):
    from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
    from eagle3nb.steps.evaluate.step import check_drafter_matches
    from eagle3nb.steps.shared.checks import template_of
    from eagle3nb.steps.train.step import _export
    from eagle3nb.target import models
    from eagle3nb.training.loop import TrainConfig

    p, _, model, tok, path = run01
    q = p.model_copy(update={"outputs_dir": str(tmp_path)})
    rd = RunDir(q).make()
    man = _dataset_manifest(q, rd, model, tok, path, KW)
    v = model.config.vocab_size
    d = Eagle3Drafter(
        DrafterConfig.for_target(model.config, v, 3),
        model.get_input_embeddings().weight.detach().float(),
    )
    d.set_vocab(torch.zeros(v, dtype=torch.long), torch.ones(v, dtype=torch.bool))
    bnds = man["aux_boundaries"]
    _export(q, rd, man, d, {"vocab": {"size": v}}, TrainConfig(), tok, bnds)
    dman = json.loads((rd.drafter / "manifest.json").read_text())
    assert dman["template_kwargs"] == KW and dman["template"] == man["template"]

    # 04: the same kwargs pass; others are refused with both values; the override skips it
    sha, tmpl = models.model_hash(path, rd.root), template_of(q, tok)
    check_drafter_matches(dman, "chat", tmpl, sha, rd.drafter, KW)
    with pytest.raises(ManifestMismatch) as e:
        check_drafter_matches(dman, "chat", tmpl, sha, rd.drafter, {})
    assert str(e.value) == (
        f"drafter {rd.drafter} does not match this run: template_kwargs: artefact has "
        "{'enable_thinking': False}, expected {}. Fix the inputs, or set "
        "allow_template_mismatch=True to continue anyway."
    )
    # a drafter exported before the kwargs were recorded counts as trained with none
    old = {k: w for k, w in dman.items() if k != "template_kwargs"}
    check_drafter_matches(old, "chat", tmpl, sha, rd.drafter, {})
    with pytest.raises(ManifestMismatch, match=r"template_kwargs: artefact has \{\}, expected "):
        check_drafter_matches(old, "chat", tmpl, sha, rd.drafter, KW)


def test_04_eval_refuses_other_kwargs_before_any_engine_and_allows_the_override(run01, tmp_path):
    """04's own entry (_eval) runs the check with its chat_template_kwargs; the override goes on to
    the export check (an empty drafter folder is then refused by load_drafter, not by kwargs)."""
    from eagle3nb.steps.evaluate.step import _eval
    from eagle3nb.steps.shared.checks import template_of
    from eagle3nb.target import models

    p, _, model, tok, path = run01
    q = p.model_copy(update={"outputs_dir": str(tmp_path), "chat_template_kwargs": {}})
    rd = RunDir(q).make()
    rd.drafter.mkdir(parents=True)
    (rd.drafter / "config.json").write_text("{}")
    dman = {
        "template": {"mode": "chat", "sha256": chat.template_hash(template_of(q, tok))},
        "template_kwargs": KW,
        "target": {"sha256": models.model_hash(path, rd.root)},
    }
    (rd.drafter / "manifest.json").write_text(json.dumps(dman))
    with pytest.raises(ManifestMismatch) as e:
        _eval(q, progress=False)
    assert "template_kwargs: artefact has {'enable_thinking': False}, expected {}" in str(e.value)
    assert "allow_template_mismatch=True" in str(e.value)
    r = q.model_copy(update={"allow_template_mismatch": True})
    # past the kwargs check: the empty export is refused by load_drafter
    with pytest.raises(
        ValueError, match="architectures=None; expected 'LlamaForCausalLMEagle3'"
    ) as e2:
        _eval(r, progress=False)
    assert not isinstance(e2.value, ManifestMismatch)
