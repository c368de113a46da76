"""Tests for eagle3nb.text.chat with the tiny local stories260K tokenizer (+ ChatML special tokens)."""

import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from eagle3nb.text.chat import (
    CHATML_TEMPLATE,
    CHATML_TEMPLATE_WITH_GENERATION,
    chat_sample,
    chat_turns_from_generation,
    completion_sample,
    encode_prompt,
    template_hash,
    template_text,
)

TOKENIZER_DIR = Path(__file__).resolve().parents[3] / "shared/models/stories260K-hd32"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"

TWO_TURN = [
    {"role": "user", "content": "Tell me a story."},
    {"role": "assistant", "content": "Once upon a time there was a cat."},
]
FOUR_TURN = [
    {"role": "system", "content": "You are kind."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello, little friend."},
    {"role": "user", "content": "What did the dog do?"},
    {"role": "assistant", "content": "The dog ran to the park\nand played."},
]


@pytest.fixture(scope="module")
def tok():
    t = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    t.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    assert t.convert_tokens_to_ids(IM_END) in t.all_special_ids
    return t


def chatml_text(messages):
    """ChatML rendering built by hand, independently of the jinja templates."""
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)


def masked_runs(tok, ids, mask):
    """Decode each maximal run of mask==1 tokens."""
    runs, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r) for r in runs]


def test_completion_sample(tok):
    prompt, cont = "Once upon a time", [306, 414, 263, 2]
    prompt_ids = tok(prompt).input_ids
    assert prompt_ids[0] == 1  # BOS added by default
    ids, mask = completion_sample(tok, prompt, cont)
    assert ids == prompt_ids + cont
    assert mask == [0] * len(prompt_ids) + [1] * len(cont)
    assert encode_prompt(tok, prompt, "completion") == prompt_ids
    with pytest.raises(ValueError, match="continuation_ids"):
        completion_sample(tok, prompt, [])


@pytest.mark.parametrize("messages", [TWO_TURN, FOUR_TURN], ids=["2turn", "4turn"])
@pytest.mark.parametrize(
    "template", [CHATML_TEMPLATE, CHATML_TEMPLATE_WITH_GENERATION], ids=["prefix", "gentags"]
)
def test_chat_sample_marks_assistant_content_and_im_end(tok, messages, template):
    ids, mask = chat_sample(tok, messages, chat_template=template)
    assert len(ids) == len(mask)
    assert ids == tok(chatml_text(messages), add_special_tokens=False).input_ids
    assert tok.bos_token_id not in ids  # ChatML has no BOS; none added
    assert 0 < sum(mask) < len(mask)
    expected = [m["content"] + IM_END for m in messages if m["role"] == "assistant"]
    assert masked_runs(tok, ids, mask) == expected


@pytest.mark.parametrize("messages", [TWO_TURN, FOUR_TURN], ids=["2turn", "4turn"])
def test_prefix_path_equals_generation_tag_path(tok, messages):
    a = chat_sample(tok, messages, chat_template=CHATML_TEMPLATE)
    b = chat_sample(tok, messages, chat_template=CHATML_TEMPLATE_WITH_GENERATION)
    assert a == b


def test_tokenizer_chat_template_is_used(tok):
    tok.chat_template = CHATML_TEMPLATE
    try:
        assert chat_sample(tok, TWO_TURN) == chat_sample(
            tok, TWO_TURN, chat_template=CHATML_TEMPLATE
        )
        assert template_text(tok, mode="chat") == CHATML_TEMPLATE
    finally:
        tok.chat_template = None


def test_encode_prompt_chat_is_prefix_of_sample(tok):
    prompt, reply = "Tell me a story.", "Once upon a time."
    p = encode_prompt(tok, prompt, "chat", chat_template=CHATML_TEMPLATE)
    assert isinstance(p, list) and all(isinstance(t, int) for t in p)
    assert (
        p
        == tok(
            f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n", add_special_tokens=False
        ).input_ids
    )
    ids, mask = chat_sample(
        tok, chat_turns_from_generation(prompt, reply), chat_template=CHATML_TEMPLATE
    )
    assert ids[: len(p)] == p and mask.index(1) == len(p)


def test_chat_turns_from_generation():
    assert chat_turns_from_generation("a", "b") == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]


def test_no_assistant_turn_raises(tok):
    with pytest.raises(ValueError, match="no assistant turn"):
        chat_sample(tok, [{"role": "user", "content": "Hi"}], chat_template=CHATML_TEMPLATE)


def test_unknown_role_raises(tok):
    bad = [{"role": "narrator", "content": "x"}] + TWO_TURN
    with pytest.raises(ValueError, match="narrator"):
        chat_sample(tok, bad, chat_template=CHATML_TEMPLATE)


def test_missing_template_raises(tok):
    with pytest.raises(ValueError, match="chat_template"):
        chat_sample(tok, TWO_TURN)


# Renders a default system line only when add_generation_prompt is false.
SYSTEM_UNLESS_GEN = (
    "{%- if not add_generation_prompt %}{{- '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}{%- endif %}"
    + CHATML_TEMPLATE
)
# Strips whitespace from the last message only (Qwen3-style history rewriting).
TRIM_LAST = (
    "{%- for message in messages %}"
    "{%- set c = message['content'] | trim if loop.last else message['content'] %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + c + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize("template", [SYSTEM_UNLESS_GEN, TRIM_LAST], ids=["system", "trim"])
def test_non_prefix_stable_template_raises(tok, template):
    messages = [
        {"role": "user", "content": "Hi "},
        {"role": "assistant", "content": "Hello. "},
        {"role": "user", "content": "More "},
        {"role": "assistant", "content": "Done."},
    ]
    with pytest.raises(ValueError, match="not prefix-stable"):
        chat_sample(tok, messages, chat_template=template)


def test_all_zero_or_all_one_mask_raises(tok):
    empty_generation = CHATML_TEMPLATE_WITH_GENERATION.replace(
        "{{- message['content'] + '<|im_end|>' }}{% endgeneration %}",
        "{% endgeneration %}{{- message['content'] + '<|im_end|>' }}",
    )
    assert empty_generation != CHATML_TEMPLATE_WITH_GENERATION
    with pytest.raises(ValueError, match="all-zeros"):
        chat_sample(tok, TWO_TURN, chat_template=empty_generation)
    only_assistant = (
        "{%- for message in messages %}{%- if message['role'] == 'assistant' %}"
        "{% generation %}{{- message['content'] }}{% endgeneration %}{%- endif %}{%- endfor %}"
    )
    with pytest.raises(ValueError, match="all-ones"):
        chat_sample(tok, TWO_TURN, chat_template=only_assistant)


def test_template_text_and_hash(tok):
    assert template_text(tok) == "completion-mode"
    assert template_text(tok, CHATML_TEMPLATE, mode="chat") == CHATML_TEMPLATE
    with pytest.raises(ValueError, match="mode"):
        template_text(tok, mode="instruct")
    h = template_hash(CHATML_TEMPLATE)
    assert h == template_hash(str(CHATML_TEMPLATE)) and len(h) == 64
    assert h != template_hash(CHATML_TEMPLATE_WITH_GENERATION)
    assert template_hash("completion-mode") != h


# --- chat_template_kwargs reach 01's prompts-file rendering (issue 32 item 1, first part) ----------

STORIES_TEMPLATE = REPO / "eagle3nb" / "data" / "chat_template_stories.jinja"


def test_encode_prompt_passes_template_kwargs():
    t = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    template = STORIES_TEMPLATE.read_text()
    got = encode_prompt(t, "Tell me a story.", "chat", template, {"enable_thinking": False})
    # second method: the template's text (jinja through transformers), tokenised by hand
    msgs = [{"role": "user", "content": "Tell me a story."}]
    text = t.apply_chat_template(
        msgs,
        chat_template=template,
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    assert text.endswith("Assistant: <think></think>")  # the template's thinking-off form
    assert got == t(text, add_special_tokens=False).input_ids
    assert got != encode_prompt(t, "Tell me a story.", "chat", template)


def test_01_prompts_file_renders_with_the_kwargs_and_records_them(tmp_path):
    import json

    from eagle3nb.params import RunParams
    from eagle3nb.rundir import RunDir
    from eagle3nb.steps.generate.step import generate_step

    f = tmp_path / "p.txt"
    f.write_text("".join(f"Tom saw cat number {i}.\n" for i in range(12)))
    kw = {"enable_thinking": False}
    p = RunParams(
        outputs_dir=str(tmp_path),
        run_name="kw",
        mode="chat",
        chat_template=str(STORIES_TEMPLATE),
        chat_template_kwargs=kw,
        prompts_file=str(f),
        heldout_fraction=0.3,
        max_new_tokens=4,
    )
    out = generate_step(p, progress=False)
    t = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    template = STORIES_TEMPLATE.read_text()
    for r in out["records"]:  # train and held-out: each equals the hand render with the kwargs
        msgs = [{"role": "user", "content": r["prompt"]}]
        text = t.apply_chat_template(
            msgs, chat_template=template, add_generation_prompt=True, tokenize=False, **kw
        )
        assert r["prompt_ids"] == t(text, add_special_tokens=False).input_ids
    man = json.loads(RunDir(p).generation_manifest.read_text())
    assert man["template_kwargs"] == kw
    assert man["template"]["sha256"] == template_hash(template)
