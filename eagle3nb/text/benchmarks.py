"""Benchmark sets as the field runs them (MT-Bench, GSM8K, HumanEval, MATH, chat datasets), read
from a local file into :class:`BenchRecord` s; bad records refused one by one, file and line named.

Files: JSONL (one JSON object per line; ``.jsonl``, ``.json`` or any name, ``.gz`` compressed too,
as HumanEval ships), a JSON array of objects (a file whose first character is ``[``), or Parquet
(``.parquet``, read with pyarrow; a refusal names its row). Nothing is downloaded.

Formats (:data:`FORMATS`, detected per record from its fields, the file taking the most common one;
or named with ``fmt``, which overrides detection):

- ``mtbench``: FastChat's ``question.jsonl``: ``question_id``, ``category``, ``turns`` (the user
  turns, in order), optional ``reference`` (a string or one per turn).
- ``gsm8k``: ``question`` (+ ``answer``); category ``gsm8k``.
- ``humaneval``: ``prompt`` (+ ``task_id`` as id, ``canonical_solution``); category ``humaneval``.
- ``math`` (MATH, MATH-500): ``problem`` (+ ``solution`` or ``answer``, ``unique_id`` as id);
  category from ``subject`` (MATH-500) or ``type`` (MATH), else ``math``.
- ``openai`` / ``sharegpt``: the chat datasets 01 reads (``messages`` / ``conversations``),
  checked by :func:`eagle3nb.text.conversations.normalise`; the user turns become the turns (the
  dataset's assistant and system turns are dropped: a served benchmark answers with the target's
  own words); category ``chat``.

A ``category`` field, where present, names the category in every format (``all`` is refused: it
names the whole set in 04's results). An ``id`` field is the id where the format has none of its
own; else the id is a hash of the turns (stable when the file is reordered).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from eagle3nb.text.conversations import RecordError, normalise

__all__ = [
    "FORMATS",
    "DEFAULT_BENCHMARK",
    "BenchRecord",
    "BenchmarkFile",
    "RecordError",
    "detect_record_format",
    "load_benchmark",
    "read_benchmark",
    "categories",
    "select",
]

FORMATS = ("mtbench", "gsm8k", "humaneval", "math", "openai", "sharegpt")
# the field that marks each format, in the order detection tries them
_MARKS = (
    ("turns", "mtbench"),
    ("messages", "openai"),
    ("conversations", "sharegpt"),
    ("problem", "math"),
    ("prompt", "humaneval"),
    ("question", "gsm8k"),
    # a format's id alone still marks it, so that the record's refusal names the missing field
    ("question_id", "mtbench"),
    ("task_id", "humaneval"),
    ("unique_id", "math"),
)
_DEFAULT_CATEGORY = {"gsm8k": "gsm8k", "humaneval": "humaneval", "math": "math"}
RESERVED_CATEGORY = "all"  # the whole set in 04's per-category results
DEFAULT_BENCHMARK = Path(__file__).resolve().parents[1] / "data" / "bench_tinystories_mtbench.jsonl"


@dataclass(frozen=True)
class BenchRecord:
    """One benchmark question (frozen; ``turns`` is a list, so a record is not hashable: key
    sets by ``id``).

    Attributes:
        id: the format's id (``question_id``, ``task_id``, ``unique_id``, ``id``) as text, else
            ``sha256:`` + 16 hex digits of the turns.
        category: the record's category (never ``all``).
        turns: the user turns, in order (one for single-turn formats), each non-empty text.
        reference: the reference answer where the format has one (MT-Bench's per-turn references
            joined by a blank line), else None. Not used for acceptance.
        source: where it was read, ``<file name>:line N`` (``:row N`` for Parquet, ``:record N``
            for a JSON array; 1-based).
    """

    id: str
    category: str
    turns: list[str]
    reference: str | None
    source: str


class BenchmarkFile(NamedTuple):
    """What :func:`load_benchmark` read: the format, the records kept (file order) and the refused
    ones ``[{"where", "id", "reason"}]`` (as :func:`eagle3nb.text.conversations.load_records`
    gives them; a reason reads ``<kind>: <detail>``)."""

    format: str
    records: list[BenchRecord]
    refused: list[dict]


def detect_record_format(row: dict) -> str | None:
    """The format one record's fields mark (module docstring), or None. A ShareGPT-style
    ``conversations`` of role/content dicts (SpecForge's rows) is ``openai``, as in 01."""
    for field, fmt in _MARKS:
        if field in row:
            if fmt == "sharegpt" and _role_content(row[field]):
                return "openai"
            return fmt
    return None


def _role_content(turns) -> bool:
    first = turns[0] if isinstance(turns, list) and turns else None
    return isinstance(first, dict) and first.get("role") is not None and first.get("from") is None


def _rows(path: Path) -> list[tuple[str, object]]:
    """``[(where, parsed JSON or a RecordError for a line that is not JSON)]``, blank lines skipped.

    Raises:
        ValueError: the file is empty, or a JSON array / Parquet file that cannot be read.
    """
    name = path.name
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises many types; the user needs the file and the cause
            raise ValueError(
                f"eval_dataset={str(path)!r} is not a readable Parquet file ({type(e).__name__}: "
                f"{str(e)[:200]}); give a JSONL or Parquet file"
            ) from e
        if not rows:
            raise ValueError(
                f"eval_dataset={str(path)!r}: the file is empty; give a benchmark file"
            )
        return [(f"{name}:row {i}", r) for i, r in enumerate(rows, 1)]
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip magic (HumanEval.jsonl.gz)
        raw = gzip.decompress(raw)
    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a BOM opening the file is not part of line 1
    if not raw.strip():
        raise ValueError(f"eval_dataset={str(path)!r}: the file is empty; give a benchmark file")
    if raw.lstrip().startswith(b"["):
        try:
            items = json.loads(raw.decode("utf-8"))
        except ValueError as e:
            raise ValueError(
                f"eval_dataset={str(path)!r} starts with '[' but is not a JSON array ({e}); give "
                "a JSON array of records or one JSON object per line"
            ) from None
        return [(f"{name}:record {i}", r) for i, r in enumerate(items, 1)]
    out: list[tuple[str, object]] = []
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:  # line by line: one bad line is refused by its number, the rest kept
            out.append((f"{name}:line {n}", json.loads(line.decode("utf-8"))))
        except UnicodeDecodeError as e:
            out.append((f"{name}:line {n}", RecordError(f"not UTF-8 text (byte {e.start + 1})")))
        except ValueError as e:
            why = f"not JSON ({e.msg} at column {e.colno})"
            out.append((f"{name}:line {n}", RecordError(why)))
    return out


def _str(row: dict, field: str, required: bool) -> str | None:
    """``row[field]`` as non-empty text (a number is written as text: ids, numeric answers)."""
    v = row.get(field)
    if v is None:
        if required:
            raise RecordError(f"missing field: {field}")
        return None
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise RecordError(f"wrong type: {field} is a {type(v).__name__}, not text")
    s = str(v)
    if not s.strip():
        raise RecordError(f"empty field: {field}")
    return s


def _turns(row: dict) -> list[str]:
    t = row.get("turns")
    if t is None:
        raise RecordError("missing field: turns")
    if not isinstance(t, list):
        raise RecordError(f"wrong type: turns is a {type(t).__name__}, not a list of texts")
    if not t:
        raise RecordError("empty field: turns")
    for j, x in enumerate(t):
        if not isinstance(x, str):
            raise RecordError(f"wrong type: turn {j} is a {type(x).__name__}, not text")
        if not x.strip():
            raise RecordError(f"empty field: turn {j}")
    return list(t)


def _reference(row: dict, *fields: str) -> str | None:
    for f in fields:
        v = row.get(f)
        if isinstance(v, list):  # MT-Bench: one reference per turn
            if not all(isinstance(x, str) for x in v):
                raise RecordError(f"wrong type: {f} is a list of non-texts")
            return "\n\n".join(v) if v else None
        if v is not None:
            return _str(row, f, False)
    return None


def _record(row: dict, fmt: str) -> tuple[str | None, str, list[str], str | None]:
    """``(id or None, category, turns, reference)`` of one row read as ``fmt``.

    Raises:
        RecordError: the record is refused (the message is the reason).
    """
    rid = _str(row, "id", False)
    category = _str(row, "category", False)
    if fmt == "mtbench":
        rid = _str(row, "question_id", False) or rid
        turns, ref, default = _turns(row), _reference(row, "reference"), "mtbench"
    elif fmt == "gsm8k":
        turns = [_str(row, "question", True)]
        ref, default = _reference(row, "answer"), "gsm8k"
    elif fmt == "humaneval":
        rid = _str(row, "task_id", False) or rid
        turns = [_str(row, "prompt", True)]
        ref, default = _reference(row, "canonical_solution"), "humaneval"
    elif fmt == "math":
        rid = _str(row, "unique_id", False) or rid
        turns = [_str(row, "problem", True)]
        ref = _reference(row, "solution", "answer")
        default = _str(row, "subject", False) or _str(row, "type", False) or "math"
    elif fmt in ("openai", "sharegpt"):
        field = "messages" if fmt == "openai" and "messages" in row else "conversations"
        if field not in row:
            raise RecordError(f"missing field: {field}")
        msgs = normalise(row, fmt)["messages"]
        turns = [m["content"] for m in msgs if m["role"] == "user"]
        ref, default = None, "chat"
    else:
        raise ValueError(f"fmt={fmt!r} is unknown; use auto or one of {FORMATS}")
    category = category or default
    if category == RESERVED_CATEGORY:
        raise RecordError(f"reserved category: {RESERVED_CATEGORY!r} names the whole set")
    return rid, category, turns, ref


def _content_id(turns: list[str]) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(turns).encode()).hexdigest()[:16]


def load_benchmark(path: str | Path, fmt: str = "auto") -> BenchmarkFile:
    """Read a benchmark file record by record (module docstring); bad records refused, the rest
    kept.

    Args:
        path: the local file (the parameter ``eval_dataset``).
        fmt: ``auto`` (the format most records' fields mark; ties go to the earlier of
            :data:`FORMATS`) or one of :data:`FORMATS` (every record read as that format).

    Returns:
        :class:`BenchmarkFile` ``(format, records, refused)``. Refused, each with its file and
        line: a line that is not JSON, a record that is not an object, a missing, empty or
        wrongly typed field, a record of no known format (or of another format than the file's:
        it lacks the file's field), category ``all``, a duplicate id.

    Raises:
        FileNotFoundError: no such file. ValueError: ``fmt`` unknown, the file is empty,
        unreadable, or no record is left (the message names ``eval_dataset``, the first refusals
        and the fix).
    """
    p = Path(path)
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is unknown; use auto or one of {FORMATS}")
    if not p.exists():
        raise FileNotFoundError(
            f"eval_dataset={str(p)!r} does not exist; give a local benchmark file (e.g. MT-Bench "
            f"question.jsonl) or the shipped {DEFAULT_BENCHMARK.name}"
        )
    if p.is_dir():
        raise ValueError(f"eval_dataset={str(p)!r} is a folder; give one benchmark file in it")
    rows = _rows(p)
    marked = [detect_record_format(r) for _, r in rows if isinstance(r, dict)]
    counts = Counter(m for m in marked if m is not None)
    found = fmt if fmt != "auto" else max(FORMATS, key=lambda f: (counts[f], -FORMATS.index(f)))
    if not counts and fmt == "auto":
        found = "no known format"  # every record is refused below, as of unknown format
    records, refused, seen = [], [], set()
    for where, row in rows:
        rid, mark = None, None
        try:
            if isinstance(row, RecordError):
                raise row
            if not isinstance(row, dict):
                raise RecordError(f"not a JSON object (a {type(row).__name__})")
            rid = row.get("question_id", row.get("task_id", row.get("unique_id", row.get("id"))))
            rid = None if rid is None else str(rid)
            mark = detect_record_format(row)
            if mark is None and fmt == "auto":
                known = ", ".join(f for f, _ in _MARKS[:6])
                raise RecordError(f"unknown format: fields {sorted(row)}, none of {known}")
            rid, category, turns, ref = _record(row, found)
        except RecordError as e:
            why = str(e)
            if mark is not None and mark != found:  # a record of another format in this file
                why += f" (the file reads as {found}; this record's fields mark {mark})"
            refused.append({"where": where, "id": rid, "reason": why})
            continue
        rid = rid if rid is not None else _content_id(turns)
        if rid in seen:
            refused.append({"where": where, "id": rid, "reason": f"duplicate id: {rid}"})
            continue
        seen.add(rid)
        records.append(BenchRecord(rid, category, turns, ref, where))
    if not records:
        first = "; ".join(f"{x['where']}: {x['reason']}" for x in refused[:3])
        raise ValueError(
            f"eval_dataset={str(p)!r}: no record left of {len(refused)} (read as {found}; {first}); "
            f"give a file of one of the formats {FORMATS} (fields: see eagle3nb/text/benchmarks.py)"
        )
    return BenchmarkFile(found, records, refused)


def read_benchmark(path: str | Path, fmt: str = "auto") -> list[BenchRecord]:
    """The records :func:`load_benchmark` keeps (refusals dropped; use it to see them)."""
    return load_benchmark(path, fmt).records


def categories(records: list[BenchRecord]) -> dict[str, int]:
    """Records per category, ``{category: count}`` in category-name order."""
    counts = Counter(r.category for r in records)
    return {c: counts[c] for c in sorted(counts)}


def select(records: list[BenchRecord], max_records: int | None, seed: int = 0) -> list[BenchRecord]:
    """A stratified, deterministic subset of at most ``max_records`` records, in file order.

    Every category keeps one record (while ``max_records`` >= the number of categories), the rest
    is shared in proportion to the categories' remaining sizes (largest remainder, ties by name);
    which records a category keeps is a seeded sample (``random.Random(f"{seed}:{category}")``,
    the same on every machine and Python run). With fewer slots than categories the largest
    categories (ties by name) keep one each.

    Args:
        records: as read; max_records: 0, None or >= the number of records keeps all (the
            parameter ``eval_max_records``); seed: int.

    Raises:
        ValueError: ``max_records`` is not an integer >= 0.
    """
    if isinstance(max_records, bool) or not isinstance(max_records, (int, type(None))):
        raise ValueError(f"max_records={max_records!r} must be an integer >= 0 (0 or None: all)")
    if not max_records or max_records >= len(records):
        return list(records)
    if max_records < 0:
        raise ValueError(f"max_records={max_records!r} must be an integer >= 0 (0 or None: all)")
    by_cat: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_cat.setdefault(r.category, []).append(i)
    order = sorted(by_cat, key=lambda c: (-len(by_cat[c]), c))
    if max_records < len(by_cat):
        quota = {c: int(c in order[:max_records]) for c in by_cat}
    else:
        spare = max_records - len(by_cat)
        rest = {c: len(ix) - 1 for c, ix in by_cat.items()}
        total = sum(rest.values())  # > spare, since max_records < len(records)
        share = {c: spare * n / total for c, n in rest.items()}
        quota = {c: 1 + int(share[c]) for c in by_cat}
        left = max_records - sum(quota.values())
        for c in sorted(by_cat, key=lambda c: (-(share[c] - int(share[c])), c))[:left]:
            quota[c] += 1
    keep: list[int] = []
    for c, ix in by_cat.items():
        keep += random.Random(f"{seed}:{c}").sample(ix, quota[c])
    return [records[i] for i in sorted(keep)]
