"""01's per-engine throughput in one run (``generate_speed_engines``): the same train prompts
generated again through vLLM after HF, tokens/s of each in metrics.json, and vLLM's greedy ids
compared with HF's stored ones record by record here (not by the code under test). Skipped when
the vLLM venv is absent."""

import json

import pytest

from testkit import requires_engine
from eagle3nb import params
from eagle3nb.rundir import RunDir
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.text.generation import read_jsonl

pytestmark = requires_engine("vllm")


def test_hf_and_vllm_timed_on_the_same_prompts(tmp_path):
    p = params.RunParams(
        outputs_dir=str(tmp_path),
        run_name="speed",
        max_train_prompts=6,
        max_new_tokens=16,
        interactive=False,
        generate_speed_engines=["hf", "vllm"],
    )
    out = generate_step(p, progress=False)
    sp = json.loads(RunDir(p).metrics.read_text())["generate"]["speed_by_engine"]
    assert set(sp) == {"hf", "vllm"}  # "hf" is the run's own engine, listed once
    assert sp["hf"]["engine"] == "hf-transformers" and sp["vllm"]["engine"].startswith("vllm")
    recs = [r for r in read_jsonl(RunDir(p).generated) if r["split"] == "train"]
    n_tok = sum(len(r["output_ids"]) for r in recs)
    assert sp["hf"]["generated_tokens"] == n_tok == out["stats"]["generated_tokens"]
    for e in ("hf", "vllm"):
        s = sp[e]
        assert s["tokens_per_s"] == pytest.approx(s["generated_tokens"] / s["seconds"], rel=0.01)
    # greedy float32 on this target: vLLM's ids equal HF's for every prompt (measured), so both
    # produce as many tokens; the stored records stay HF's
    assert sp["vllm"]["same_ids_as_run"] == 1.0
    assert sp["vllm"]["generated_tokens"] == n_tok
    assert out["manifest"]["engine"]["name"] == "hf-transformers"


def test_chat_regeneration_timed_through_vllm_too(tmp_path):
    """The chat path: the same conversations regenerated through vLLM after HF; vLLM's turns
    compared with the stored rows' generated ids here (greedy float32: equal, measured)."""
    p = params.RunParams(
        outputs_dir=str(tmp_path),
        run_name="chatspeed",
        mode="chat",
        chat_template="eagle3nb/data/chat_template_stories.jinja",
        dataset="eagle3nb/data/chat_stories.openai.jsonl",
        max_train_prompts=4,
        heldout_fraction=0.02,
        max_new_tokens=12,
        interactive=False,
        generate_speed_engines=["vllm"],
    )
    out = generate_step(p, progress=False)
    sp = out["stats"]["speed_by_engine"]
    assert set(sp) == {"hf", "vllm"} and sp["vllm"]["engine"].startswith("vllm")
    assert sp["hf"]["generated_tokens"] == out["stats"]["generated_tokens"] > 0
    assert sp["vllm"]["generated_tokens"] == sp["hf"]["generated_tokens"]
    assert sp["vllm"]["same_ids_as_run"] == 1.0
    assert not list(RunDir(p).generated.parent.glob("speed.*"))  # its resume file is removed
