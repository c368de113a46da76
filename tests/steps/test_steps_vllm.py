"""vLLM in the workbook's steps (real vLLM in its venv): 01 with generate_engine vllm, 02a's dataset
against HF's (02b, engine hf) on the same tokens, 02a stopping on a measured boundary mismatch,
03 from the 02a dataset, 04's vLLM-served counters next to the simulator, metrics per engine."""

import json

import pytest
import torch

from testkit import requires_engine
from eagle3nb.boundaries import conventions
from eagle3nb import params
from eagle3nb.preflight import check_against_model
from eagle3nb.rundir import RunDir
from eagle3nb.steps.evaluate.step import eval_step
from eagle3nb.steps.extract.from_sglang import extract_sglang_step
from eagle3nb.steps.extract.from_vllm import extract_vllm_step
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.steps.train.step import train_step
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.engines import speed
from eagle3nb.text.generation import read_jsonl

pytestmark = requires_engine("vllm")  # 02b on HF here


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    p = params.RunParams(
        outputs_dir=str(tmp_path_factory.mktemp("out")),
        run_name="v",
        max_train_prompts=8,
        max_new_tokens=16,
        max_steps=10,
        max_eval_prompts=4,
        eval_max_new_tokens=16,
        generate_engine="vllm",
        interactive=False,
    )
    p = p.model_copy(
        update={
            k: v for k, v in {"extract_engine": "hf"}.items() if k in params.RunParams.model_fields
        }
    )  # 02b on HF: the independent reference
    check_against_model(p)
    out = {
        "01": generate_step(p, progress=False),
        "02a": extract_vllm_step(p, progress=False),
        "02b": extract_sglang_step(p, progress=False),
    }
    return p, out


def test_generation_manifest_names_vllm(run):
    p, out = run
    man = out["01"]["manifest"]
    assert man["engine"]["name"] == "vllm" and man["engine"]["version"] == "0.32.0"
    assert out["01"]["stats"]["engine"] == "vllm" and out["01"]["stats"]["generated_tokens"] > 0


def test_02a_dataset_is_vllms_and_equals_hf_boundaries(run):
    p, out = run
    rd = RunDir(p)
    v, h = AuxDataset(rd.dataset_vllm), AuxDataset(rd.dataset)
    assert (
        v.manifest["engine"]["name"] == "vllm"
        and v.manifest["engine"]["version"] == "0.32.0"
        and v.manifest["convention"] == "vllm"
    )
    assert v.manifest["layer_ids"] == [1, 2, 4] and v.manifest["aux_boundaries"] == h.manifest[
        "aux_boundaries"
    ] == [1, 2, 4]
    assert v.manifest["final_state"]["engine"] == "vllm"
    assert len(v) == len(h) > 0
    for i in range(len(v)):
        a, b = v[i], h[i]
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(
            a["loss_mask"], b["loss_mask"]
        )
        assert torch.allclose(a["aux"], b["aux"], atol=1e-5, rtol=1e-5) and torch.allclose(
            a["final"], b["final"], atol=1e-5, rtol=1e-5
        )
    assert out["02a"]["alignment"]["ok"] and out["02a"]["alignment"]["measured"] == [1, 2, 4]


def test_engine_speed_metrics(run):
    p, out = run
    e = json.loads(RunDir(p).metrics.read_text())["engines"]["vllm"]
    for k in (
        "generate_tokens_per_s",
        "prefill_tokens_per_s_without_capture",
        "extract_tokens_per_s",
        "generate_tokens_per_s_01",
        "dataset_pass_tokens_per_s",  # 02a wrote the dataset in this run
    ):
        assert e[k] > 0
    n_train = sum(1 for r in read_jsonl(RunDir(p).generated) if r["split"] == "train")
    assert e["generate_prompts"] == min(n_train, speed.GENERATE_PROMPTS)
    assert e["capture_overhead_ratio"] == pytest.approx(
        e["prefill_tokens_per_s_without_capture"] / e["extract_tokens_per_s"], rel=1e-2
    )
    # vLLM's two kinds run on separate engines: each pass timed PASS_REPEATS times, fastest kept
    n = speed.PASS_REPEATS
    passes = e["pass_seconds"]
    assert len(passes["capture"]) == n and len(passes["plain"]) == n
    assert e["extract_tokens_per_s"] == pytest.approx(
        e["speed_tokens"] / min(passes["capture"]), rel=1e-3
    )
    assert e["prefill_tokens_per_s_without_capture"] == pytest.approx(
        e["speed_tokens"] / min(passes["plain"]), rel=1e-3
    )


def test_02a_stops_when_vllm_captures_other_boundaries(run, monkeypatch):
    """A wrong convention table (vLLM ids taken as boundary - 1): vLLM then really captures one
    boundary lower; the probe measures it and nothing is written."""
    p, _ = run
    p2 = p.model_copy(update={"run_name": "v-mismatch"})
    src, dst = RunDir(p), RunDir(p2)
    dst.make()
    for f in (src.generated, src.generation_manifest):
        (dst.generated.parent / f.name).write_bytes(f.read_bytes())
    wrong = conventions.Convention(**{**conventions.CONVENTIONS["vllm"].__dict__, "offset": 1})
    monkeypatch.setitem(conventions.CONVENTIONS, "vllm", wrong)
    with pytest.raises(
        ValueError,
        match=r"vllm captured boundaries \[0, 1, 3\] for vllm ids \[0, 1, 3\], declared \[1, 2, 4\].*allow_boundary_mismatch=True",
    ):
        extract_vllm_step(p2, progress=False)
    assert not (dst.dataset_vllm / "manifest.json").exists()


def test_train_from_02a_and_vllm_served_acceptance(run):
    p, _ = run
    p3 = p.model_copy(update={"train_on": "vllm", "eval_engines": ["simulator", "vllm"]})
    tr = train_step(p3, progress=False)
    assert (
        json.loads((tr["export_dir"] / "manifest.json").read_text())["dataset_engine"]["name"]
        == "vllm"
    )
    ev = eval_step(p3, progress=False)
    v = ev["stats"]["served_by"]["vllm"]
    assert v["greedy_mismatches_vs_engine_plain"] == 0 and v["mismatches_vs_hf_greedy"] == 0
    assert (
        v["counters"]["num_drafts"] > 0
        and sum(v["counters"]["accepted_per_pos"]) == v["counters"]["num_accepted_tokens"]
    )
    assert ev["stats"]["engines"][f"trained, served by vLLM {v['engine_version']}"].startswith(
        "vllm"
    )
    # same drafter, same prompts, greedy: the counters agree with the simulator (noise: 10-step drafter)
    assert all(d <= 0.1 for d in v["abs_diff_per_position"]), v
