"""Build (input_ids, loss_mask) training samples for EAGLE-3 drafters.

Two modes:
* completion (base models): BOS + prompt tokens (mask 0) + continuation tokens (mask 1).
* chat: the conversation is rendered with a jinja chat template; assistant tokens get mask 1.

Token ids are always produced the way transformers 5 ``apply_chat_template(tokenize=True)`` does:
render to text (``tokenize=False``), then ``tokenizer(text, add_special_tokens=False)``. The template
alone decides whether a BOS appears, so BOS is never doubled.

Assistant span convention (both chat paths): the assistant content *plus* the end-of-turn token
(e.g. ``<|im_end|>``) that the model must generate to stop, as SpecForge does. Separator whitespace
rendered after the end-of-turn token (ChatML's trailing newline) is not marked: generation stops at
the end-of-turn token, so the model never produces it (SpecForge's Qwen template also marks that
newline; we do not).

Reasoning templates (Qwen3-style: assistant content rendered with a ``<think>...</think>`` block,
and the reasoning stripped from assistant turns before the last user message):
* single turn (what the generation step produces, see ``chat_turns_from_generation``): the sample is
  ``encode_prompt(prompt)`` followed by the reply's tokens (think block + content + end-of-turn), i.e.
  what serving sends and the target generates; the think block is marked like the rest of the reply.
* multi-turn: refused (ValueError, "not prefix-stable"). The full rendering rewrites the history (an
  earlier turn loses its reasoning), so those tokens are not what the target generated at that turn
  and no mask over one rendering is faithful. Train on single-turn samples instead.
"""

from __future__ import annotations

import hashlib
import re

ROLES = ("system", "user", "assistant", "tool")
COMPLETION_TEMPLATE = "completion-mode"

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHATML_TEMPLATE_WITH_GENERATION = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _as_ids(out) -> list[int]:
    """Normalise list / nested list / tensor / dict / BatchEncoding output to a flat list[int]."""
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], (list, tuple)):
        if len(out) != 1:
            raise ValueError(f"expected one sequence, got a batch of {len(out)}")
        out = out[0]
    return [int(t) for t in out]


def render_ids(
    tokenizer,
    messages,
    template: str,
    add_generation_prompt: bool,
    tools: list | None = None,
    template_kwargs: dict | None = None,
) -> list[int]:
    """Token ids (list[int]) of ``messages`` rendered by the jinja ``template`` as served: the text
    (``tools`` and ``template_kwargs``, e.g. ``enable_thinking``, passed to the template), then
    ``tokenizer(text, add_special_tokens=False)``."""
    text = tokenizer.apply_chat_template(
        messages,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        tools=tools,
        **(template_kwargs or {}),
    )
    return _as_ids(tokenizer(text, add_special_tokens=False).input_ids)


def template_text(tokenizer, chat_template: str | None = None, mode: str = "completion") -> str:
    """Return the template string in use: ``"completion-mode"`` for mode="completion", else the jinja text.

    chat mode uses ``chat_template`` if given, else ``tokenizer.chat_template``.
    Raises ValueError for an unknown mode, or in chat mode when no template is available.
    """
    if mode == "completion":
        return COMPLETION_TEMPLATE
    if mode != "chat":
        raise ValueError(f"mode={mode!r} is unknown; use mode='completion' or mode='chat'")
    text = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    if not isinstance(text, str) or not text:
        raise ValueError(
            f"chat_template={chat_template!r} and the tokenizer has no chat template (chat_template="
            f"{getattr(tokenizer, 'chat_template', None)!r}); pass chat_template=CHATML_TEMPLATE "
            "(or the model's template) or use mode='completion'"
        )
    return text


def template_hash(text: str) -> str:
    """sha256 hex digest (64 chars) of a template string, stored in manifests to refuse a different one at eval."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def encode_prompt(
    tokenizer,
    prompt: str,
    mode: str,
    chat_template: str | None = None,
    template_kwargs: dict | None = None,
) -> list[int]:
    """Prompt ids (list[int]) for generation.

    completion: ``tokenizer(prompt).input_ids`` (default special tokens, so BOS is added).
    chat: ``apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
    tokenize=True, **template_kwargs)`` normalised to list[int] (transformers 5 may return a
    BatchEncoding); ``template_kwargs`` (the run's ``chat_template_kwargs``, e.g.
    ``{"enable_thinking": False}``) reach the template as in every other rendering; these ids are
    exactly the prefix that ``chat_sample`` produces for the same turn.
    Raises ValueError for an unknown mode or a missing chat template.
    """
    if mode == "completion":
        return _as_ids(tokenizer(prompt).input_ids)
    template = template_text(tokenizer, chat_template, mode)
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        chat_template=template,
        add_generation_prompt=True,
        tokenize=True,
        **(template_kwargs or {}),
    )
    return _as_ids(out)


def completion_sample(
    tokenizer, prompt: str, continuation_ids: list[int]
) -> tuple[list[int], list[int]]:
    """Completion-mode sample: (ids, mask), both list[int] of length len(prompt_ids) + len(continuation_ids).

    prompt_ids = ``tokenizer(prompt).input_ids`` (BOS added); continuation ids are appended unchanged.
    mask is 0 on prompt tokens and 1 on continuation tokens. Raises ValueError if continuation_ids is empty.
    """
    cont = [int(t) for t in continuation_ids]
    if not cont:
        raise ValueError(
            "continuation_ids=[] gives an all-zero loss mask; pass at least one continuation token"
        )
    prompt_ids = encode_prompt(tokenizer, prompt, "completion")
    return prompt_ids + cont, [0] * len(prompt_ids) + [1] * len(cont)


def generated_sample(prompt_ids: list[int], output_ids: list[int]) -> tuple[list[int], list[int]]:
    """Sample of a turn the target regenerated: the served prompt ids (BOS+prompt, or the template
    rendered with its generation prompt) followed by exactly the generated ids; mask 0 / 1.

    Never decode and re-tokenise generated ids: decoding is not the inverse of encoding (extra
    spaces around added tokens, non-canonical tokenisations the target may emit).

    Raises:
        ValueError: no generated token (the mask would be all zeros).
    """
    if not output_ids:
        raise ValueError(
            "output_ids=[]: the target generated nothing for this prompt, so the loss mask would be all zeros"
        )
    return list(prompt_ids) + list(output_ids), [0] * len(prompt_ids) + [1] * len(output_ids)


def chat_turns_from_generation(prompt: str, reply: str) -> list[dict]:
    """[{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]."""
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]


def _check_prefix(short: list[int], long: list[int], what: str) -> None:
    if long[: len(short)] != short:
        k = next(
            (j for j, (a, b) in enumerate(zip(short, long)) if a != b), min(len(short), len(long))
        )
        raise ValueError(
            f"chat_template is not prefix-stable: the tokens of {what} are not a token prefix of the "
            f"longer rendering (first difference at token {k}: {short[k : k + 4]} vs {long[k : k + 4]}). "
            "Fix: use a template whose rendering of earlier turns does not depend on later turns or on "
            "add_generation_prompt, or add {% generation %}...{% endgeneration %} tags "
            "(see CHATML_TEMPLATE_WITH_GENERATION)"
        )


def _trim_end(tokenizer, ids: list[int], start: int, end: int) -> int:
    """Drop whitespace rendered after the last special (end-of-turn) token of the span ids[start:end]."""
    special = set(tokenizer.all_special_ids)
    last = next((j for j in range(end - 1, start - 1, -1) if ids[j] in special), None)
    if last is not None and tokenizer.decode(ids[last + 1 : end]).strip() == "":
        return last + 1
    return end


def chat_sample(
    tokenizer,
    messages: list[dict],
    chat_template: str | None = None,
    tools: list | None = None,
    template_kwargs: dict | None = None,
) -> tuple[list[int], list[int]]:
    """Chat-mode sample: (ids, mask), both list[int] of the same length; mask 1 on assistant tokens.

    ``messages`` is a list of {"role": "system" | "user" | "assistant" | "tool", "content": str}
    (assistant turns may hold ``reasoning_content`` and ``tool_calls``); ``tools`` and
    ``template_kwargs`` (e.g. ``{"enable_thinking": False}``) go to the template.
    If the template has ``{% generation %}`` tags, the mask is HF's ``return_assistant_tokens_mask=True``
    (``return_dict=True``). Otherwise it mirrors SpecForge's prefix rendering: for assistant turn i,
    render(messages[:i], add_generation_prompt=True) must be a token prefix of render(messages[:i+1]),
    which must be a token prefix of the full rendering; the tokens in between are the turn (content +
    end-of-turn token; trailing separator whitespace after the last special token is left at 0).
    Raises ValueError for: a missing template, an unknown role, no assistant turn, a conversation that
    starts with an assistant turn (prefix path), a template that is not prefix-stable (including a
    multi-turn conversation under a template that rewrites history, e.g. strips earlier ``<think>``
    blocks), or a mask that is all zeros or all ones.
    """
    template = template_text(tokenizer, chat_template, "chat")
    for j, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise ValueError(
                f"messages[{j}]['role']={m.get('role')!r} is unknown; use one of {ROLES}"
            )
    turns = [j for j, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise ValueError(
            f"messages has no assistant turn (roles: {[m['role'] for m in messages]}); add at least one "
            "{'role': 'assistant', 'content': ...} message, or use completion_sample"
        )

    kw = {"tools": tools, **(template_kwargs or {})}
    if _GENERATION_TAG.search(template):
        out = tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **kw,
        )
        ids, mask = _as_ids(out), _as_ids(out["assistant_masks"])
    else:
        if turns[0] == 0:
            raise ValueError(
                "messages[0] is an assistant turn; the prefix-rendering path needs a system or user "
                "message before it (or use a chat_template with {% generation %} tags)"
            )
        ids = render_ids(tokenizer, messages, template, False, tools, template_kwargs)
        mask = [0] * len(ids)
        for i in turns:
            head = render_ids(tokenizer, messages[:i], template, True, tools, template_kwargs)
            turn = render_ids(tokenizer, messages[: i + 1], template, False, tools, template_kwargs)
            _check_prefix(head, turn, f"messages[:{i}] rendered with add_generation_prompt=True")
            _check_prefix(turn, ids, f"messages[:{i + 1}]")
            for k in range(len(head), _trim_end(tokenizer, ids, len(head), len(turn))):
                mask[k] = 1

    if not any(mask) or all(mask):
        raise ValueError(
            f"chat_template gives an all-{'ones' if all(mask) else 'zeros'} loss mask for roles "
            f"{[m['role'] for m in messages]}; the template must render assistant contents and "
            "non-assistant text (check its {% generation %} tags or use CHATML_TEMPLATE)"
        )
    return ids, mask


def conversation_rows(
    tokenizer,
    messages: list[dict],
    chat_template: str | None = None,
    tools: list | None = None,
    template_kwargs: dict | None = None,
) -> list[tuple[list[int], list[int]]]:
    """Training rows of one conversation: ``[chat_sample(...)]`` when the template renders it
    prefix-stably; else (a reasoning template that drops earlier turns' reasoning) one row per
    assistant turn i: ``messages[: i + 1]`` rendered, mask 1 on turn i only.

    Raises:
        ValueError: as :func:`chat_sample` (except prefix-instability across turns).
    """
    try:
        return [chat_sample(tokenizer, messages, chat_template, tools, template_kwargs)]
    except ValueError as e:
        if "not prefix-stable" not in str(e):
            raise
    template = template_text(tokenizer, chat_template, "chat")
    rows = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = render_ids(tokenizer, messages[:i], template, True, tools, template_kwargs)
        ids = render_ids(tokenizer, messages[: i + 1], template, False, tools, template_kwargs)
        _check_prefix(head, ids, f"messages[:{i}] rendered with add_generation_prompt=True")
        end = _trim_end(tokenizer, ids, len(head), len(ids))
        rows.append((ids, [0] * len(head) + [1] * (end - len(head)) + [0] * (len(ids) - end)))
    return rows
