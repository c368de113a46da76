"""Bad input, faults and silent corruption on the text side: chat templates, template hashes,
padding in generation and capture, empty / too-long inputs.

Every expected value is computed here independently of the code under test: hand-built ChatML text
with character offsets for the loss mask, hashlib for template hashes, a plain no-cache greedy loop
for generation, HF ``output_hidden_states`` for capture.
"""

import hashlib
import inspect

import pytest
import torch
from transformers import AddedToken, AutoTokenizer

from eagle3nb.steps.evaluate.step import _eval, check_drafter_matches
from eagle3nb.target.capture import HFCaptureEngine, capture_boundaries
from eagle3nb.text.chat import (
    generated_sample,
    CHATML_TEMPLATE,
    CHATML_TEMPLATE_WITH_GENERATION,
    chat_sample,
    chat_turns_from_generation,
    encode_prompt,
    template_hash,
)
from eagle3nb.text.generation import generate_batch
from eagle3nb.manifest import ManifestMismatch

IM_START, IM_END = "<|im_start|>", "<|im_end|>"

# Qwen3-style reasoning template (ChatML): an assistant turn after the last user message is rendered
# with its <think> block; earlier assistant turns lose their reasoning (history rewriting). No
# generation tags, so chat_sample takes the prefix-rendering path.
THINK_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}"
    "{%- set c = m['content'] %}{%- set r = '' %}"
    "{%- if '</think>' in c %}"
    "{%- set r = c.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set c = c.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_user %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + r + '\\n</think>\\n\\n' + c + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + c + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
S = lambda c: {"role": "system", "content": c}  # noqa: E731

CONVERSATIONS = {
    "single": [U("Tell me a story."), A("Once upon a time there was a cat.")],
    "system": [S("You are kind."), U("Hi!"), A("Hello, little friend.")],
    "multi": [
        U("Hi"),
        A("Hello."),
        U("And then?"),
        A("The dog ran\nto the park."),
        U("Why?"),
        A("It was happy!"),
    ],
    "system-multi": [S("Be brief."), U("Name a pet."), A("A cat."), U("Another?"), A("A dog.")],
    "short": [U("?"), A("!")],
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny forwards: one intra-op thread avoids thread-sync stalls on a busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def chat_tok(target):
    """A fresh copy of the target's tokenizer with ChatML special tokens and Qwen3-like think tokens
    (added, not special, not normalized: decode(skip_special_tokens=True) keeps them)."""
    t = AutoTokenizer.from_pretrained(str(target[2]))
    t.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    t.add_tokens(
        [
            AddedToken("<think>", normalized=False, special=False),
            AddedToken("</think>", normalized=False, special=False),
        ]
    )
    return t


def expected_sample(tok, messages):
    """(ids, mask) from hand-built ChatML text: a token is 1 iff its characters lie inside an
    assistant turn's content + <|im_end|> (not the newline after it)."""
    text, spans = "", []
    for m in messages:
        text += f"{IM_START}{m['role']}\n"
        start = len(text)
        text += m["content"] + IM_END
        if m["role"] == "assistant":
            spans.append((start, len(text)))
        text += "\n"
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= s and e <= b for a, b in spans)) for s, e in enc.offset_mapping]
    return enc.input_ids, mask


# --- 1. chat templates --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize(
    "template", [CHATML_TEMPLATE, CHATML_TEMPLATE_WITH_GENERATION], ids=["prefix", "gentags"]
)
def test_chat_mask_is_assistant_spans_never_all_ones_or_zeros(chat_tok, name, template):
    messages = CONVERSATIONS[name]
    ids, mask = chat_sample(chat_tok, messages, chat_template=template)
    want_ids, want_mask = expected_sample(chat_tok, messages)
    assert ids == want_ids
    assert mask == want_mask
    assert 0 < sum(mask) < len(mask)


REASONING = [
    ("Tell me a story.", "The user wants a story.", "Once upon a time there was a cat."),
    ("Hi!", "A greeting.\nBe kind.", "Hello, little friend."),
    ("Why?", "", "Because."),
]


@pytest.mark.parametrize("prompt,reasoning,answer", REASONING)
def test_think_template_single_turn_is_what_serving_sends_and_generates(
    chat_tok, prompt, reasoning, answer
):
    tok = chat_tok
    reply = f"<think>\n{reasoning}\n</think>\n\n{answer}"
    # served prompt: rendered by hand, tokenized like the server does
    served = tok(
        f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n", add_special_tokens=False
    ).input_ids
    assert encode_prompt(tok, prompt, "chat", chat_template=THINK_TEMPLATE) == served
    # what the target generates: the reply (think block included) then the end-of-turn token
    generated = tok(reply, add_special_tokens=False).input_ids + [tok.convert_tokens_to_ids(IM_END)]
    assert (
        tok.convert_tokens_to_ids("<think>") in generated
        and tok.convert_tokens_to_ids("</think>") in generated
    )

    ids, mask = chat_sample(
        tok, chat_turns_from_generation(prompt, reply), chat_template=THINK_TEMPLATE
    )
    n = len(served) + len(generated)
    assert ids[:n] == served + generated
    assert tok.decode(ids[n:]).strip() == ""  # only ChatML's separator newline follows
    assert mask == [0] * len(served) + [1] * len(generated) + [0] * (len(ids) - n)


def test_think_template_multi_turn_is_refused(chat_tok):
    messages = [
        S("Be brief."),
        U("Name a pet."),
        A("<think>\nSomething small.\n</think>\n\nA cat."),
        U("Another?"),
        A("<think>\nNot a cat.\n</think>\n\nA dog."),
    ]
    # the template does rewrite history: only the last turn keeps its reasoning
    text = chat_tok.apply_chat_template(messages, chat_template=THINK_TEMPLATE, tokenize=False)
    assert text.count("<think>") == 1 and "Something small." not in text and "Not a cat." in text
    with pytest.raises(ValueError, match="not prefix-stable"):
        chat_sample(chat_tok, messages, chat_template=THINK_TEMPLATE)
    # the single-turn samples it is split into are fine
    chat_sample(chat_tok, messages[1:3], chat_template=THINK_TEMPLATE)


def _served_and_generated(tok, prompt, reply):
    """(served prompt ids, reply ids + <|im_end|> as a model trained on ChatML generates them): the
    tokens of the hand-built ChatML text, split after the served prompt."""
    head = f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"
    served = tok(head, add_special_tokens=False).input_ids
    full = tok(head + reply + IM_END, add_special_tokens=False).input_ids
    assert full[: len(served)] == served
    return served, full[len(served) :]


def test_generated_sample_keeps_generated_tokens_exactly(chat_tok):
    """The sample of a regenerated turn is the served prompt + the generated ids, never re-tokenised
    text (decode is not the inverse of encode: '<think>' + newline decodes with an extra space; the
    target may emit a non-canonical split like '\u2581Once' that re-tokenises as 'O','n','ce')."""
    prompt = "Hi"
    for template, reply in [
        (THINK_TEMPLATE, "<think>\nA cat.\n</think>\n\nOnce upon a time."),
        (CHATML_TEMPLATE, "Once upon a time."),
    ]:
        served, generated = _served_and_generated(chat_tok, prompt, reply)
        assert encode_prompt(chat_tok, prompt, "chat", chat_template=template) == served
        ids, mask = generated_sample(served, generated)
        assert ids == served + generated and mask == [0] * len(served) + [1] * len(generated)
    odd = chat_tok.convert_tokens_to_ids(["\u2581Once"]) + [chat_tok.convert_tokens_to_ids(IM_END)]
    ids, mask = generated_sample(served, odd)
    assert ids[len(served) :] == odd
    # on a canonical reply the chat template's own prefix rendering gives the same mask
    served, generated = _served_and_generated(
        chat_tok, prompt, "Once upon a time, Tom saw a big dog."
    )
    ids_c, mask_c = chat_sample(
        chat_tok,
        [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": "Once upon a time, Tom saw a big dog."},
        ],
        chat_template=CHATML_TEMPLATE,
    )
    n = len(served) + len(generated)
    assert (ids_c[:n], mask_c[:n]) == generated_sample(served, generated)


# --- 2. template hash ---------------------------------------------------------------------------


def _eval_template_check(dman, mode, template, target_sha, kwargs=None):
    """The check eval_step runs before evaluating a drafter."""
    check_drafter_matches(dman, mode, template, target_sha, "run/drafter", kwargs)


def test_template_hash_is_sha256_and_differs():
    for t in (CHATML_TEMPLATE, THINK_TEMPLATE, "completion-mode"):
        assert template_hash(t) == hashlib.sha256(t.encode("utf-8")).hexdigest()
    assert (
        len(
            {
                template_hash(t)
                for t in (
                    CHATML_TEMPLATE,
                    CHATML_TEMPLATE_WITH_GENERATION,
                    THINK_TEMPLATE,
                    "completion-mode",
                )
            }
        )
        == 4
    )
    assert template_hash(CHATML_TEMPLATE) != template_hash(CHATML_TEMPLATE + " ")


def test_eval_refuses_drafter_trained_under_another_template():
    # 04 itself runs the check (eval_step's body; a re-run reads back only on the same template)
    src = " ".join(inspect.getsource(_eval).split())
    want = "check_drafter_matches( dman, p.mode, template_of(p, tok), target_sha, rd.drafter, "
    assert want + "p.chat_template_kwargs )" in src
    sha = "ab" * 32
    dman = {
        "template": {
            "mode": "chat",
            "sha256": hashlib.sha256(CHATML_TEMPLATE.encode()).hexdigest(),
        },
        "target": {"sha256": sha},
    }
    _eval_template_check(dman, "chat", CHATML_TEMPLATE, sha)  # same template: accepted
    with pytest.raises(ManifestMismatch, match="template") as e:
        _eval_template_check(dman, "chat", THINK_TEMPLATE, sha)
    assert hashlib.sha256(THINK_TEMPLATE.encode()).hexdigest() in str(
        e.value
    ) and "target.sha256" not in str(e.value)
    with pytest.raises(
        ManifestMismatch, match="template"
    ):  # a completion-mode eval of a chat drafter
        _eval_template_check(dman, "completion", "completion-mode", sha)


# --- 3. padding ---------------------------------------------------------------------------------

TEXTS = [
    "Tom ran.",
    "Lily had a red ball and a",
    "Once upon a time, there was a big tree in the middle of a field and a bird",
]


@torch.no_grad()
def greedy_alone(model, ids, n, eos):
    """Reference: one unpadded prompt, full forward each step (no cache, no attention mask)."""
    x, out = list(ids), []
    for _ in range(n):
        t = int(model(torch.tensor([x])).logits[0, -1].argmax())
        out.append(t)
        x.append(t)
        if t == eos:
            break
    return out


@pytest.mark.parametrize("pad", [None, 0], ids=["pad=eos", "pad=0"])
def test_left_padded_generation_equals_alone(target, pad):
    model, tok, _ = target
    assert tok.pad_token_id is None  # the target's tokenizer has no pad token
    prompts = [tok(t).input_ids for t in TEXTS]
    assert len({len(p) for p in prompts}) == 3
    eos = tok.eos_token_id
    outs = generate_batch(model, prompts, 20, eos, pad_token_id=pad)
    for p, o in zip(prompts, outs):
        assert o == greedy_alone(model, p, 20, eos)


@pytest.mark.parametrize("pad", ["zero", "eos"])
def test_capture_right_padded_equals_unpadded(target, pad):
    model, tok, _ = target
    n = model.config.num_hidden_layers
    samples = [tok(t).input_ids for t in TEXTS]
    T = max(len(s) for s in samples)
    fill = 0 if pad == "zero" else tok.eos_token_id
    ids = torch.full((len(samples), T), fill, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(samples):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    st = capture_boundaries(model, ids, range(n + 1), mask)
    for i, s in enumerate(samples):
        hs = model(torch.tensor([s]), output_hidden_states=True).hidden_states
        for b in range(n):
            torch.testing.assert_close(st[b][i, : len(s)], hs[b][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            model.model.norm(st[n][i, : len(s)]), hs[n][0], atol=1e-5, rtol=1e-5
        )
    # the engine (which pads with 0) gives the same per-sample states
    eng = HFCaptureEngine(model, "vllm", batch_size=3).capture(samples, [1, 2, n])
    for i, (c, s) in enumerate(zip(eng, samples)):
        hs = model(torch.tensor([s]), output_hidden_states=True).hidden_states
        torch.testing.assert_close(
            c.aux, torch.cat([hs[1][0], hs[2][0], st[n][i, : len(s)]], -1), atol=1e-5, rtol=1e-5
        )


def test_capture_refuses_left_padding_and_gaps(target):
    model, tok, _ = target
    ids = torch.tensor([tok("Tom ran to the park.").input_ids] * 2)
    T = ids.shape[1]
    left = torch.ones_like(ids)
    left[1, :2] = 0
    gap = torch.ones_like(ids)
    gap[0, 3] = 0
    empty = torch.ones_like(ids)
    empty[1] = 0
    for m in (left, gap, empty):
        with pytest.raises(ValueError, match="right padding"):
            capture_boundaries(model, ids, [1], m)
    right = torch.ones_like(ids)
    right[1, T - 2 :] = 0
    capture_boundaries(model, ids, [1], right)  # right padding is accepted


# --- 4. empty / too-long inputs -----------------------------------------------------------------


def test_generate_batch_empty_inputs(target):
    model, tok, _ = target
    assert generate_batch(model, [], 20, tok.eos_token_id) == []
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] is empty"):
        generate_batch(model, [[1, 300], []], 5, tok.eos_token_id)


def test_encode_prompt_lengths_and_context_limit(target, chat_tok):
    model, tok, _ = target
    ctx = model.config.max_position_embeddings
    text = "Once upon a time, there was a little dog. " * 60
    ids = encode_prompt(tok, text, "completion")
    assert ids == tok(text).input_ids and ids[0] == tok.bos_token_id
    assert len(ids) > ctx  # never truncated silently
    chat_ids = encode_prompt(chat_tok, "Hi", "chat", chat_template=CHATML_TEMPLATE)
    assert len(chat_ids) == len(
        chat_tok(
            f"{IM_START}user\nHi{IM_END}\n{IM_START}assistant\n", add_special_tokens=False
        ).input_ids
    )
    with pytest.raises(ValueError, match=f"exceeds the context of {ctx}"):
        generate_batch(model, [[1, 300], ids], 5, tok.eos_token_id)
    short = ids[: ctx - 10]
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] has"):
        generate_batch(model, [short], 11, tok.eos_token_id)
    assert len(generate_batch(model, [short], 10, tok.eos_token_id)[0]) <= 10  # exactly fits
