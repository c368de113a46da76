"""Benchmark files: each format read from a small file written here (expected records spelled out
by hand), detection and its override, multi-turn, every kind of bad record refused by file, line
and reason with the rest kept, empty files, and the shipped TinyStories set."""

import gzip
import hashlib
import json
from collections import Counter

import pytest

from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.text.benchmarks import (
    DEFAULT_BENCHMARK,
    BenchRecord,
    categories,
    detect_record_format,
    load_benchmark,
    read_benchmark,
    select,
)


def _write(path, rows):
    """One line per row: a dict/list as JSON, a str as written (for lines that are not JSON)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _hash_id(turns):
    return "sha256:" + hashlib.sha256(json.dumps(turns).encode()).hexdigest()[:16]


def test_mtbench_multi_turn_and_reference(tmp_path):
    f = _write(
        tmp_path / "question.jsonl",
        [
            {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
            {
                "question_id": 111,
                "category": "math",
                "turns": ["What is 2 + 2?"],
                "reference": ["4"],
            },
            {"question_id": 121, "turns": ["Hi", "More"], "reference": ["a", "b"]},
        ],
    )
    got = load_benchmark(f)
    assert got.format == "mtbench" and got.refused == []
    assert got.records == [
        BenchRecord("81", "writing", ["Write a poem.", "Shorter."], None, "question.jsonl:line 1"),
        BenchRecord("111", "math", ["What is 2 + 2?"], "4", "question.jsonl:line 2"),
        BenchRecord("121", "mtbench", ["Hi", "More"], "a\n\nb", "question.jsonl:line 3"),
    ]
    assert read_benchmark(f) == got.records


def test_gsm8k(tmp_path):
    f = _write(
        tmp_path / "gsm8k.jsonl",
        [
            {"question": "Tom has 3 apples. He eats 1. How many?", "answer": "3 - 1 = 2\n#### 2"},
            {"question": "What is 5 times 2?", "answer": "#### 10", "category": "easy", "id": 7},
        ],
    )
    got = load_benchmark(f)
    q0 = "Tom has 3 apples. He eats 1. How many?"
    assert got.format == "gsm8k" and got.refused == []
    assert got.records == [
        BenchRecord(_hash_id([q0]), "gsm8k", [q0], "3 - 1 = 2\n#### 2", "gsm8k.jsonl:line 1"),
        BenchRecord("7", "easy", ["What is 5 times 2?"], "#### 10", "gsm8k.jsonl:line 2"),
    ]


def test_humaneval_gzipped(tmp_path):
    rows = [
        {
            "task_id": "HumanEval/0",
            "prompt": "def add(a, b):\n",
            "canonical_solution": "    return a + b\n",
            "test": "assert add(1, 2) == 3",
            "entry_point": "add",
        }
    ]
    f = tmp_path / "HumanEval.jsonl.gz"
    f.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    got = load_benchmark(f)
    assert got.format == "humaneval"
    assert got.records == [
        BenchRecord(
            "HumanEval/0",
            "humaneval",
            ["def add(a, b):\n"],
            "    return a + b\n",
            "HumanEval.jsonl.gz:line 1",
        )
    ]


def test_math500_and_math(tmp_path):
    f = _write(
        tmp_path / "math.jsonl",
        [
            {
                "problem": "Solve x + 1 = 2.",
                "solution": "x = 1, so \\boxed{1}.",
                "answer": "1",
                "subject": "Algebra",
                "level": 1,
                "unique_id": "test/algebra/1.json",
            },
            {"problem": "Count to 3.", "answer": "3"},
            {"problem": "What is 1/2 of 4?", "solution": "2", "type": "Prealgebra"},
        ],
    )
    got = load_benchmark(f)
    assert got.format == "math" and got.refused == []
    assert got.records == [
        BenchRecord(
            "test/algebra/1.json",
            "Algebra",
            ["Solve x + 1 = 2."],
            "x = 1, so \\boxed{1}.",
            "math.jsonl:line 1",
        ),
        BenchRecord(_hash_id(["Count to 3."]), "math", ["Count to 3."], "3", "math.jsonl:line 2"),
        BenchRecord(
            _hash_id(["What is 1/2 of 4?"]),
            "Prealgebra",
            ["What is 1/2 of 4?"],
            "2",
            "math.jsonl:line 3",
        ),
    ]


def test_chat_formats_give_the_user_turns(tmp_path):
    conv = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": "Once upon a time."},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": "The end."},
    ]
    sharegpt = [
        {"from": "human", "value": "Hello"},
        {"from": "gpt", "value": "Hi"},
        {"from": "human", "value": "Bye"},
    ]
    _write(tmp_path / "openai.jsonl", [{"id": "c1", "messages": conv, "category": "stories"}])
    _write(tmp_path / "sharegpt.jsonl", [{"conversations": sharegpt}])
    _write(tmp_path / "specforge.jsonl", [{"id": "s1", "conversations": conv}])
    a, b, c = (load_benchmark(tmp_path / f"{n}.jsonl") for n in ("openai", "sharegpt", "specforge"))
    assert (a.format, b.format, c.format) == ("openai", "sharegpt", "openai")
    story = ["Tell me a story.", "Go on."]
    assert a.records == [BenchRecord("c1", "stories", story, None, "openai.jsonl:line 1")]
    assert b.records == [
        BenchRecord(
            _hash_id(["Hello", "Bye"]), "chat", ["Hello", "Bye"], None, "sharegpt.jsonl:line 1"
        )
    ]
    assert c.records == [BenchRecord("s1", "chat", story, None, "specforge.jsonl:line 1")]


def test_detection_per_record_and_override(tmp_path):
    assert detect_record_format({"question_id": 1, "turns": ["a"]}) == "mtbench"
    assert detect_record_format({"question": "q", "answer": "a"}) == "gsm8k"
    assert detect_record_format({"prompt": "p", "task_id": "t"}) == "humaneval"
    assert detect_record_format({"problem": "p"}) == "math"
    assert detect_record_format({"messages": []}) == "openai"
    assert detect_record_format({"conversations": [{"from": "human", "value": "x"}]}) == "sharegpt"
    assert detect_record_format({"conversations": [{"role": "user", "content": "x"}]}) == "openai"
    assert detect_record_format({"text": "x"}) is None
    # a record with both fields reads as humaneval; fmt= overrides, for every record
    f = _write(tmp_path / "both.jsonl", [{"prompt": "P", "question": "Q", "id": "1"}])
    assert load_benchmark(f).records[0].turns == ["P"]
    forced = load_benchmark(f, fmt="gsm8k")
    assert forced.format == "gsm8k" and forced.records[0].turns == ["Q"]
    # the file takes the format most records mark; the other record is refused, saying why
    g = _write(
        tmp_path / "mixed.jsonl",
        [{"question": "a"}, {"question": "b"}, {"prompt": "c", "task_id": "t"}],
    )
    got = load_benchmark(g)
    assert got.format == "gsm8k" and [r.turns for r in got.records] == [["a"], ["b"]]
    assert got.refused == [
        {
            "where": "mixed.jsonl:line 3",
            "id": "t",
            "reason": "missing field: question (the file reads as gsm8k; this record's fields "
            "mark humaneval)",
        }
    ]
    with pytest.raises(ValueError, match=r"fmt='mmlu' is unknown"):
        load_benchmark(g, fmt="mmlu")


def test_each_kind_of_bad_record_refused_by_file_line_and_reason(tmp_path):
    good = {"question_id": 1, "category": "story", "turns": ["Tell a story."]}
    lines = [
        good,  # 1
        "{not json",  # 2
        ["a", "list"],  # 3
        {"question_id": 2, "category": "story"},  # 4: no turns
        {"question_id": 3, "turns": []},  # 5
        {"question_id": 4, "turns": "one string"},  # 6
        {"question_id": 5, "turns": ["ok", 7]},  # 7
        {"question_id": 6, "turns": ["ok", "  "]},  # 8
        {"question_id": 7, "category": "", "turns": ["x"]},  # 9
        {"question_id": 8, "category": ["a"], "turns": ["x"]},  # 10
        {"text": "rendered already"},  # 11
        {"question_id": 9, "category": "all", "turns": ["x"]},  # 12
        {"question_id": 1, "category": "story", "turns": ["again"]},  # 13
        "",  # 14: blank, skipped
        {"question_id": 10, "category": "moral", "turns": ["Be kind.", "Why?"]},  # 15
    ]
    f = _write(tmp_path / "bad.jsonl", lines)
    with open(f, "ab") as fh:  # line 16: not UTF-8
        fh.write(b'{"turns": ["\xff"]}\n')
    got = load_benchmark(f)
    assert got.records == [
        BenchRecord("1", "story", ["Tell a story."], None, "bad.jsonl:line 1"),
        BenchRecord("10", "moral", ["Be kind.", "Why?"], None, "bad.jsonl:line 15"),
    ]
    want = [
        (2, None, "not JSON"),
        (3, None, "not a JSON object (a list)"),
        (4, "2", "missing field: turns"),
        (5, "3", "empty field: turns"),
        (6, "4", "wrong type: turns is a str, not a list of texts"),
        (7, "5", "wrong type: turn 1 is a int, not text"),
        (8, "6", "empty field: turn 1"),
        (9, "7", "empty field: category"),
        (10, "8", "wrong type: category is a list, not text"),
        (11, None, "unknown format: fields ['text']"),
        (12, "9", "reserved category: 'all' names the whole set"),
        (13, "1", "duplicate id: 1"),
        (16, None, "not UTF-8 text (byte 13)"),  # 1-based, after the 12 bytes {"turns": ["
    ]
    assert [(x["where"], x["id"]) for x in got.refused] == [
        (f"bad.jsonl:line {n}", i) for n, i, _ in want
    ]
    for x, (_, _, reason) in zip(got.refused, want):
        assert x["reason"].startswith(reason), (x, reason)
    assert len(got.refused) == 13


def test_chat_record_refusals_come_from_conversations(tmp_path):
    f = _write(
        tmp_path / "chat.jsonl",
        [
            {"messages": [{"role": "user", "content": "Hi"}]},
            {
                "messages": [
                    {"role": "assistant", "content": "Hi"},
                    {"role": "user", "content": "Hi"},
                ]
            },
            {"messages": [{"role": "wizard", "content": "Hi"}]},
            {"messages": [{"role": "user", "content": ""}]},
        ],
    )
    got = load_benchmark(f)
    assert [r.turns for r in got.records] == [["Hi"]]
    reasons = [x["reason"] for x in got.refused]
    assert [x["where"] for x in got.refused] == [f"chat.jsonl:line {n}" for n in (2, 3, 4)]
    assert reasons[0] == "starts with an assistant turn"
    assert reasons[1].startswith("unknown role 'wizard' in message 0")
    assert reasons[2] == "empty content in message 0 (user)"


def test_json_array_bom_and_parquet(tmp_path):
    rows = [{"question": "One?"}, {"question": "Two?", "id": "b"}]
    arr = tmp_path / "gsm.json"
    arr.write_text(json.dumps(rows, indent=2))
    got = load_benchmark(arr)
    assert [(r.id, r.turns, r.source) for r in got.records] == [
        (_hash_id(["One?"]), ["One?"], "gsm.json:record 1"),
        ("b", ["Two?"], "gsm.json:record 2"),
    ]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(rows[1]).encode() + b"\r\n")
    assert [r.turns for r in read_benchmark(bom)] == [["Two?"]]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    # columns as Arrow stores them: a key absent from a row is null there
    pq.write_table(
        pa.table({"question": ["One?", "Two?"], "id": [None, "b"]}), tmp_path / "gsm.parquet"
    )
    got = load_benchmark(tmp_path / "gsm.parquet")
    assert [(r.id, r.source) for r in got.records] == [
        (_hash_id(["One?"]), "gsm.parquet:row 1"),
        ("b", "gsm.parquet:row 2"),
    ]


def test_empty_file_missing_file_and_no_record_left(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match=r"eval_dataset=.*empty\.jsonl.*the file is empty"):
        load_benchmark(empty)
    with pytest.raises(FileNotFoundError, match=r"eval_dataset=.*nope\.jsonl.* does not exist"):
        load_benchmark(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="is a folder"):
        load_benchmark(tmp_path)
    bad = _write(tmp_path / "bad.jsonl", ["{oops", {"text": "x"}, {"turns": []}])
    with pytest.raises(ValueError) as e:
        load_benchmark(bad)
    msg = str(e.value)
    assert "eval_dataset=" in msg and "bad.jsonl" in msg and "no record left of 3" in msg
    assert "bad.jsonl:line 1: not JSON" in msg and "give a file of one of the formats" in msg


def test_shipped_set():
    assert DEFAULT_BENCHMARK == REPO_ROOT / "eagle3nb" / "data" / "bench_tinystories_mtbench.jsonl"
    raw = [json.loads(x) for x in DEFAULT_BENCHMARK.read_text().splitlines() if x.strip()]
    got = load_benchmark(DEFAULT_BENCHMARK)
    assert got.format == "mtbench" and got.refused == []
    assert 20 <= len(got.records) == len(raw) <= 30
    assert len({r.id for r in got.records}) == len(raw)
    assert all(set(r) == {"question_id", "category", "turns"} for r in raw)
    assert categories(got.records) == dict(sorted(Counter(r["category"] for r in raw).items()))
    assert set(categories(got.records)) == {"story", "dialogue", "description", "moral"}
    assert sum(len(r.turns) == 2 for r in got.records) >= 6
    assert [r.turns for r in got.records] == [r["turns"] for r in raw]


def test_shipped_set_fits_the_default_targets_tokenizer():
    """Every turn is written in the 512-token vocabulary of the default target: it encodes with no
    unknown token and decodes back to itself."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(REPO_ROOT.parent / "shared/models/stories260K-hd32"))
    for r in read_benchmark(DEFAULT_BENCHMARK):
        for t in r.turns:
            ids = tok(t)["input_ids"]
            assert tok.unk_token_id not in ids, t
            assert tok.decode(ids, skip_special_tokens=True).strip() == t


def _recs(cats):
    return [BenchRecord(str(i), c, [f"q{i}"], None, f"f:line {i + 1}") for i, c in enumerate(cats)]


def test_select_is_stratified_and_deterministic():
    recs = read_benchmark(DEFAULT_BENCHMARK)  # 6 per category
    # 1 each, the 6 spare shared as 1.5 each: 1 + 1 each, the 2 left to the first names
    ten = select(recs, 10, seed=0)
    assert categories(ten) == {"description": 3, "dialogue": 3, "moral": 2, "story": 2}
    assert ten == select(recs, 10, seed=0)
    assert [recs.index(r) for r in ten] == sorted(recs.index(r) for r in ten)  # file order
    assert any(select(recs, 10, seed=s) != ten for s in range(1, 6))
    # fewer slots than categories: the largest (here all equal: by name) keep one
    assert categories(select(recs, 3, 0)) == {"description": 1, "dialogue": 1, "moral": 1}
    for everything in (None, 0, 24, 100):
        assert select(recs, everything, 0) == recs
    # a: 5, b: 3, c: 1, five slots: 1 each; spare 2 over rest a 4, b 2, c 0 -> 1.33, 0.67, 0
    # -> a 1 + 1, b 1 + 0, c 1; the one left to b (remainder 0.67 > 0.33)
    uneven = _recs(["a"] * 5 + ["b"] * 3 + ["c"])
    assert categories(select(uneven, 5, 3)) == {"a": 2, "b": 2, "c": 1}
    with pytest.raises(ValueError, match=r"max_records=-1"):
        select(recs, -1, 0)
    with pytest.raises(ValueError, match=r"max_records=2.5"):
        select(recs, 2.5, 0)


def test_records_are_frozen():
    r = _recs(["a"])[0]
    with pytest.raises(AttributeError):
        r.category = "b"
