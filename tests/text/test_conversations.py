"""Chat datasets read through the datasets library: each form and container gives the same
conversations and samples, every bad-record kind is refused by file and line with the rest kept,
and a dataset given as a prompts file is refused before any work."""

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from eagle3nb.params import RunParams
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.steps.generate.chat import _fit_context, refusal_table
from eagle3nb.text import chat
from eagle3nb.text.conversations import detect_format, load_records, looks_like_dataset

DATA = REPO_ROOT / "eagle3nb" / "data"
OPENAI = DATA / "chat_stories.openai.jsonl"
SHAREGPT = DATA / "chat_stories.sharegpt.jsonl"
TEMPLATE = (DATA / "chat_template_stories.jinja").read_text()
BAD = Path(__file__).resolve().parents[1] / "bad_inputs" / "chat" / "each_kind.jsonl"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(REPO_ROOT.parent / "shared/models/stories260K-hd32"))


def _raw(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _no_ids(messages):
    """Messages without tool-call ids (ShareGPT has none; the template renders none)."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if k != "tool_call_id"}
        if "tool_calls" in m:
            m["tool_calls"] = [{k: v for k, v in c.items() if k != "id"} for c in m["tool_calls"]]
        out.append(m)
    return out


def test_project_data_has_what_the_issue_asks():
    raw = _raw(OPENAI)
    roles = [[m["role"] for m in r["messages"]] for r in raw]
    assert len(raw) >= 200
    assert sum("system" in r for r in roles) > 50
    assert sum(r.count("user") >= 3 for r in roles) > 10
    assert sum("tool" in r for r in roles) > 20
    assert sum(any(m.get("reasoning_content") for m in r["messages"]) for r in raw) > 20


def test_both_forms_give_identical_conversations_and_samples(tok):
    fa, a, ra = load_records(OPENAI)
    fb, b, rb = load_records(SHAREGPT)
    assert (fa, fb, ra, rb) == ("openai", "sharegpt", [], [])
    assert [r["id"] for r in a] == [r["id"] for r in b] == [r["id"] for r in _raw(OPENAI)]
    for x, y, raw in zip(a, b, _raw(OPENAI)):
        # the OpenAI record read back equals the file's JSON, arguments parsed (second method)
        want = json.loads(json.dumps(raw["messages"]))
        for m in want:
            for c in m.get("tool_calls", []):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        assert x["messages"] == want
        assert _no_ids(x["messages"]) == y["messages"]
        assert x["tools"] == y["tools"] == (raw["tools"] or None)
    for x, y in list(zip(a, b))[:60]:
        sx = chat.conversation_rows(tok, x["messages"], TEMPLATE, x["tools"])
        sy = chat.conversation_rows(tok, y["messages"], TEMPLATE, y["tools"])
        assert sx == sy


def test_json_parquet_and_saved_folder_read_like_jsonl(tmp_path):
    import datasets

    raw = _raw(OPENAI)[:30]
    for r in raw:
        r["tools"] = json.dumps(r["tools"])  # one type per column across rows
    (tmp_path / "a.json").write_text(json.dumps(raw))
    ds = datasets.Dataset.from_list(raw)
    ds.to_parquet(str(tmp_path / "a.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    want = load_records(OPENAI)[1][:30]
    for name in ("a.json", "a.parquet", "saved", "saved_dict"):
        fmt, got, refused = load_records(tmp_path / name)
        assert fmt == "openai" and refused == []
        strip = [{k: v for k, v in r.items() if k != "where"} for r in got]
        assert strip == [{k: v for k, v in r.items() if k != "where"} for r in want], name
        assert got[3]["where"] == f"{name}:row 3"


def test_each_bad_record_kind_refused_by_line_rest_kept(tok):
    fmt, recs, refused = load_records(BAD)
    kept = _fit_context(recs, refused, tok, TEMPLATE, {}, 512, 24)
    # line numbers of the file as written (line 5 is blank), checked by hand
    assert [r["id"] for r in kept] == ["ok-0", "ok-1", "ok-2"]
    assert [r["where"] for r in kept] == [
        "each_kind.jsonl:line 1",
        "each_kind.jsonl:line 4",
        "each_kind.jsonl:line 11",
    ]
    got = {(x["where"], x["id"]): x["reason"] for x in refused}
    expect = {
        ("each_kind.jsonl:line 2", "bad-role"): "unknown role 'narrator'",
        ("each_kind.jsonl:line 3", "bad-empty"): "empty content in message 0",
        ("each_kind.jsonl:line 6", "bad-first"): "starts with an assistant turn",
        ("each_kind.jsonl:line 7", "bad-call"): "malformed tool call: arguments of 'get_weather'",
        ("each_kind.jsonl:line 8", "bad-result"): "malformed tool call: tool result in message 1",
        ("each_kind.jsonl:line 9", "ok-0"): "duplicate id",
        ("each_kind.jsonl:line 10", "bad-long"): "too long for the context",
    }
    assert set(got) == set(expect)
    for k, v in expect.items():
        assert got[k].startswith(v), (k, got[k])
    table = refusal_table(refused)
    assert table.startswith("refused records: 7") and "each_kind.jsonl:line 7" in table


def test_detection_and_named_format():
    assert detect_format(["id", "messages", "tools"]) == "openai"
    assert detect_format(["conversations"]) == "sharegpt"
    assert detect_format(["text", "meta"]) == "text"
    with pytest.raises(ValueError, match="no column of a known chat format"):
        detect_format(["prompt", "completion"])
    fmt, recs, refused = load_records(SHAREGPT, "sharegpt")
    assert fmt == "sharegpt" and len(recs) == len(_raw(SHAREGPT))
    # named wrongly: the ShareGPT file read as OpenAI refuses every record (from/value, no role)
    fmt, recs, refused = load_records(SHAREGPT, "openai")
    assert recs == [] and len(refused) == len(_raw(SHAREGPT))
    assert all(x["reason"].startswith("unknown role None") for x in refused)
    with pytest.raises(ValueError, match="dataset_format='chatml' is unknown"):
        load_records(SHAREGPT, "chatml")


def test_specforge_rows_read_as_openai(tmp_path):
    raw = _raw(OPENAI)[:5]
    p = tmp_path / "sf.jsonl"
    p.write_text(
        "".join(json.dumps({"id": r["id"], "conversations": r["messages"]}) + "\n" for r in raw)
    )
    fmt, recs, refused = load_records(p)
    assert fmt == "openai" and refused == []
    assert [r["messages"] for r in recs] == [r["messages"] for r in load_records(OPENAI)[1][:5]]


def test_preformatted_text(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"text": "<s>User: Hi\\nAssistant:"}\n{"text": ""}\n')
    fmt, recs, refused = load_records(p)
    assert fmt == "text" and recs[0]["text"] == "<s>User: Hi\nAssistant:"
    assert refused == [{"where": "t.jsonl:line 2", "id": None, "reason": "empty text"}]


def test_dataset_as_prompts_file_refused_before_work(tmp_path):
    assert looks_like_dataset(OPENAI) == "its suffix is .jsonl"
    hidden = tmp_path / "prompts.txt"
    hidden.write_text(OPENAI.read_text().splitlines()[0] + "\n")
    assert looks_like_dataset(hidden) == "its first line is a JSON object"
    assert looks_like_dataset(DATA / "prompts_tinystories.txt") is None
    with pytest.raises(ValueError, match=r"prompts_file=.* is not a file of prompts .*dataset:"):
        RunParams(prompts_file=str(hidden))
    with pytest.raises(ValueError, match="needs mode: chat"):
        RunParams(dataset=str(OPENAI))
    assert RunParams(dataset=str(OPENAI), mode="chat").dataset == str(OPENAI)


NOT_JSON = BAD.with_name("not_json_line.jsonl")


def test_a_line_that_is_not_json_is_refused_by_line_rest_kept():
    # issue 32 item 2: 35 good records and one line `this line is not json` (line 18)
    text = NOT_JSON.read_text().splitlines()
    assert text[17] == "this line is not json" and len(text) == 36
    fmt, recs, refused = load_records(NOT_JSON)
    assert fmt == "openai"
    assert refused == [
        {
            "where": "not_json_line.jsonl:line 18",
            "id": None,
            "reason": "not JSON (Expecting value at column 1)",
        }
    ]
    good = [(n, json.loads(x)["id"]) for n, x in enumerate(text, 1) if n != 18]
    assert [(r["where"], r["id"]) for r in recs] == [
        (f"not_json_line.jsonl:line {n}", i) for n, i in good
    ]
    table = refusal_table(refused)
    assert table.splitlines()[:2] == ["refused records: 1", "      1  not JSON"]
    assert "not_json_line.jsonl:line 18" in table and "id=None: not JSON" in table


def test_other_bad_lines_bom_and_json_lines_under_json(tmp_path):
    ok = [json.dumps({"id": f"c{i}", "text": f"<s>User: {i}\nAssistant:"}) for i in range(3)]
    body = "\ufeff" + ok[0] + "\r\n[1, 2]\r\n" + ok[1] + "\r\n"
    p = tmp_path / "mixed.jsonl"
    p.write_bytes(body.encode() + b"\xff\xfe not utf-8\n" + ok[2].encode() + b"\n")
    fmt, recs, refused = load_records(p)
    assert fmt == "text" and [r["id"] for r in recs] == ["c0", "c1", "c2"]
    assert [r["where"] for r in recs] == [
        "mixed.jsonl:line 1",
        "mixed.jsonl:line 3",
        "mixed.jsonl:line 5",
    ]
    assert [(x["where"], x["reason"]) for x in refused] == [
        ("mixed.jsonl:line 2", "not a JSON object (a list)"),
        ("mixed.jsonl:line 4", "not UTF-8 text (byte 1)"),
    ]
    j = tmp_path / "lines.json"  # JSON lines under a .json suffix: named by line too
    j.write_text(ok[0] + "\nnot json\n" + ok[1] + "\n")
    fmt, recs, refused = load_records(j)
    assert [r["where"] for r in recs] == ["lines.json:line 1", "lines.json:line 3"]
    assert refused[0]["where"] == "lines.json:line 2"


def test_no_json_line_at_all_and_an_empty_file_refused_by_name(tmp_path):
    p = tmp_path / "junk.jsonl"
    p.write_text("this line is not json\n\nnor this\n")
    with pytest.raises(
        ValueError,
        match=r"^dataset='.*junk\.jsonl': no line holds a JSON object \(2 refused, first: "
        r"junk\.jsonl:line 1: not JSON \(Expecting value at column 1\)\); give one JSON object per line$",
    ):
        load_records(p)
    with pytest.raises(
        ValueError,
        match=r"^dataset='.*empty\.jsonl': the file is empty; give a chat dataset with at least "
        r"one record \(one JSON object per line in a \.jsonl\), or dataset: null to use prompts_file$",
    ):
        load_records(BAD.with_name("empty.jsonl"))
