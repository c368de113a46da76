"""Users' chat datasets: loaded through Hugging Face ``datasets``, format detected, normalised to
OpenAI messages, bad records refused one by one.

Files: ``.jsonl`` / ``.json`` (``datasets.load_dataset("json")``), ``.parquet``
(``load_dataset("parquet")``), a folder written by ``Dataset.save_to_disk`` (``load_from_disk``; a
``DatasetDict`` gives its ``train`` split) or any other local folder ``load_dataset`` reads. Plain
prompt files (``.txt``, one prompt per line) stay with :mod:`eagle3nb.text.prompts`.

Formats (:data:`FORMATS`, detected from the columns, or named):

- ``openai``: ``messages`` = [{"role": system|user|assistant|tool, "content": str}], assistant
  turns may hold ``reasoning_content`` and ``tool_calls`` ([{"id", "type": "function",
  "function": {"name", "arguments": JSON object or its JSON string}}]), tool messages a
  ``tool_call_id``; an optional ``tools`` column (list of tool schemas, or its JSON string). A
  ``conversations`` column of role/content dicts (SpecForge's rows) is read as this format.
- ``sharegpt``: ``conversations`` = [{"from": human|gpt|system|tool|observation|function_call,
  "value": str}]; ``function_call`` turns hold the call as JSON ``{"name", "arguments"}`` (the
  LLaMA-Factory convention) and become an assistant turn with ``tool_calls``; consecutive ones are
  one turn; ``gpt`` turns may hold ``reasoning_content``.
- ``text``: ``text`` = a conversation already rendered by a chat template up to where the
  assistant answers (the template that produced it is the run's ``chat_template``).

Every record becomes ``{"id": str, "messages": [...], "tools": list | None, "where": "file:line N"}``
(``text`` records: ``{"id", "text", "where"}``); ids come from an ``id`` column, else from a hash
of the record's content. Refusals are ``{"where", "id", "reason"}``.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from eagle3nb.text import jsonlines

__all__ = [
    "FORMATS",
    "DATA_SUFFIXES",
    "check_not_empty",
    "detect_format",
    "load_records",
    "looks_like_dataset",
    "normalise",
]

FORMATS = ("openai", "sharegpt", "text")
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "observation": "tool",
    "function_call": "function_call",
}


class RecordError(ValueError):
    """One record refused (the message is the reason shown in 01's refusal table)."""


def looks_like_dataset(path: str | Path) -> str | None:
    """Why ``path`` is a dataset rather than a one-prompt-per-line file, or None.

    A data suffix (:data:`DATA_SUFFIXES`), a folder, or a first non-comment line that parses as a
    JSON object (a JSONL under another name).
    """
    p = Path(path)
    if p.is_dir():
        return "it is a folder (a Hugging Face datasets folder?)"
    if p.suffix.lower() in DATA_SUFFIXES:
        return f"its suffix is {p.suffix}"
    try:
        with open(p, encoding="utf-8") as f:
            for line in f:
                s = line.strip()
                if s and not s.startswith("#"):
                    return "its first line is a JSON object" if _is_json_object(s) else None
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _is_json_object(s: str) -> bool:
    if not s.startswith("{"):
        return False
    try:
        return isinstance(json.loads(s), dict)
    except ValueError:
        return False


def _load(path: Path, shown: Path | None = None):
    """The ``datasets.Dataset`` in ``path`` (``shown``: the file to name in errors, when ``path``
    is a copy). Raises ValueError naming the file and the fix."""
    import datasets

    datasets.disable_progress_bars()
    try:
        if path.is_dir():
            if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
                ds = datasets.load_from_disk(str(path))
            else:
                ds = datasets.load_dataset(str(path))
        else:
            kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
            if path.suffix.lower() not in kind:
                raise ValueError(f"suffix {path.suffix!r} is not one of {DATA_SUFFIXES}")
            ds = datasets.load_dataset(kind[path.suffix.lower()], data_files=str(path))
    except Exception as e:  # datasets raises many types; the user needs the file and the cause
        raise ValueError(
            f"dataset={str(shown or path)!r} could not be read by the datasets library ({type(e).__name__}: "
            f"{str(e)[:300]}); give a JSONL/JSON/Parquet file or a save_to_disk folder"
        ) from e
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(
                f"dataset={str(path)!r} has splits {list(ds)} and no train split; save the split "
                "to use with Dataset.save_to_disk"
            )
        ds = ds["train"]
    return ds


def detect_format(columns) -> str:
    """The format of a dataset with these column names (see the module docstring).

    Raises:
        ValueError: none of ``messages``, ``conversations``, ``text`` is a column.
    """
    cols = set(columns)
    if "messages" in cols:
        return "openai"
    if "conversations" in cols:
        return "sharegpt"
    if "text" in cols:
        return "text"
    raise ValueError(
        f"no column of a known chat format among {sorted(cols)}: expected messages (OpenAI), "
        "conversations (ShareGPT) or text (preformatted)"
    )


def _role_content(ds) -> bool:
    """Whether the first row's ``conversations`` hold role/content dicts (not from/value)."""
    turns = ds[0]["conversations"] if len(ds) else None
    first = turns[0] if isinstance(turns, list) and turns else None
    return isinstance(first, dict) and first.get("role") is not None and first.get("from") is None


def _where(path: Path, rows_to_lines: list[int] | None, i: int) -> str:
    if rows_to_lines is not None and i < len(rows_to_lines):
        return f"{path.name}:line {rows_to_lines[i]}"
    return f"{path.name}:row {i}"


def check_not_empty(path: Path, shown: str | None = None) -> None:
    """Refuse a dataset file that holds nothing but white space (reads up to its first other byte).

    Raises:
        ValueError: ``dataset=<shown or path>: the file is empty`` with the fix.
    """
    if not path.is_file():
        return
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip(b" \t\r\n\xef\xbb\xbf"):  # a BOM alone is empty too
                return
    raise ValueError(
        f"dataset={shown or str(path)!r}: the file is empty; give a chat dataset with at least one "
        "record (one JSON object per line in a .jsonl), or dataset: null to use prompts_file"
    )


def load_records(path: str | Path, fmt: str = "auto") -> tuple[str, list[dict], list[dict]]:
    """Read a chat dataset and normalise it record by record.

    Args:
        path: a file or folder (see the module docstring).
        fmt: ``auto`` (from the columns) or one of :data:`FORMATS`.

    Returns:
        ``(format, records, refused)``: records in file order (module docstring), refused =
        ``[{"where", "id", "reason"}]`` for a line of a JSON-lines file that is not a JSON object
        (:func:`eagle3nb.text.jsonlines.read_lines`), unknown roles, empty contents, a
        conversation starting with an assistant turn, malformed tool calls, no user turn,
        duplicate ids.

    Raises:
        FileNotFoundError: no such path. ValueError: an empty file (:func:`check_not_empty`), a
        JSON-lines file none of whose lines is a JSON object, not readable as a dataset, no known
        format column, or ``fmt`` unknown.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"dataset={str(p)!r} does not exist")
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"dataset_format={fmt!r} is unknown; use auto or one of {FORMATS}")
    check_not_empty(p)
    scan = jsonlines.read_lines(p)
    lines, refused = scan if scan is not None else (None, [])
    if refused and not lines:
        raise ValueError(
            f"dataset={str(p)!r}: no line holds a JSON object ({len(refused)} refused, first: "
            f"{refused[0]['where']}: {refused[0]['reason']}); give one JSON object per line"
        )
    if refused:  # read what is left; the bad lines are refused like bad records
        with tempfile.TemporaryDirectory() as tmp:
            ds = _load(jsonlines.keep_lines(p, lines, tmp), shown=p)
    else:
        ds = _load(p)
    found = fmt if fmt != "auto" else detect_format(ds.column_names)
    if fmt == "auto" and found == "sharegpt" and _role_content(ds):
        found = "openai"  # SpecForge's rows: conversations of role/content dicts
    records, seen = [], set()
    for i, row in enumerate(ds):
        where = _where(p, lines, i)
        rid = str(row["id"]) if row.get("id") is not None else None
        try:
            rec = normalise(row, found)
        except RecordError as e:
            refused.append({"where": where, "id": rid, "reason": str(e)})
            continue
        rec["id"] = rid if rid is not None else _content_id(rec)
        if rec["id"] in seen:
            refused.append({"where": where, "id": rec["id"], "reason": "duplicate id"})
            continue
        seen.add(rec["id"])
        rec["where"] = where
        records.append(rec)
    return found, records, refused


def _content_id(rec: dict) -> str:
    body = json.dumps({k: rec.get(k) for k in ("messages", "tools", "text")}, sort_keys=True)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()[:16]


def normalise(row: dict, fmt: str) -> dict:
    """One dataset row as ``{"messages", "tools"}`` (or ``{"text"}``), checked.

    Raises:
        RecordError: the record is refused (the message is the reason).
    """
    if fmt == "text":
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            raise RecordError("empty text")
        return {"text": text}
    if fmt == "openai":
        raw = row.get("messages", row.get("conversations"))
        msgs = [_openai_message(m, j) for j, m in enumerate(_as_list(raw, "messages"))]
    elif fmt == "sharegpt":
        msgs = _sharegpt_messages(_as_list(row.get("conversations"), "conversations"))
    else:
        raise ValueError(f"dataset_format={fmt!r} is unknown; use one of {FORMATS}")
    tools = row.get("tools")
    if isinstance(tools, str):
        tools = _json(tools, "tools column")
    tools = _drop_none(tools)
    if tools is not None and not isinstance(tools, list):
        raise RecordError("tools column is not a list of tool schemas")
    _check_conversation(msgs)
    return {"messages": msgs, "tools": tools or None}


def _drop_none(x):
    """Dicts without None values, recursively: Arrow stores the union of the keys of all rows'
    structs, so a key absent from a row reads back as None (a real null is lost too; give
    arguments and tools as JSON strings to keep them exactly)."""
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x


def _as_list(raw, name: str) -> list:
    if not isinstance(raw, list) or not raw:
        raise RecordError(f"{name} is empty or not a list")
    return raw


def _json(s: str, what: str):
    try:
        return json.loads(s)
    except ValueError as e:
        raise RecordError(f"malformed tool call: {what} is not JSON ({e.msg})") from None


def _text(m: dict, key: str, j: int) -> str:
    c = m.get(key)
    if c is None:
        return ""
    if not isinstance(c, str):
        raise RecordError(f"message {j}: {key} is a {type(c).__name__}, not text")
    return c


def _openai_message(m, j: int) -> dict:
    if not isinstance(m, dict):
        raise RecordError(f"message {j} is not an object")
    role = m.get("role")
    if role not in ROLES:
        raise RecordError(f"unknown role {role!r} in message {j} (known: {', '.join(ROLES)})")
    out = {"role": role, "content": _text(m, "content", j)}
    if role == "assistant":
        if m.get("reasoning_content"):
            out["reasoning_content"] = _text(m, "reasoning_content", j)
        if m.get("tool_calls"):
            out["tool_calls"] = [_tool_call(c, j) for c in m["tool_calls"]]
    if role == "tool" and m.get("tool_call_id") is not None:
        out["tool_call_id"] = str(m["tool_call_id"])
    return out


def _tool_call(c, j: int, call_id: str | None = None) -> dict:
    """An OpenAI tool call ``{"id", "type": "function", "function": {"name", "arguments": dict}}``."""
    if not isinstance(c, dict):
        raise RecordError(f"malformed tool call in message {j}: not an object")
    fn = c.get("function", c)
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise RecordError(f"malformed tool call in message {j}: no function name")
    args = fn.get("arguments")
    args = _json(args, f"arguments of {name!r}") if isinstance(args, str) else _drop_none(args)
    if not isinstance(args, dict):
        raise RecordError(f"malformed tool call in message {j}: arguments of {name!r} not a dict")
    cid = c.get("id") or call_id
    out = {"type": "function", "function": {"name": name, "arguments": args}}
    return {"id": str(cid), **out} if cid is not None else out


def _sharegpt_messages(turns: list) -> list[dict]:
    msgs: list[dict] = []
    for j, t in enumerate(turns):
        if not isinstance(t, dict):
            raise RecordError(f"turn {j} is not an object")
        role = SHAREGPT_ROLES.get(t.get("from"))
        if role is None:
            known = ", ".join(SHAREGPT_ROLES)
            raise RecordError(f"unknown role {t.get('from')!r} in turn {j} (known: {known})")
        value = _text(t, "value", j)
        if role == "function_call":
            call = _tool_call(_json(value, f"function_call turn {j}"), j)
            if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1].get("_closed"):
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
            continue
        m = {"role": role, "content": value}
        if role == "assistant" and t.get("reasoning_content"):
            m["reasoning_content"] = _text(t, "reasoning_content", j)
        if msgs and msgs[-1]["role"] == "assistant":
            msgs[-1]["_closed"] = True
        msgs.append(m)
    for m in msgs:
        m.pop("_closed", None)
    return msgs


def _check_conversation(msgs: list[dict]) -> None:
    """Empty contents, first turn, user turns, and tool results paired with calls in order."""
    first = next((m for m in msgs if m["role"] != "system"), None)
    if first is None or not any(m["role"] == "user" for m in msgs):
        raise RecordError("no user turn")
    if first["role"] == "assistant":
        raise RecordError("starts with an assistant turn")
    if first["role"] == "tool":
        raise RecordError("starts with a tool result")
    pending: list[str | None] = []
    for j, m in enumerate(msgs):
        calls = m.get("tool_calls") or []
        if not m["content"].strip() and not calls:
            raise RecordError(f"empty content in message {j} ({m['role']})")
        if m["role"] == "tool":
            if not pending:
                raise RecordError(f"malformed tool call: tool result in message {j} has no call")
            want = pending.pop(0)
            got = m.get("tool_call_id")
            if want is not None and got is not None and got != want:
                raise RecordError(
                    f"malformed tool call: message {j} answers {got!r}, expected {want!r}"
                )
        elif pending:
            raise RecordError(
                f"malformed tool call: {len(pending)} call(s) before message {j} unanswered"
            )
        if calls:
            pending = [c.get("id") for c in calls]
    if pending:
        raise RecordError(f"malformed tool call: {len(pending)} call(s) at the end unanswered")
