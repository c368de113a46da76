"""Turn-by-turn regeneration: rows built from served ids equal one full rendering of the
conversation the engine produced (second method: chat.conversation_rows), reasoning turns split
rows, tool calls are paired with the dataset's results in order (or end the conversation, named),
the context ends a conversation, and a run interrupted after some chunks resumes to the same
results without redoing them; 01 killed with SIGKILL and rerun, and 01 with two data-parallel
workers, write the same file as one uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from transformers import AutoTokenizer

from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.text import chat
from eagle3nb.text.regenerate import parse_reply, regenerate, run_key

TEMPLATE = (REPO_ROOT / "eagle3nb" / "data" / "chat_template_stories.jinja").read_text()


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(REPO_ROOT.parent / "shared/models/stories260K-hd32"))


class ScriptedEngine:
    """Answers the n-th turn of a prompt with the ids of a scripted reply (the reply text with
    its leading space, tokenised alone, plus EOS: what a target that writes it emits). The turn
    is the number of assistant headers in the prompt."""

    def __init__(self, tok, replies):
        self.tok, self.replies = tok, replies
        self.calls = []
        self.header = tok("Assistant:", add_special_tokens=False).input_ids[1:]

    def __call__(self, batch, seed):
        self.calls.append(len(batch))
        outs = []
        for ids in batch:
            h = self.header
            n = sum(ids[i : i + len(h)] == h for i in range(len(ids))) - 1
            reply = self.replies[n].lstrip(" ") + "</s>"
            outs.append(self.tok(reply, add_special_tokens=False).input_ids)
        return outs


def _run(recs, gen, tok, tmp_path, kwargs=None, ctx=512, batch=2, name="p.jsonl"):
    key = run_key(recs, {"t": 1})
    return regenerate(
        recs,
        gen,
        tok,
        TEMPLATE,
        template_kwargs=kwargs,
        max_new_tokens=24,
        ctx=ctx,
        batch_size=batch,
        partial=tmp_path / name,
        key=key,
    )


def full_render(tok, messages, tools=None, kwargs=None):
    """chat.conversation_rows of the conversation as served, each row cut after its last masked
    token (the separator the template writes after the final end-of-turn is never served)."""
    out = []
    for ids, mask in chat.conversation_rows(tok, messages, TEMPLATE, tools, kwargs):
        end = max(i for i, m in enumerate(mask) if m) + 1
        out.append((ids[:end], mask[:end]))
    return out


USERS = [
    {"role": "system", "content": "Be kind."},
    {"role": "user", "content": "Tell me about a cat."},
    {"role": "assistant", "content": "dataset answer one"},
    {"role": "user", "content": "What did it eat?"},
    {"role": "assistant", "content": "dataset answer two"},
    {"role": "user", "content": "Was it happy?"},
    {"role": "assistant", "content": "dataset answer three"},
]


def test_rows_from_served_ids_equal_one_full_render(tok, tmp_path):
    replies = [" The cat sat.", " It ate a fish.", " Yes, very happy."]
    res = _run([{"id": "a", "messages": USERS}], ScriptedEngine(tok, replies), tok, tmp_path)[0]
    assert res["ended"] is None and len(res["turns"]) == 3
    served = [m for m in USERS if m["role"] != "assistant"]
    for i, r in enumerate(replies):
        served.insert(2 + 2 * i, {"role": "assistant", "content": r.strip()})
    want = full_render(tok, served)
    rows = [(r["input_ids"], r["loss_mask"]) for r in res["rows"]]
    assert rows == want and res["rows"][0]["turns"] == [0, 1, 2]
    assert [t["text"] for t in res["turns"]] == [r.strip() for r in replies]


def test_cut_reply_closed_by_template_with_mask_zero(tok, tmp_path):
    class Cut(ScriptedEngine):  # turn 0 stops at max_new_tokens: no EOS
        def __call__(self, batch, seed):
            outs = super().__call__(batch, seed)
            return [o[:-1] if len(self.calls) == 1 else o for o in outs]

    replies = [" The cat sat.", " It ate a fish."]
    res = _run([{"id": "a", "messages": USERS[:5]}], Cut(tok, replies), tok, tmp_path)[0]
    served = [m for m in USERS[:5] if m["role"] != "assistant"]
    served.insert(2, {"role": "assistant", "content": "The cat sat."})
    served.insert(4, {"role": "assistant", "content": "It ate a fish."})
    [(ids, mask)] = full_render(tok, served)
    eos0 = ids.index(tok.eos_token_id)  # the end of turn 0, written by the template
    assert res["rows"][0]["input_ids"] == ids and len(res["rows"]) == 1
    assert res["rows"][0]["loss_mask"] == mask[:eos0] + [0] + mask[eos0 + 1 :]


def test_reasoning_turns_one_row_each(tok, tmp_path):
    replies = [" <think>Short.</think> The cat sat.", " <think>Food.</think> A fish."]
    msgs = USERS[:5]
    res = _run([{"id": "r", "messages": msgs}], ScriptedEngine(tok, replies), tok, tmp_path)[0]
    served = [
        msgs[0],
        msgs[1],
        {"role": "assistant", "content": "The cat sat.", "reasoning_content": "Short."},
        msgs[3],
        {"role": "assistant", "content": "A fish.", "reasoning_content": "Food."},
    ]
    want = full_render(tok, served)
    assert len(want) == 2
    assert [(r["input_ids"], r["loss_mask"]) for r in res["rows"]] == want


def test_thinking_off_in_prompt(tok, tmp_path):
    off = {"enable_thinking": False}
    eng = ScriptedEngine(tok, [" The cat sat."])
    res = _run([{"id": "o", "messages": USERS[:3]}], eng, tok, tmp_path, kwargs=off)[0]
    prompt = tok.decode(res["turns"][0]["prompt_ids"])
    assert prompt.endswith("Assistant: <think></think>")
    served = USERS[:2] + [{"role": "assistant", "content": "The cat sat."}]
    rows = [(r["input_ids"], r["loss_mask"]) for r in res["rows"]]
    assert rows == full_render(tok, served, None, off)


def _tool_conv(result_follows=True):
    call = {"id": "d0", "type": "function", "function": {"name": "find_toy", "arguments": {}}}
    msgs = [
        {"role": "user", "content": "Where is the ball?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    if result_follows:
        msgs.append({"role": "tool", "content": "under the bed", "tool_call_id": "d0"})
    msgs += [{"role": "assistant", "content": "Under the bed."}]
    return msgs


def test_tool_calls_paired_in_order_or_ending_named(tok, tmp_path):
    call = ' <tool_call>{"name": "find_toy", "arguments": {"toy": "ball"}}</tool_call>'
    replies = [call, " It is under the bed."]
    res = _run(
        [{"id": "t", "messages": _tool_conv()}], ScriptedEngine(tok, replies), tok, tmp_path
    )[0]
    assert res["ended"] is None and len(res["turns"]) == 2
    served = [
        {"role": "user", "content": "Where is the ball?"},
        parse_reply(call),
        {"role": "tool", "content": "under the bed", "tool_call_id": "call_0"},
        {"role": "assistant", "content": "It is under the bed."},
    ]
    assert served[1]["tool_calls"][0]["function"] == {
        "name": "find_toy",
        "arguments": {"toy": "ball"},
    }
    assert [(r["input_ids"], r["loss_mask"]) for r in res["rows"]] == full_render(tok, served)
    # the target answers without the call: the dataset's result cannot be paired
    plain = ScriptedEngine(tok, [" I do not know.", " x"])
    res = _run([{"id": "u", "messages": _tool_conv()}], plain, tok, tmp_path, name="b.jsonl")[0]
    assert res["ended"] == "unpaired_tool_result" and len(res["turns"]) == 1
    # the target calls a tool where the dataset has no result
    res = _run(
        [{"id": "v", "messages": USERS[:5]}],
        ScriptedEngine(tok, [call, " x"]),
        tok,
        tmp_path,
        name="c.jsonl",
    )[0]
    assert res["ended"] == "unpaired_tool_call" and len(res["turns"]) == 1


def test_preformatted_text_is_served_as_written(tok, tmp_path):
    text = "<s>System: Be kind.\nUser: Tell me about a cat.\nAssistant:"
    res = _run([{"id": "x", "text": text}], ScriptedEngine(tok, [" The cat sat."]), tok, tmp_path)
    want = tok(text + " The cat sat.</s>", add_special_tokens=False).input_ids
    prompt = tok(text, add_special_tokens=False).input_ids
    assert res[0]["rows"] == [
        {
            "input_ids": want,
            "loss_mask": [0] * len(prompt) + [1] * (len(want) - len(prompt)),
            "turns": [0],
        }
    ]
    assert want[: len(prompt)] == prompt and res[0]["ended"] is None


def test_context_ends_conversation(tok, tmp_path):
    eng = ScriptedEngine(tok, [" The cat sat on the mat and ate a fish."] * 3)
    first = len(chat.render_ids(tok, USERS[:2], TEMPLATE, True))
    res = _run([{"id": "c", "messages": USERS}], eng, tok, tmp_path, ctx=first + 30)[0]
    assert res["ended"] == "context" and len(res["turns"]) == 1


def test_resume_skips_finished_chunks_same_results(tok, tmp_path):
    recs = [{"id": f"c{i}", "messages": USERS[: 3 + 2 * (i % 3)]} for i in range(5)]
    replies = [" One.", " Two.", " Three."]
    whole = _run(recs, ScriptedEngine(tok, replies), tok, tmp_path, name="whole.jsonl")

    class Crash(ScriptedEngine):
        def __call__(self, batch, seed):
            if len(self.calls) == 4:  # chunk 0 (1 + 2 turns) took 2 rounds; die in chunk 1
                raise KeyboardInterrupt
            return super().__call__(batch, seed)

    with pytest.raises(KeyboardInterrupt):
        _run(recs, Crash(tok, replies), tok, tmp_path, name="cut.jsonl")
    lines = (tmp_path / "cut.jsonl").read_text().splitlines()
    assert [json.loads(x).get("chunk") for x in lines] == [None, 0]
    with open(tmp_path / "cut.jsonl", "a") as f:
        f.write('{"chunk": 1, "resul')  # a line cut by a kill
    again = ScriptedEngine(tok, replies)
    assert _run(recs, again, tok, tmp_path, name="cut.jsonl") == whole
    # chunk 0 is not asked again: chunk 1 (3 + 1 turns) and chunk 2 (2 turns) only
    assert again.calls == [2, 1, 1, 1, 1]


CHAT_PARAMS = """run_name: {name}
outputs_dir: {out}
mode: chat
chat_template: eagle3nb/data/chat_template_stories.jinja
dataset: {data}
max_train_prompts: 0
heldout_fraction: 0.2
max_new_tokens: 6
gen_batch_size: 1
interactive: false
"""

STEP = (
    "import sys; from eagle3nb.params import load_params; "
    "from eagle3nb.steps.generate.step import generate_step; "
    "generate_step(load_params(sys.argv[1]), progress=False)"
)


def _params(tmp_path, name, extra=""):
    src = (REPO_ROOT / "eagle3nb/data/chat_stories.openai.jsonl").read_text().splitlines()
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(src[:16]) + "\n")
    p = tmp_path / f"{name}.yaml"
    p.write_text(CHAT_PARAMS.format(name=name, out=tmp_path / "out", data=data) + extra)
    return p


ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """01 on 16 conversations, one engine, uninterrupted: generated.jsonl's bytes."""
    tmp = tmp_path_factory.mktemp("ref")
    ref = _params(tmp, "ref")
    subprocess.run([sys.executable, "-c", STEP, str(ref)], check=True, env=ENV, cwd=REPO_ROOT)
    return (tmp / "out/ref/data/generated.jsonl").read_bytes()


def test_generate_step_killed_and_rerun_writes_same_file(tmp_path, reference):
    cut = _params(tmp_path, "cut")
    partial = tmp_path / "out/cut/data/generated.partial.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", STEP, str(cut)], env=ENV, cwd=REPO_ROOT)
    t0 = time.time()
    while time.time() - t0 < 120:
        if partial.is_file() and partial.read_text().count("\n") >= 4:  # key + 3 chunks
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = partial.read_text().count("\n") - 1
    assert 3 <= done < 16, "the run finished (or never started) before the kill"
    assert not (tmp_path / "out/cut/data/generated.jsonl").exists()
    subprocess.run([sys.executable, "-c", STEP, str(cut)], check=True, env=ENV, cwd=REPO_ROOT)
    got = (tmp_path / "out/cut/data/generated.jsonl").read_bytes()
    assert got == reference
    recs = [json.loads(x) for x in got.splitlines()]
    ids = [(r["conversation"], str(r.get("turns")), r.get("turn")) for r in recs]
    assert len(ids) == len(set(ids))
    assert not partial.exists()


def test_two_workers_write_the_same_file(tmp_path, reference):
    two = _params(tmp_path, "two", "generate_workers: 2\n")
    subprocess.run([sys.executable, "-c", STEP, str(two)], check=True, env=ENV, cwd=REPO_ROOT)
    assert (tmp_path / "out/two/data/generated.jsonl").read_bytes() == reference
    left = sorted(f.name for f in (tmp_path / "out/two/data").iterdir())
    assert left == ["generated.jsonl", "generation_manifest.json"]
