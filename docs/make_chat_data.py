"""Write eagle3nb's chat dataset (children's-story conversations for the stories260K target).

``python docs/make_chat_data.py`` writes the same conversations in two forms:

- ``eagle3nb/data/chat_stories.openai.jsonl``: ``{"id", "messages", "tools"}`` (OpenAI form;
  ``reasoning_content`` on some assistant turns, ``tool_calls`` with JSON-string arguments,
  ``tool`` messages with ``tool_call_id``);
- ``eagle3nb/data/chat_stories.sharegpt.jsonl``: ``{"id", "conversations", "tools"}`` (ShareGPT
  form: human/gpt/system, ``function_call`` and ``observation`` turns for tools, ``tools`` as a
  JSON string as LLaMA-Factory writes it).

Deterministic (seeded); the words stay within what TinyStories uses, so the tokenizer of a 512-token
model keeps every conversation short.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "eagle3nb" / "data"
N = 240

ANIMALS = ["cat", "dog", "bird", "bunny", "frog", "fish", "bear", "duck", "mouse", "fox"]
NAMES = ["Lily", "Tom", "Sue", "Ben", "Mia", "Max", "Anna", "Sam", "Lucy", "Tim"]
PLACES = ["park", "garden", "forest", "pond", "beach", "house", "school", "farm"]
THINGS = ["ball", "kite", "toy", "cake", "hat", "book", "boat", "flower"]
FEELINGS = ["happy", "sad", "scared", "proud", "sleepy", "excited"]
SYSTEMS = [
    "You are a kind storyteller for little kids.",
    "You tell short and happy stories.",
    "You are a helpful friend who loves stories.",
    "Answer in one or two short sentences.",
]
TOOLS = {
    "get_weather": ("the weather in a place", "place"),
    "find_toy": ("where a toy is", "toy"),
    "count_friends": ("how many friends someone has", "name"),
}


def tool_schema(name: str) -> dict:
    desc, arg = TOOLS[name]
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Tells {desc}.",
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string"}},
                "required": [arg],
            },
        },
    }


def story(r: random.Random, name: str, animal: str) -> str:
    place, thing, feel = r.choice(PLACES), r.choice(THINGS), r.choice(FEELINGS)
    return r.choice(
        [
            f"Once upon a time, {name} the {animal} went to the {place}. {name} found a {thing} "
            f"and felt {feel}.",
            f"{name} was a little {animal}. One day {name} lost a {thing} at the {place}, but a "
            f"friend helped find it.",
            f"There was a {animal} named {name} who loved the {place}. Every day {name} played "
            f"with a red {thing}.",
        ]
    )


def follow_up(r: random.Random, name: str, animal: str) -> tuple[str, str]:
    thing, place = r.choice(THINGS), r.choice(PLACES)
    return r.choice(
        [
            (f"What did {name} do next?", f"{name} ran home and told mom about the {thing}."),
            (f"Was the {animal} happy?", f"Yes, the {animal} smiled and jumped up and down."),
            ("Can you make it short?", f"{name} the {animal} played at the {place}. The end."),
            (f"Who was {name}'s friend?", f"A big {r.choice(ANIMALS)} was {name}'s best friend."),
        ]
    )


def tool_turn(r: random.Random, name: str, animal: str, k: int) -> list[dict]:
    """A user question answered through one tool call and its result (OpenAI form)."""
    tool = r.choice(sorted(TOOLS))
    arg = TOOLS[tool][1]
    value = {"place": r.choice(PLACES), "toy": r.choice(THINGS), "name": name}[arg]
    question, result, answer = {
        "get_weather": (
            f"Is it sunny at the {value} today?",
            "sunny and warm",
            f"It is sunny at the {value}, so {name} can play outside.",
        ),
        "find_toy": (
            f"Where is {name}'s {value}?",
            "under the bed",
            f"The {value} is under the bed. {name} the {animal} is happy to find it.",
        ),
        "count_friends": (
            f"How many friends does {name} have?",
            "three friends",
            f"{name} has three friends, and they all like to play.",
        ),
    }[tool]
    call = {
        "id": f"call_{k}",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps({arg: value})},
    }
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": result, "tool_call_id": call["id"]},
        {"role": "assistant", "content": answer},
    ], tool


def conversation(r: random.Random, i: int) -> dict:
    name, animal = r.choice(NAMES), r.choice(ANIMALS)
    msgs: list[dict] = []
    if r.random() < 0.6:
        msgs.append({"role": "system", "content": r.choice(SYSTEMS)})
    msgs.append({"role": "user", "content": f"Tell me a story about a {animal} named {name}."})
    first = {"role": "assistant", "content": story(r, name, animal)}
    if r.random() < 0.25:
        first["reasoning_content"] = f"The kid wants a story about a {animal}. Keep it short."
    msgs.append(first)
    tools = []
    for k in range(r.choice([0, 1, 1, 2])):
        if r.random() < 0.3 and not tools:
            turn, tool = tool_turn(r, name, animal, k)
            msgs += turn
            tools.append(tool_schema(tool))
        else:
            q, a = follow_up(r, name, animal)
            reply = {"role": "assistant", "content": a}
            if r.random() < 0.2:
                reply["reasoning_content"] = "Answer in one short line."
            msgs += [{"role": "user", "content": q}, reply]
    return {"id": f"stories-chat-{i:04d}", "messages": msgs, "tools": tools}


def sharegpt(rec: dict) -> dict:
    """The same conversation in ShareGPT form."""
    turns = []
    frm = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}
    for m in rec["messages"]:
        for c in m.get("tool_calls", []):
            fn = c["function"]
            call = {"name": fn["name"], "arguments": json.loads(fn["arguments"])}
            turns.append({"from": "function_call", "value": json.dumps(call)})
        if m.get("tool_calls") and not m["content"]:
            continue
        t = {"from": frm[m["role"]], "value": m["content"]}
        if m.get("reasoning_content"):
            t["reasoning_content"] = m["reasoning_content"]
        turns.append(t)
    return {"id": rec["id"], "conversations": turns, "tools": json.dumps(rec["tools"])}


def main() -> None:
    r = random.Random(17)
    recs = [conversation(r, i) for i in range(N)]
    with open(OUT / "chat_stories.openai.jsonl", "w", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(rec) + "\n")
    with open(OUT / "chat_stories.sharegpt.jsonl", "w", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(sharegpt(rec)) + "\n")
    print(f"wrote {N} conversations in two forms to {OUT}")


if __name__ == "__main__":
    main()
