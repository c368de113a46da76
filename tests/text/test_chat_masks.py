"""Loss masks of chat samples under eagle3nb's stories template equal masks written by hand: the
text is assembled by hand (no jinja), tokenised once, and a token is marked when its characters lie
inside a hand-marked assistant span (the reply and its end-of-turn token, never the header); for a
3-turn chat with a system prompt, reasoning with enable_thinking on and off, a tool call and its
result."""

import pytest
from transformers import AutoTokenizer

from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.text import chat

TEMPLATE = (REPO_ROOT / "eagle3nb" / "data" / "chat_template_stories.jinja").read_text()
EOS = "</s>"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(REPO_ROOT.parent / "shared/models/stories260K-hd32"))


def hand(tok, pieces):
    """(ids, mask) of text pieces ``[(text, marked)]``: the concatenation tokenised once; a token
    is marked when its character span lies inside a marked piece."""
    text, spans, pos = "", [], 0
    for piece, marked in pieces:
        if marked:
            spans.append((pos, pos + len(piece)))
        text += piece
        pos += len(piece)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [
        int(any(a <= s and e <= b for a, b in spans) and e > s) for s, e in enc["offset_mapping"]
    ]
    return list(enc["input_ids"]), mask


def test_three_turns_with_system(tok):
    msgs = [
        {"role": "system", "content": "You tell short stories."},
        {"role": "user", "content": "Tell me about a cat."},
        {"role": "assistant", "content": "The cat sat on a mat."},
        {"role": "user", "content": "What did it eat?"},
        {"role": "assistant", "content": "It ate a fish."},
        {"role": "user", "content": "Was it happy?"},
        {"role": "assistant", "content": "Yes, very happy."},
    ]
    want = hand(
        tok,
        [
            ("<s>System: You tell short stories.\nUser: Tell me about a cat.\nAssistant:", 0),
            (" The cat sat on a mat." + EOS, 1),
            ("\nUser: What did it eat?\nAssistant:", 0),
            (" It ate a fish." + EOS, 1),
            ("\nUser: Was it happy?\nAssistant:", 0),
            (" Yes, very happy." + EOS, 1),
            ("\n", 0),
        ],
    )
    assert chat.conversation_rows(tok, msgs, TEMPLATE) == [want]
    assert sum(want[1]) and not all(want[1])


REASONING = [
    {"role": "user", "content": "Tell me a story."},
    {"role": "assistant", "content": "A dog ran.", "reasoning_content": "Keep it short."},
    {"role": "user", "content": "More?"},
    {"role": "assistant", "content": "It ran home.", "reasoning_content": "One line."},
]


def test_reasoning_thinking_on_one_row_per_turn(tok):
    # earlier turns lose their reasoning in the full rendering: one row per assistant turn
    row0 = hand(
        tok,
        [
            ("<s>User: Tell me a story.\nAssistant:", 0),
            (" <think>Keep it short.</think> A dog ran." + EOS, 1),
            ("\n", 0),
        ],
    )
    row1 = hand(
        tok,
        [
            ("<s>User: Tell me a story.\nAssistant: A dog ran." + EOS + "\nUser: More?\n", 0),
            ("Assistant:", 0),
            (" <think>One line.</think> It ran home." + EOS, 1),
            ("\n", 0),
        ],
    )
    assert chat.conversation_rows(tok, REASONING, TEMPLATE) == [row0, row1]
    on = {"enable_thinking": True}
    assert chat.conversation_rows(tok, REASONING, TEMPLATE, None, on) == [row0, row1]
    # single turn: one row, prefix-stable
    assert chat.conversation_rows(tok, REASONING[:2], TEMPLATE) == [row0]


def test_reasoning_thinking_off(tok):
    off = {"enable_thinking": False}
    row0 = hand(
        tok,
        [
            ("<s>User: Tell me a story.\nAssistant: <think></think>", 0),
            (" A dog ran." + EOS, 1),
            ("\n", 0),
        ],
    )
    row1 = hand(
        tok,
        [
            ("<s>User: Tell me a story.\nAssistant: A dog ran." + EOS + "\nUser: More?\n", 0),
            ("Assistant: <think></think>", 0),
            (" It ran home." + EOS, 1),
            ("\n", 0),
        ],
    )
    assert chat.conversation_rows(tok, REASONING, TEMPLATE, None, off) == [row0, row1]
    assert chat.conversation_rows(tok, REASONING[:2], TEMPLATE, None, off) == [row0]


def test_tool_call_and_result(tok):
    call = {"id": "c0", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": {"place": "park"}}
    msgs = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Is it sunny?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c0"},
        {"role": "assistant", "content": "Yes, it is sunny."},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    want = hand(
        tok,
        [
            ("<s>Tools: get_weather\nSystem: Be kind.\nUser: Is it sunny?\nAssistant:", 0),
            (' <tool_call>{"name": "get_weather", "arguments": {"place": "park"}}</tool_call>', 1),
            (EOS, 1),
            ("\nTool: sunny\nAssistant:", 0),
            (" Yes, it is sunny." + EOS, 1),
            ("\n", 0),
        ],
    )
    assert chat.conversation_rows(tok, msgs, TEMPLATE, tools) == [want]
    with pytest.raises(ValueError, match="unknown"):
        chat.chat_sample(tok, [{"role": "narrator", "content": "x"}] + msgs, TEMPLATE, tools)
