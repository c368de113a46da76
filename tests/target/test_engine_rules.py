"""The layer-id rule per (engine, engine version, architecture class): hand-written tables of ids ->
boundaries for 6-layer targets, as measured on tiny random-weight models and read in the installed
engine sources (``../shared/reference/architectures.md`` sections 3 and 4); refusals name the class,
engine, version and reason; a version or class the table lacks is refused with how to measure it."""

import pytest

from eagle3nb.target.engine_rules import RULES, engine_rule, known_versions
from eagle3nb.target.models import SUPPORTED_ARCHS

N = 6
SG, VL = ("sglang", "0.5.23"), ("vllm", "0.32.0")
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
    + [(SG, "MixtralForCausalLM", r"no set_eagle3_layers_to_capture.*extract_engine: hf")],
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


def test_cited_source_lines_exist_in_the_installed_engines():
    """Each cited file exists in the installed engine and each cited line range lies inside it and
    names the capture (a changed engine install shows up here first)."""
    import re
    from pathlib import Path

    from testkit import engine_site_packages

    roots = {e: engine_site_packages(e) for e in ("sglang", "vllm")}
    if not all(roots.values()):
        pytest.skip(f"engine venvs absent: {roots} (bash .ci/setup_engines.sh)")
    words = (
        "set_eagle3_layers_to_capture",
        "_maybe_add_hidden_state",
        "aux_hidden_state",
        "layers_to_capture",
        "class ",
        "residual",
    )
    for rule in RULES.values():
        models_dir = Path(rule.source.split(":")[0]).parent
        for f, nums in re.findall(r"([\w/]+\.py):(\d+(?:-\d+)?(?:, \d+(?:-\d+)?)*)", rule.source):
            path = roots[rule.engine] / (f if "/" in f else models_dir / f)
            lines = path.read_text().splitlines()
            for rng in filter(None, (x.strip() for x in nums.split(","))):
                lo, _, hi = rng.partition("-")
                lo, hi = int(lo), int(hi or lo)
                assert hi <= len(lines), f"{rule.source}: {path} has {len(lines)} lines"
                text = "\n".join(lines[lo - 1 : hi])
                assert any(w in text for w in words), f"{rule.source}: {path}:{rng} = {text!r}"
