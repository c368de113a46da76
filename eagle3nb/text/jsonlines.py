"""JSON-lines files read line by line, so that one bad line is refused by its number and the rest
kept (the ``datasets`` library reads such a file whole or not at all)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["read_lines", "keep_lines"]


def read_lines(path: Path) -> tuple[list[int], list[dict]] | None:
    """A JSON-lines file (``.jsonl``, or ``.json`` whose first line is an object) read line by
    line: ``(lines, refused)``, the 1-based numbers of its lines holding a JSON object (row i of
    the dataset is line ``lines[i]``) and the refusals of the others (not UTF-8, not JSON, not an
    object). None for other files, and for a ``.json`` file whose first line is not an object (a
    JSON document, which datasets reads whole; its rows are named by index).

    Raises:
        OSError: the file cannot be read.
    """
    suffix = "" if path.is_dir() else path.suffix.lower()
    if suffix not in (".jsonl", ".json"):
        return None
    lines, refused = [], []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:  # utf-8-sig: a BOM opening the file is not part of line 1's JSON
                s = raw.decode("utf-8-sig" if n == 1 else "utf-8").strip()
            except UnicodeDecodeError as e:
                refused.append(_refusal(path, n, f"not UTF-8 text (byte {e.start + 1})"))
                continue
            if not s:
                continue
            try:
                obj, why = json.loads(s), None
            except ValueError as e:
                obj, why = None, f"not JSON ({e.msg} at column {e.colno})"
            if suffix == ".json" and not lines and not refused and not isinstance(obj, dict):
                return None  # a JSON document (an array, an indented object): datasets reads it
            if isinstance(obj, dict):
                lines.append(n)
            else:
                refused.append(
                    _refusal(path, n, why or f"not a JSON object (a {type(obj).__name__})")
                )
    return lines, refused


def _refusal(path: Path, n: int, reason: str) -> dict:
    return {"where": f"{path.name}:line {n}", "id": None, "reason": reason}


def keep_lines(path: Path, lines: list[int], tmp: str) -> Path:
    """A copy of ``path`` in the folder ``tmp`` holding only ``lines`` (1-based), for datasets,
    which reads a JSON-lines file whole or not at all."""
    keep, out = set(lines), Path(tmp) / (path.stem + ".jsonl")
    with open(path, "rb") as f, open(out, "wb") as g:
        g.writelines(raw for n, raw in enumerate(f, 1) if n in keep)
    return out
