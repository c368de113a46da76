"""04 on chat data: held-out prompts are rendered with the template 04 is given (ids equal the
hand-assembled text of that template, tokenised once), the template is recorded with how many
prompts differ from 01's, and acceptance per turn index equals counts worked out by hand."""

import json

import pytest
from transformers import AutoTokenizer

from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.steps.evaluate.chat import heldout_prompts, per_turn_acceptance
from eagle3nb.text import chat

STORIES_TEMPLATE = REPO_ROOT / "eagle3nb" / "data" / "chat_template_stories.jinja"
QA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'][0] | upper }}: {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(REPO_ROOT.parent / "shared/models/stories260K-hd32"))


def _run(tmp_path, tok, template_file, kwargs=None):
    p = RunParams(
        outputs_dir=str(tmp_path),
        run_name="c",
        mode="chat",
        chat_template=str(template_file),
        chat_template_kwargs=kwargs or {},
        max_eval_prompts=0,
    )
    rd = RunDir(p).make()
    stories = STORIES_TEMPLATE.read_text()
    hist0 = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi."}]
    hist1 = hist0 + [
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye?"},
    ]
    recs = [
        {"id": 0, "split": "train", "conversation": "t", "output_ids": [5]},
        {"id": 1, "split": "heldout", "conversation": "h", "turn": 0, "messages": hist0},
        {"id": 2, "split": "heldout", "conversation": "h", "turn": 1, "messages": hist1},
        {"id": 3, "split": "heldout", "prompt": "A plain prompt."},  # a prompt file's record
    ]
    for r in recs[1:3]:
        r["prompt_ids"] = chat.render_ids(tok, r["messages"], stories, True)
    recs[3]["prompt_ids"] = chat.encode_prompt(tok, recs[3]["prompt"], "chat", stories)
    rd.generated.write_text("".join(json.dumps(r) + "\n" for r in recs))
    sha = chat.template_hash(stories)
    rd.generation_manifest.write_text(json.dumps({"template": {"mode": "chat", "sha256": sha}}))
    return p, rd, recs


def test_same_template_renders_01_ids(tmp_path, tok):
    p, rd, recs = _run(tmp_path, tok, STORIES_TEMPLATE)
    prompts, turns, block = heldout_prompts(p, rd, tok)
    assert prompts == [r["prompt_ids"] for r in recs[1:]]
    assert turns == [0, 1, None]
    assert block["same_as_generation"] and block["prompts_rendered_differently"] == 0
    assert block["file"] == str(STORIES_TEMPLATE) and block["kwargs"] == {}


def test_other_template_renders_its_own_ids(tmp_path, tok):
    qa = tmp_path / "qa.jinja"
    qa.write_text(QA_TEMPLATE)
    p, rd, recs = _run(tmp_path, tok, qa)
    prompts, turns, block = heldout_prompts(p, rd, tok)
    texts = [
        "<s>S: Be kind.\nU: Hi.\nA:",
        "<s>S: Be kind.\nU: Hi.\nA: Hello.\nU: Bye?\nA:",
        "<s>U: A plain prompt.\nA:",
    ]
    assert prompts == [tok(t, add_special_tokens=False).input_ids for t in texts]
    assert not block["same_as_generation"] and block["prompts_rendered_differently"] == 3
    assert block["sha256"] == chat.template_hash(QA_TEMPLATE)
    # kwargs reach the template: thinking off adds the empty think block to the prompt
    p, rd, _ = _run(tmp_path, tok, STORIES_TEMPLATE, {"enable_thinking": False})
    prompts, _, block = heldout_prompts(p, rd, tok)
    assert tok.decode(prompts[0]).endswith("Assistant: <think></think>")
    assert not block["same_as_generation"]


def test_per_turn_acceptance_by_hand():
    traces = [
        {"cycles": [(2, [1, 2, 3]), (0, [4]), (-1, [5])]},  # turn 0
        {"cycles": [(3, [1, 2, 3, 4])]},  # turn 1
        {"cycles": [(1, [1, 2]), (3, [1, 2, 3, 4])]},  # turn 0
    ]
    got = per_turn_acceptance(traces, [0, 1, 0], k=3)
    # turn 0: accepted counts 2, 0, 1, 3 (the -1 cycle had no drafts) -> 4 cycles, 6 accepted
    assert got[0] == {
        "n_prompts": 2,
        "cycles": 4,
        "tau": 2.5,
        "per_position_acceptance": [0.75, 0.5, 0.25],
    }
    assert got[1] == {
        "n_prompts": 1,
        "cycles": 1,
        "tau": 4.0,
        "per_position_acceptance": [1.0, 1.0, 1.0],
    }
    with pytest.raises(ValueError, match="n_traces=len"):
        per_turn_acceptance(traces[:1], [0, 1], 3)
