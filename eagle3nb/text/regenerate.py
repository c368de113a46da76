"""Regenerate chat datasets turn by turn with the target, resumably.

The dataset's assistant turns are dropped; each is asked again against the target's own earlier
answers: the history so far (system, user and tool messages of the dataset, the target's
assistant turns) is rendered by the target's chat template with its generation prompt
(``tools`` and ``template_kwargs`` such as ``enable_thinking`` passed to it), tokenised as served
(:func:`eagle3nb.text.chat.render_ids`), and the engine's ids are stored as they came.

Rows (training samples) come from served ids only: while the next turn's prompt ids start with
the current row's ids (prompt + the engine's output), the row grows by the rendered delta (mask 0)
and the new output (mask 1: the reply and its end-of-turn token, never the header); otherwise
(a template that drops earlier reasoning, a reply whose text renders to other ids) a new row
starts at that turn; a reply cut at ``max_new_tokens`` is closed by the template's end-of-turn
token, which the row takes with mask 0. Nothing generated is re-tokenised.

Target replies are parsed for the ``<think>...</think>`` / ``<tool_call>{json}</tool_call>``
conventions (Qwen3 / Hermes, and eagle3nb's stories template). A tool call the target makes is
kept as produced and answered by the dataset's next tool result, in order; a call without a
result, or a dataset result the target did not ask for, ends the conversation there (``ended``).

Resume: conversations go in chunks of ``batch_size`` (each chunk one batched engine call per
round); a finished chunk is appended to the partial file as one JSON line and fsynced, so a kill
loses at most the chunk in progress, and a rerun with the same inputs skips finished chunks and
gives the same results (seeds depend on the chunk index and round only).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from pathlib import Path
from typing import Callable, Sequence

from eagle3nb.text.chat import render_ids

__all__ = ["ENDINGS", "parse_reply", "regenerate", "run_key"]

# why a conversation ended before its last dataset turn
ENDINGS = ("context", "unpaired_tool_call", "unpaired_tool_result", "empty_reply")

_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

Generate = Callable[[list[list[int]], int], list[list[int]]]


def parse_reply(text: str) -> dict:
    """An assistant message from the target's decoded reply: ``reasoning_content`` from a leading
    ``<think>`` block, ``tool_calls`` from ``<tool_call>{"name", "arguments"}</tool_call>`` blocks
    (ids ``call_0``, ``call_1``, ...; a block that is not such JSON stays in the content),
    ``content`` the rest, stripped."""
    msg: dict = {"role": "assistant"}
    m = _THINK.match(text)
    if m:
        msg["reasoning_content"] = m.group(1).strip()
        text = text[m.end() :]
    calls, rest = [], text
    for block in _CALL.finditer(text):
        try:
            c = json.loads(block.group(1))
        except ValueError:
            continue
        if isinstance(c, dict) and isinstance(c.get("name"), str):
            args = c.get("arguments") if isinstance(c.get("arguments"), dict) else {}
            fn = {"name": c["name"], "arguments": args}
            calls.append({"id": f"call_{len(calls)}", "type": "function", "function": fn})
            rest = rest.replace(block.group(0), "", 1)
    msg["content"] = rest.strip()
    if calls:
        msg["tool_calls"] = calls
    return msg


class _Conversation:
    """One conversation being regenerated (state between rounds)."""

    def __init__(self, rec: dict):
        self.rec = rec
        self.queue = list(rec.get("messages") or [])
        self.history: list[dict] = []
        self.turns: list[dict] = []
        self.rows: list[dict] = []
        self.ended: str | None = None
        self.prompt: list[int] | None = None
        self.asked: list[dict] = []

    def next_prompt(self, tok, template, kwargs, max_new: int, ctx: int) -> list[int] | None:
        """The prompt ids of the next turn to ask, or None when the conversation is over."""
        if "text" in self.rec:  # preformatted: one turn, the text as served
            if self.turns:
                return None
            ids = [int(t) for t in tok(self.rec["text"], add_special_tokens=False).input_ids]
            return self._fits(ids, max_new, ctx)
        while self.queue and self.queue[0]["role"] != "assistant":
            m = self.queue.pop(0)
            if m["role"] == "tool":  # results the target's calls did not ask for
                self.ended = "unpaired_tool_result"
                return None
            self.history.append(m)
        if not self.queue or self.ended:
            return None
        self.queue.pop(0)  # the dataset's answer, asked again
        tools = self.rec.get("tools")
        ids = render_ids(tok, self.history, template, True, tools, kwargs)
        self.asked = [dict(m) for m in self.history]
        return self._fits(ids, max_new, ctx)

    def _fits(self, ids: list[int], max_new: int, ctx: int) -> list[int] | None:
        if len(ids) + max_new > ctx:
            self.ended = "context"
            return None
        self.prompt = ids
        return ids

    def answer(self, out: list[int], tok) -> None:
        """Record the engine's ids for the pending prompt and pair the target's tool calls."""
        prompt, self.prompt = self.prompt, None
        if not out:  # nothing to train on, nothing to answer with
            self.ended = "empty_reply"
            return
        text = tok.decode(out, skip_special_tokens=True)
        n = len(self.turns)
        turn = {"prompt_ids": prompt, "output_ids": list(out), "text": text}
        if "text" not in self.rec:  # the history served at this turn (04 renders it again)
            turn["messages"] = self.asked
        self.turns.append(turn)
        row = self.rows[-1] if self.rows else None
        if row is not None and prompt[: len(row["input_ids"])] == row["input_ids"]:
            row["loss_mask"] += [0] * (len(prompt) - len(row["input_ids"])) + [1] * len(out)
            row["input_ids"] = list(prompt) + list(out)
            row["turns"].append(n)
        else:
            self.rows.append(
                {
                    "input_ids": list(prompt) + list(out),
                    "loss_mask": [0] * len(prompt) + [1] * len(out),
                    "turns": [n],
                }
            )
        if "text" in self.rec:
            return
        msg = parse_reply(text)
        self.history.append(msg)
        for call in msg.get("tool_calls", []):
            if not self.queue or self.queue[0]["role"] != "tool":
                self.ended = "unpaired_tool_call"
                return
            result = dict(self.queue.pop(0), tool_call_id=call["id"])
            self.history.append(result)

    def result(self) -> dict:
        return {
            "id": self.rec["id"],
            "turns": self.turns,
            "rows": self.rows,
            "ended": self.ended,
        }


def run_key(records: Sequence[dict], settings: dict) -> str:
    """sha256 of the records and the settings that decide the outputs (a partial file written
    under another key is discarded, not resumed)."""
    body = json.dumps({"records": list(records), "settings": settings}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def _read_partial(path: Path, key: str) -> dict[int, list[dict]]:
    """Finished chunks ``{index: results}`` of a partial file written under ``key`` (a line cut by
    a kill is dropped; a file of another key is ignored)."""
    if not path.is_file():
        return {}
    lines = path.read_text(encoding="utf-8").split("\n")
    done: dict[int, list[dict]] = {}
    for i, line in enumerate(lines[:-1]):  # the last piece has no newline: cut or empty
        try:
            obj = json.loads(line)
        except ValueError:
            break
        if i == 0:
            if obj.get("key") != key:
                return {}
            continue
        done[int(obj["chunk"])] = obj["results"]
    return done


def _append(path: Path, obj: dict, fresh: bool = False) -> None:
    """Append one JSON line (a fresh file: write it whole) and fsync it."""
    with open(path, "w" if fresh else "a", encoding="utf-8") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()
        os.fsync(f.fileno())


def regenerate(
    records: Sequence[dict],
    generate: Generate,
    tokenizer,
    template: str | None,
    *,
    template_kwargs: dict | None,
    max_new_tokens: int,
    ctx: int,
    batch_size: int,
    partial: str | Path,
    key: str,
    chunks: Sequence[int] | None = None,
    progress: Callable | None = None,
) -> list[dict]:
    """Regenerate every record turn by turn (module docstring), resuming from ``partial``.

    Args:
        records: from :func:`eagle3nb.text.conversations.load_records` (``messages`` or ``text``).
        generate: ``generate(prompt_ids_batch, seed) -> output ids per prompt`` (the engine call,
            cut after the first stop id, kept).
        template: the jinja chat template (unused for ``text`` records).
        ctx: the target's context; a turn whose prompt + ``max_new_tokens`` exceeds it ends the
            conversation (``ended = "context"``).
        partial: the resume file (JSON lines: the key, then one line per finished chunk).
        key: :func:`run_key` of the inputs.
        chunks: the chunk indices this caller regenerates (data-parallel workers take a share);
            None for all.
        progress: wraps the iterable of chunk indices (e.g. tqdm).

    Returns:
        Per record of the chunks done, in record order: ``{"id", "turns": [{"prompt_ids",
        "output_ids", "text", "messages": the history served (not for text records)}], "rows": [{"input_ids", "loss_mask", "turns"}], "ended": None or
        one of ENDINGS}``.
    """
    partial = Path(partial)
    done = _read_partial(partial, key)
    if not done:
        _append(partial, {"key": key}, fresh=True)
    n_chunks = (len(records) + batch_size - 1) // batch_size
    todo = list(range(n_chunks)) if chunks is None else list(chunks)
    for k in progress(todo) if progress else todo:
        if k in done:
            continue
        convs = [_Conversation(r) for r in records[k * batch_size : (k + 1) * batch_size]]
        for rnd in itertools.count():
            asks = [
                (c, c.next_prompt(tokenizer, template, template_kwargs, max_new_tokens, ctx))
                for c in convs
                if c.ended is None
            ]
            asks = [(c, ids) for c, ids in asks if ids is not None]
            if not asks:
                break
            outs = generate([ids for _, ids in asks], k * 100_003 + rnd)
            for (c, _), out in zip(asks, outs):
                c.answer(out, tokenizer)
        done[k] = [c.result() for c in convs]
        _append(partial, {"chunk": k, "results": done[k]})
    return [r for k in sorted(done) if k in set(todo) for r in done[k]]
