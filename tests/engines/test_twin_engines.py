"""Real engines (vLLM 0.32.0, SGLang 0.5.23, each in its venv) capturing every target class they run
on this CPU, on a tiny random twin built from that class's full-size config (transformers' defaults
are the real models' sizes; 6 layers; DeepSeek with YaRN and its 576-wide MLA latent head):

- each captured slot equals the HF boundary the engine_rules table declares for its id (float32
  relative Frobenius error <= 1e-5; vLLM gpt-oss within its stated tolerance, bf16-level kernels);
- the twin proof (eagle3nb.engines.twin_check) names the same boundaries and agrees with the table;
- one-by-one capture equals batched.

One engine worker per engine (only one alive at a time); per class one engine build inside it
(``capture_model`` keeps the twin's engine between calls), shared by that class's tests. The
classes an engine does not run here are refused by preflight: tests/test_cpu_refusals.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from testkit import requires_engine, sglang_ctx
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
from eagle3nb.engines.pool import open_engine
from eagle3nb.engines.sglang_helpers import start_sglang
from eagle3nb.engines.twin_check import ENGINE_TOLERANCE, TWIN_ENGINE_OPTIONS, twin_proof
from eagle3nb.target import models
from eagle3nb.target.capture import reference_states
from eagle3nb.boundaries.rules import engine_rule

sys.path.insert(0, str(Path(__file__).parents[1] / "target"))
from test_twin import YARN, _full  # noqa: E402

STORIES = models.resolve_model("stories260K-hd32")
VERSION = {"vllm": "0.32.0", "sglang": "0.5.23"}
IDS = {"vllm": [0, 2, 4, 6], "sglang": [0, 2, 4]}  # 6-layer twins; vLLM DeepSeek: no id 0
CLASSES = {
    "vllm": [
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "GptOssForCausalLM",
        "Llama4ForCausalLM",
    ],  # DeepSeek-V3 (on CPU_MLA, eagle3nb asks for it): tests/engines/test_vllm_cpu_mla.py
    "sglang": [
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Glm4MoeForCausalLM",
    ],
}
CASES = [pytest.param((e, a), marks=requires_engine(e)) for e in CLASSES for a in CLASSES[e]]
SAMPLES = [[1, 400, 300, 20, 55, 66, 301, 17, 9], [1, 5, 6, 7], [1, 33, 260, 261, 262, 263, 264]]
F32_TOL = 1e-5


def _ids(engine: str, arch: str) -> list[int]:
    return [1, 2, 4, 6] if (engine, arch) == ("vllm", "DeepseekV3ForCausalLM") else IDS[engine]


class _OneEngine:
    """At most one engine worker alive (this machine is shared): switching engines closes the other."""

    def __init__(self, root: Path):
        self.root, self.engine, self.client = root, None, None

    def get(self, engine: str):
        if self.engine != engine:
            self.close()
            if engine == "vllm":
                self.client = open_engine(
                    "vllm", STORIES, "float32", python=DEFAULT_ENGINE_PYTHONS["vllm"],
                    param="vllm_python", workdir_parent=self.root,
                )  # fmt: skip
            else:
                self.client = start_sglang(
                    STORIES, "float32", "cpu", 0, None, self.root, sglang_ctx(STORIES)
                )
            self.engine = engine
        return self.client

    def close(self):
        if self.client is not None:
            self.client.close()
        self.engine, self.client = None, None


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    e = _OneEngine(tmp_path_factory.mktemp("engines"))
    yield e
    e.close()


def _full_folder(root: Path, arch: str) -> Path:
    cfg = _full(arch)
    text = cfg.get("text_config") or cfg
    text["num_hidden_layers"] = 6  # the twin keeps the target's layer count up to 12
    if text.get("model_type") == "deepseek_v3":  # as DeepSeek-V3 ships (transformers: neither)
        text.update(rope_scaling=dict(YARN), topk_method="noaux_tc", scoring_func="sigmoid")
    if text.get("model_type") == "glm4_moe":  # as GLM-4.5(-Air) ships (transformers: no head_dim)
        text.update(head_dim=128, partial_rotary_factor=0.5)
    d = root / arch
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(STORIES / f, d / f)
    return d


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def case(request, engines, tmp_path_factory):
    """One engine build per (engine, class): the twin proof, then the same engine's batched and
    one-by-one captures of SAMPLES, and the HF reference of the twin."""
    engine, arch = request.param
    client = engines.get(engine)
    opts = TWIN_ENGINE_OPTIONS[engine]
    root = tmp_path_factory.mktemp(f"{engine}-{arch}")
    full = _full_folder(root, arch)
    twin_dir = root / "twin"
    ids = _ids(engine, arch)

    def capture(path, samples, i):
        return client.capture_model(path, samples, i, opts)

    rec = twin_proof(capture, engine, VERSION[engine], full, ids, "float32", twin_dir)
    batched = capture(str(twin_dir), SAMPLES, ids)
    single = [capture(str(twin_dir), [s], ids)[0] for s in SAMPLES]
    model = models.load_target(twin_dir, "float32")[0]
    refs = [reference_states(model, s) for s in SAMPLES]
    declared = engine_rule(engine, VERSION[engine], arch).ids_to_boundaries(ids, 6)
    print(f"\n{engine} {arch}: twin proof {rec['seconds']} s, {rec['verdict']}")
    return dict(
        engine=engine, arch=arch, ids=ids, rec=rec, batched=batched, single=single, refs=refs,
        declared=declared, H=rec["twin"]["hidden_size"],
        tol=ENGINE_TOLERANCE.get((engine, arch), F32_TOL),
    )  # fmt: skip


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_each_slot_equals_the_declared_hf_boundary(case):
    H, tol = case["H"], case["tol"]
    for got, ref in zip(case["batched"], case["refs"]):
        assert got["aux"].shape == (ref[0].shape[0], len(case["ids"]) * H)
        for k, b in enumerate(case["declared"]):
            err = _rel(got["aux"][:, k * H : (k + 1) * H], ref[b])
            assert err <= tol, f"{case['engine']} {case['arch']} id {case['ids'][k]} vs b{b}: {err}"
        if "final" in got:  # vLLM: boundary N from the engine too
            assert _rel(got["final"], ref[6]) <= tol


def test_twin_proof_names_the_same_boundaries(case):
    rec = case["rec"]
    assert rec["measured"] == case["declared"] == rec["table"], rec["verdict"]
    assert rec["agrees"] and rec["verdict"].startswith("agrees")
    assert rec["twin_ids"] == case["ids"] and rec["separation"] >= 4 * rec["tolerance"]


def test_one_by_one_equals_batched(case):
    for b, s in zip(case["batched"], case["single"]):
        assert _rel(b["aux"], s["aux"]) <= case["tol"]


@pytest.mark.parametrize("engine", [pytest.param(e, marks=requires_engine(e)) for e in CLASSES])
def test_twin_proof_on_the_default_target(engines, engine, tmp_path):
    """What 02a/02b add to a run on the embedded default: its seconds (build, engine capture in
    the running worker, HF reference), with the run's default boundaries [1, 2, 4]."""
    client = engines.get(engine)
    ids = {"vllm": [1, 2, 4], "sglang": [0, 1, 3]}[engine]

    def capture(path, samples, i):
        return client.capture_model(path, samples, i, TWIN_ENGINE_OPTIONS[engine])

    rec = twin_proof(capture, engine, VERSION[engine], STORIES, ids, "float32", tmp_path / "twin")
    print(f"\n{engine} twin proof on stories260K-hd32: {rec['seconds']} s; {rec['verdict']}")
    assert rec["agrees"] and rec["target_boundaries"] == [1, 2, 4]
    assert rec["seconds"]["total"] < 300
