"""05_drift with vLLM serving quantized variants on CPU (compressed-tensors w8a8 and w4a16 written
by eagle3nb), in bfloat16 (vLLM 0.32's AMX int8 kernel takes bfloat16/half activations only:
in float32 it raises "int8_scaled_mm_with_quant: expect A to be bfloat16 or half"): vLLM loads them with its own CPU kernels (named from its log), their logits differ
from float32 HF by a measured amount, vLLM's EAGLE-3 serving on them gives its own plain greedy
output, and its counters agree with the matrix cell measured from vLLM's own captured states."""

import json
from pathlib import Path

import pytest

from testkit import requires_engine
from eagle3nb.params import RunParams
from eagle3nb.steps.drift.step import drift_matrix_step
from eagle3nb.steps.generate.step import generate_step

pytestmark = requires_engine("vllm")
REF, W8, W4 = "hf:float32:none", "vllm:bfloat16:w8a8", "vllm:bfloat16:w4a16"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs")
    # threads 1: the kernel and the vLLM worker take turns on a shared 2-core machine
    common = dict(outputs_dir=str(out), run_name="drift", max_train_prompts=8, threads=1)
    generate_step(RunParams(**common, max_new_tokens=16), progress=False)
    p = RunParams(
        **common,
        drift_sources=["hf:float32", W8, W4],
        drift_seeds=[0],
        drift_train_steps=20,
        max_eval_prompts=2,
        eval_max_new_tokens=16,
    )
    return p, drift_matrix_step(p, progress=False)


def test_vllm_runs_each_format_with_its_cpu_kernel(run):
    _, out = run
    src = {s["key"]: s for s in out["sources"]}
    assert src[W8]["engine"]["name"] == "vllm" and src[W8]["engine"]["version"] == "0.32.0"
    assert any("Int8ScaledMM" in k for k in src[W8]["engine"]["linear_kernels"])
    assert any("WNA16" in k for k in src[W4]["engine"]["linear_kernels"])
    assert all(
        n.split(".")[-2] == "mlp" for n in src[W4]["quantization"]["ignored"] if n != "lm_head"
    )


def test_logits_drift_is_measured(run):
    _, out = run
    for key in (W8, W4):
        lg = out["drift"][key]["logits"]
        assert 1e-4 < lg["relative_error"] < 0.2 and lg["top1_agreement"] > 0.8, (key, lg)


def test_vllm_serving_matches_its_plain_greedy_and_the_matrix(run):
    p, out = run
    m = out["matrix"]
    for key in (W8, W4):
        ch = out["checks"][key]
        assert ch["served_by"] == "vllm" and set(ch["drafters"]) == {REF, key}
        for dk, r in ch["drafters"].items():
            assert r["greedy_mismatches_vs_own_plain"] == 0, (key, dk)
            cell = m["tau_seeds"][m["rows"].index(dk)][m["cols"].index(key)][0]
            # vLLM's counters vs the states-based cell: same drafter, same target, its own
            # states from one prefill capture instead of its verify forwards
            assert abs(r["tau"] - cell) <= 0.1, (key, dk, r["tau"], cell)
    metrics = json.loads((Path(p.outputs_dir) / "drift" / "metrics.json").read_text())
    assert metrics["drift_matrix"]["checks"][W8]["served_by"] == "vllm"
