"""The layer-id rule per (engine, engine version, architecture class): hand-written tables of ids ->
boundaries for 6-layer targets, as measured on tiny random-weight models and read in the installed
engine sources (``../shared/reference/architectures.md`` sections 3 and 4); refusals name the class,
engine, version and reason; a version or class the table lacks is refused with how to measure it."""

import re
from pathlib import Path

import pytest

from testkit import VLLM_026_SRC, cited_range, cited_texts, requires_engine
from eagle3nb.boundaries.rules import RULES, engine_rule, known_versions
from eagle3nb.target.models import SUPPORTED_ARCHS

N = 6
SG, VL, VL26 = ("sglang", "0.5.23"), ("vllm", "0.32.0"), ("vllm", "0.26.0")
PLUS1_SG = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Glm4MoeForCausalLM",
    "Llama4ForCausalLM",
    "MiniMaxM2ForCausalLM",
]
DEEPSEEK = ["DeepseekV3ForCausalLM", "Kimi_K25ForConditionalGeneration"]
SAME_VL = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "GptOssForCausalLM",
    "Llama4ForCausalLM",
    "MiniMaxM2ForCausalLM",
]
GEMMA = ["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"]

# (engine, classes, ids, boundaries): what the engine captures for those ids on N=6
IDS_TO_BOUNDARIES = [
    (SG, PLUS1_SG, [0, 1, 2, 3, 4], [1, 2, 3, 4, 5]),  # measured: id L -> b L+1
    (SG, PLUS1_SG, [0, 2, 3], [1, 3, 4]),
    (SG, DEEPSEEK, [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]),  # first id 0: ids are boundaries
    (SG, DEEPSEEK, [1, 2, 3, 4], [2, 3, 4, 5]),  # first id 1: +1
    (SG, DEEPSEEK, [5], [5]),
    (SG, DEEPSEEK, [2, 3, 4], [2, 3, 4]),  # first id 2: unshifted
    (SG, ["GptOssForCausalLM"], [0, 2, 5], [1, 3, 6]),  # +1; id N-1 -> boundary N (final norm)
    (SG, ["GptOssForCausalLM"], [0, 3, 6], [0, 3, 6]),  # ids include N: unshifted
    (SG, ["GptOssForCausalLM"], [1, 6], [1, 6]),
    (VL, SAME_VL, [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6]),  # id L -> b L, 0..N
    (VL, DEEPSEEK, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]),
    (VL26, SAME_VL, [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6]),  # read: id L -> b L, 0..N
    (VL26, DEEPSEEK, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]),
]
# (engine, classes, boundaries, ids the export must write)
BOUNDARIES_TO_IDS = [
    (SG, PLUS1_SG, [1, 3, 5], [0, 2, 4]),
    (SG, DEEPSEEK, [2, 3, 5], [2, 3, 5]),
    (SG, DEEPSEEK, [0, 2, 4], [0, 2, 4]),
    (SG, ["GptOssForCausalLM"], [1, 3, 6], [0, 2, 5]),
    (SG, ["GptOssForCausalLM"], [0, 3, 6], [0, 3, 6]),
    (VL, SAME_VL, [0, 3, 6], [0, 3, 6]),
    (VL, DEEPSEEK, [1, 3, 6], [1, 3, 6]),
    (VL26, SAME_VL, [0, 3, 6], [0, 3, 6]),
    (VL26, DEEPSEEK, [1, 3, 6], [1, 3, 6]),
]
# (engine, classes, boundaries, message): boundaries the engine cannot capture for that class
BAD_BOUNDARIES = [
    (SG, PLUS1_SG, [1, 3, 6], r"captures boundaries 1\.\.5 of a 6-layer target, not \[6\]"),
    (SG, ["Qwen3MoeForCausalLM"], [2, 6], r"IndexError at engine start"),
    (SG, PLUS1_SG, [0, 3], r"not \[0\]"),
    (SG, DEEPSEEK, [1, 2, 4], r"cannot capture a first boundary of 1"),
    (SG, DEEPSEEK, [2, 6], r"not \[6\].*ids must lie below N"),
    (SG, ["GptOssForCausalLM"], [0, 3], r"names boundary 0 only when the ids include N=6"),
    (VL, DEEPSEEK, [0, 3], r"not \[0\] \(id 0 raises TypeError"),
    (VL26, DEEPSEEK, [0, 3], r"not \[0\] \(id 0 raises TypeError.*deepseek_v2\.py:1430, 1469"),
]


def _cases(table):
    return [(e, a, x, y) for e, archs, x, y in table for a in archs]


@pytest.mark.parametrize("engine,arch,ids,bnds", _cases(IDS_TO_BOUNDARIES))
def test_ids_to_boundaries(engine, arch, ids, bnds):
    assert engine_rule(*engine, arch).ids_to_boundaries(ids, N) == bnds


@pytest.mark.parametrize("engine,arch,bnds,ids", _cases(BOUNDARIES_TO_IDS))
def test_boundaries_to_ids(engine, arch, bnds, ids):
    assert engine_rule(*engine, arch).boundaries_to_ids(bnds, N) == ids


@pytest.mark.parametrize("engine,arch,bnds,msg", _cases(BAD_BOUNDARIES))
def test_uncapturable_boundaries_are_refused(engine, arch, bnds, msg):
    with pytest.raises(ValueError, match=msg):
        engine_rule(*engine, arch).boundaries_to_ids(bnds, N)


def test_same_id_names_different_boundaries_by_first_id():
    r = engine_rule(*SG, "DeepseekV3ForCausalLM")
    assert r.ids_to_boundaries([1, 3], N)[1] == 4 and r.ids_to_boundaries([0, 3], N)[1] == 3


@pytest.mark.parametrize(
    "engine,arch,msg",
    [(SG, a, r"MLP-branch output without the residual.*PR #39286") for a in GEMMA]
    + [(VL, a, r"SupportsEagle3.*gpu_model_runner\.py:5234") for a in GEMMA]
    + [(VL, "Glm4MoeForCausalLM", r"SupportsEagle3")]
    + [(VL, "MixtralForCausalLM", r"SupportsEagle3.*gpu_model_runner\.py:5234")]
    + [(SG, "MixtralForCausalLM", r"no set_eagle3_layers_to_capture.*extract_engine: hf")]
    + [
        (VL26, a, r"SupportsEagle3.*gpu_model_runner\.py:5428-5432 in vLLM 0\.26\.0")
        for a in GEMMA + ["Glm4MoeForCausalLM", "MixtralForCausalLM"]
    ],
)
def test_refused_combinations_name_engine_version_class_and_reason(engine, arch, msg):
    rule = engine_rule(*engine, arch)
    full = rf"{engine[0]} {engine[1]} on {arch} is refused: .*{msg}"
    with pytest.raises(ValueError, match=full):
        rule.ids_to_boundaries([1, 2], N)
    with pytest.raises(ValueError, match=full):
        rule.boundaries_to_ids([1, 2], N)


def test_unknown_version_or_class_is_refused_with_how_to_measure():
    with pytest.raises(
        ValueError, match=r"sglang 0\.5\.24 is not in the table .*'0\.5\.23'.*measure it"
    ):
        engine_rule("sglang", "0.5.24", "LlamaForCausalLM")
    with pytest.raises(
        ValueError, match=r"vllm 0\.32\.0 has no rule for FooForCausalLM.*measure it"
    ):
        engine_rule("vllm", "0.32.0", "FooForCausalLM")
    with pytest.raises(ValueError, match=r"engine='tgi' is unknown"):
        engine_rule("tgi", "1.0", "LlamaForCausalLM")
    assert engine_rule("vllm", "0.32.0+cpu", "LlamaForCausalLM").kind == "same"


def test_every_supported_class_has_a_rule_in_every_known_version():
    for engine in ("sglang", "vllm"):
        for v in known_versions(engine):
            assert {a for e, vv, a in RULES if (e, vv) == (engine, v)} == SUPPORTED_ARCHS


def test_defaults_are_boundaries_2_half_n_minus_3():
    assert engine_rule(*SG, "DeepseekV3ForCausalLM").default_boundaries(32) == [2, 16, 29]
    assert engine_rule(*VL, "LlamaForCausalLM").default_boundaries(61) == [2, 30, 58]


def test_every_rule_cites_an_installed_source_line():
    for rule in RULES.values():
        assert rule.source.startswith(("sglang/srt/models/", "vllm/model_executor/models/"))
        assert any(ch.isdigit() for ch in rule.source)


CITE = re.compile(r"([\w/]+\.py):(\d+(?:-\d+)?(?:, \d+(?:-\d+)?)*)")


def _cited_ranges(source: str):
    """``(file relative to site-packages, lo, hi)`` for each range a rule's source cites."""
    models_dir = Path(source.split(":")[0]).parent
    for f, nums in CITE.findall(source):
        for rng in filter(None, (x.strip() for x in nums.split(","))):
            lo, _, hi = rng.partition("-")
            yield (f if "/" in f else str(models_dir / f)), int(lo), int(hi or lo)


@requires_engine("vllm")
@requires_engine("sglang")
def test_cited_source_lines_exist_in_the_installed_engines():
    """Each cited file exists in the engine's sources (installed venv, or vLLM 0.26.0's sdist files)
    and each cited line range lies inside it and names the capture (a changed engine install shows
    up here first)."""
    from testkit import engine_site_packages

    roots = {
        ("sglang", "0.5.23"): engine_site_packages("sglang"),
        ("vllm", "0.32.0"): engine_site_packages("vllm"),
        ("vllm", "0.26.0"): VLLM_026_SRC if (VLLM_026_SRC / ".ready").is_file() else None,
    }
    if not all(roots.values()):
        pytest.skip(f"engine sources absent: {roots} (bash .ci/setup_engines.sh)")
    # SGLang 0.5.17 is read in its wheel, not installed: tests/boundaries/test_sglang_0_5_17.py;
    # the versions beyond these three have their own venvs, outside CI: test_rules_versions.py
    extra = {("sglang", "0.5.17"), ("vllm", "0.31.0"), ("sglang", "0.5.22")}
    assert {(e, v) for e, v, _ in RULES} == set(roots) | extra
    words = (
        "set_eagle3_layers_to_capture",
        "_maybe_add_hidden_state",
        "aux_hidden_state",
        "layers_to_capture",
        "class ",
        "residual",
        "architectures=",
    )
    for rule in (r for r in RULES.values() if (r.engine, r.version) in roots):
        for rel, lo, hi in _cited_ranges(rule.source):
            text = cited_range(roots[(rule.engine, rule.version)], rel, lo, hi)
            assert any(w in text for w in words), f"{rule.source}: {rel}:{lo}-{hi} = {text!r}"


M = "vllm/model_executor/models/"
SAME = ("_maybe_add_hidden_state(", "+ 1, hidden_states, residual")
NO_EAGLE3 = ("nn.Module",)  # the class line: its bases, checked below to lack SupportsEagle3
# vLLM 0.26.0: each range its rules cite -> what that range must hold for the rule to be true
VLLM_026_SNIPPETS = {
    (M + "llama.py", 419, 428): (*SAME, "[], 0, hidden_states", "for idx, layer in enumerate("),
    (M + "mistral.py", 230, 230): ("class MistralForCausalLM(LlamaForCausalLM)",),
    (M + "llama4.py", 709, 709): ("class Llama4ForCausalLM(LlamaForCausalLM",),
    (M + "qwen2.py", 415, 422): (*SAME, "[], 0, hidden_states", "for idx, layer in enumerate("),
    (M + "qwen3.py", 264, 264): ("class Qwen3Model(Qwen2Model)",),
    (M + "qwen3_moe.py", 503, 515): (
        "[], self.start_layer, hidden_states",
        "aux_hidden_states, layer_idx + 1, hidden_states, residual",
    ),
    (M + "gpt_oss.py", 349, 355): ("[], self.start_layer, x", "aux_hidden_states, i + 1, x"),
    (M + "minimax_m2.py", 397, 405): (*SAME, "[], 0, hidden_states"),
    (M + "deepseek_v2.py", 1430, 1430): ("residual = None",),
    (M + "deepseek_v2.py", 1450, 1475): (
        "if idx in self.aux_hidden_state_layers:",
        "aux_hidden_state = hidden_states + residual",
    ),
    (M + "deepseek_v2.py", 1495, 1496): (
        "if self.end_layer in self.aux_hidden_state_layers:",
        "aux_hidden_states.append(hidden_states + residual)",
    ),
    (M + "kimi_k25.py", 290, 297): ("class KimiK25ForConditionalGeneration(", "SupportsEagle3,"),
    (M + "kimi_k25.py", 371, 375): ('architectures=["DeepseekV2ForCausalLM"]',),
    (M + "glm4_moe.py", 528, 528): ("class Glm4MoeForCausalLM(", *NO_EAGLE3),
    (M + "mixtral.py", 376, 376): ("class MixtralForCausalLM(", *NO_EAGLE3),
    (M + "gemma3.py", 380, 380): ("class Gemma3ForCausalLM(", *NO_EAGLE3),
    (M + "gemma3_mm.py", 470, 472): ("class Gemma3ForConditionalGeneration(", *NO_EAGLE3),
}
# ranges cited in reasons (not in a rule's source field)
VLLM_026_REASONS = {
    ("vllm/v1/worker/gpu_model_runner.py", 5428, 5432): (
        "if not supports_eagle3(self.get_model()):",
        "Model does not support EAGLE3 interface",
    ),
    (M + "deepseek_v2.py", 1469, 1469): ("aux_hidden_state = hidden_states + residual",),
    (M + "interfaces.py", 1343, 1359): (
        "class EagleModelMixin:",
        "def _maybe_add_hidden_state(",
        "value = hidden_states + residual if residual is not None else hidden_states",
    ),
}


def test_vllm_026_cited_lines_hold_the_code_each_rule_claims():
    """Every range vLLM 0.26.0's rules cite holds the code the rule rests on: the capture call with
    index 0 before the loop and idx+1 after each layer (id L = boundary L), DeepSeek's capture before
    layer idx with residual None at layer 0, and classes refused for lacking SupportsEagle3."""
    if not (VLLM_026_SRC / ".ready").is_file():
        pytest.skip(
            f"{VLLM_026_SRC} absent (bash .ci/setup_engines.sh fetches vLLM 0.26.0's sdist)"
        )
    rules = [r for r in RULES.values() if (r.engine, r.version) == VL26]
    cited = {c for r in rules for c in _cited_ranges(r.source)}
    assert cited == set(VLLM_026_SNIPPETS), cited ^ set(VLLM_026_SNIPPETS)
    reasons = " ".join(r.refused or r.limit for r in rules)
    assert "gpu_model_runner.py:5428-5432" in reasons and "deepseek_v2.py:1430, 1469" in reasons
    holds = {**VLLM_026_SNIPPETS, **VLLM_026_REASONS}
    for (rel, lo, hi), text in cited_texts(VLLM_026_SRC, holds, "vllm 0.26.0").items():
        if holds[rel, lo, hi][-1:] == NO_EAGLE3:
            assert "SupportsEagle3" not in text, f"{rel}:{lo}-{hi} implements SupportsEagle3"
    for r in rules:  # a refused class is refused for lacking SupportsEagle3, a served one has it
        assert (r.kind == "refused") == ("SupportsEagle3" in (r.refused or "")), r.arch
