"""A step's recorded result (eagle3nb.steps.shared.recorded): read back only on the same parameters,
package source and input files; anything else runs the step again. The step here is a counter,
so each assertion says whether the step really ran."""

import os

import pytest
import torch

from eagle3nb.params import RunParams
from eagle3nb.steps.shared import recorded


@pytest.fixture
def run(tmp_path):
    root = tmp_path / "run"
    (root / "data").mkdir(parents=True)
    (root / "data" / "generated.jsonl").write_text('{"a": 1}\n')
    (root / "dataset").mkdir()
    (root / "dataset" / "shard-00000.bin").write_bytes(b"x" * 64)
    calls = []

    def step(p, extra=None, live=None):
        def body():
            calls.append(1)
            out = {"n": len(calls), "t": torch.arange(3.0) * len(calls), "nested": {1: [2, "b"]}}
            return {**out, **(extra or {})}

        return recorded.run_or_read(p, root, "02b_extract_sglang", ("data", "dataset*"), body, live)

    return root, calls, step


def test_same_inputs_read_back_the_first_result(run):
    root, calls, step = run
    p = RunParams()
    first = step(p)
    again = step(p.model_copy(update={"interactive": not p.interactive}))  # widgets only
    assert len(calls) == 1 and again["recorded"]["read_back"] and "recorded" not in first
    assert (
        again["n"] == 1 and torch.equal(again["t"], first["t"]) and again["nested"] == {1: [2, "b"]}
    )
    assert (root / "recorded" / "02b_extract_sglang.pt").is_file()


def test_changed_parameter_source_or_switch_runs_again(run, monkeypatch):
    root, calls, step = run
    p = RunParams()
    step(p)
    assert step(p.model_copy(update={"seed": 1}))["n"] == 2  # another parameter
    assert step(p.model_copy(update={"seed": 1}))["n"] == 2  # ... recorded in turn
    assert step(p.model_copy(update={"seed": 1, "reuse_results": False}))["n"] == 3
    assert step(p.model_copy(update={"seed": 1}))["n"] == 3  # the switch is not in the key
    monkeypatch.setattr(recorded, "source_hash", lambda: "edited package")
    assert step(p.model_copy(update={"seed": 1}))["n"] == 4
    from eagle3nb.target import models

    monkeypatch.setattr(models, "model_hash", lambda path, cache=None: "other weights")
    assert step(p.model_copy(update={"seed": 1}))["n"] == 5


def test_edited_chat_template_file_runs_again(run, tmp_path):
    root, calls, step = run
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{{ messages }}")
    p = RunParams(mode="chat", chat_template=str(tpl))
    step(p)
    assert step(p)["n"] == 1
    tpl.write_text("{{ messages }}!")  # same path, new content
    assert step(p)["n"] == 2


def test_changed_input_files_run_again(run, monkeypatch):
    root, calls, step = run
    p = RunParams()
    step(p)
    (root / "data" / "generated.jsonl").write_text('{"a": 2}\n')  # same size, other content
    assert step(p)["n"] == 2
    (root / "dataset_vllm").mkdir()  # a new folder the pattern dataset* names
    (root / "dataset_vllm" / "manifest.json").write_text("{}")
    assert step(p)["n"] == 3
    (root / "train").mkdir()  # not an input of this step
    (root / "train" / "history.json").write_text("[]")
    assert step(p)["n"] == 3
    # large files count by size and mtime, not content
    monkeypatch.setattr(recorded, "SMALL_FILE_BYTES", 16)
    assert step(p)["n"] == 4  # the way the shard is fingerprinted changed
    shard = root / "dataset" / "shard-00000.bin"
    st = shard.stat()
    shard.write_bytes(b"y" * 64)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: not seen
    assert step(p)["n"] == 4
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert step(p)["n"] == 5


def test_results_that_are_not_plain_data_are_not_recorded(run):
    root, calls, step = run
    p = RunParams()
    out = step(p, extra={"thing": object()})
    assert "thing" in out and not (root / "recorded" / "02b_extract_sglang.pt").exists()
    assert step(p, extra={"thing": object()})["n"] == 2
    assert not list((root / "recorded").glob("*.tmp*"))  # the refused temp file is gone


def test_live_entries_are_rebuilt_not_recorded(run):
    root, calls, step = run
    p = RunParams()
    made = []
    live = {"thing": lambda out: made.append(out["n"]) or object()}
    first = step(p, extra={"thing": object()}, live=live)
    again = step(p, extra={"thing": object()}, live=live)
    assert len(calls) == 1 and again["recorded"]["read_back"] and made == [1]
    assert again["thing"] is not first["thing"]


def test_a_damaged_record_runs_the_step_again(run):
    root, calls, step = run
    p = RunParams()
    step(p)
    (root / "recorded" / "02b_extract_sglang.pt").write_bytes(b"not a torch file")
    assert step(p)["n"] == 2
    assert step(p)["n"] == 2  # and the new record reads back
