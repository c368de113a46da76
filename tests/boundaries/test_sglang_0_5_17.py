"""SGLang 0.5.17's rules (eagle3nb/boundaries/versions/sglang_0_5_17.py) against its wheel: every range a
rule cites holds the code the rule rests on (read inside the PyPI wheel in the offline bundle's
cache; skipped where it was not downloaded: ``python -m eagle3nb.offline build --engine sglang``),
and the ids map to the boundaries 0.5.23's rows give (the bodies are identical, the reference's 2d)."""

import re
import zipfile

import pytest

from eagle3nb.boundaries.rules import RULES, engine_rule
from eagle3nb.offline.bundle import CACHE

WHEELS = sorted((CACHE / "wheels").glob("sglang-0.5.17-*.whl"))
M = "sglang/srt/models/"
PLUS1 = ("def set_eagle3_layers_to_capture", "[val + 1 for val in layer_ids]")
SNIPPETS = {
    (M + "llama.py", 885, 897): PLUS1,
    (M + "llama.py", 434, 437): ("if i in self.layers_to_capture:", "hidden_states + residual"),
    (M + "mistral.py", 30, 30): ("class MistralForCausalLM(LlamaForCausalLM)",),
    (M + "llama4.py", 556, 556): ("class Llama4ForCausalLM(LlamaForCausalLM)",),
    (M + "qwen2.py", 747, 760): PLUS1,
    (M + "qwen3.py", 688, 701): PLUS1,
    (M + "qwen3_moe.py", 1073, 1088): ("def set_eagle3_layers_to_capture", "val + 1"),
    (M + "qwen2_moe.py", 891, 894): ('setattr(self.layers[layer_id], "_is_layer_to_capture"',),
    (M + "glm4_moe.py", 1446, 1458): PLUS1,
    (M + "minimax_m2.py", 1254, 1267): PLUS1,
    (M + "deepseek_v2.py", 3134, 3149): ("if layer_ids and layer_ids[0] == 1:", "list(layer_ids)"),
    (M + "kimi_k25.py", 920, 931): ("self.language_model.set_eagle3_layers_to_capture(layer_ids)",),
    (M + "gpt_oss.py", 1328, 1343): ("max(layer_ids) == num_layers", "list(layer_ids)"),
    (M + "gpt_oss.py", 726, 737): (
        "if self.start_layer in self.layers_to_capture:",
        "if i + 1 in self.layers_to_capture:",
    ),  # fmt: skip
    (M + "mixtral.py", 338, 338): ("class MixtralForCausalLM(nn.Module)",),
    (M + "gemma3_causal.py", 636, 676): ("aux_hidden_states.append(hidden_states)",),
    (M + "gemma3_causal.py", 920, 929): PLUS1,
    (M + "gemma3_mm.py", 498, 500): ("self.language_model.set_eagle3_layers_to_capture",),
}
REASONS = {
    (M + "llama.py", 454, 454): ("hidden_states, _ = self.norm(hidden_states, residual)",),
    (M + "deepseek_v2.py", 2804, 2826): ("aux_hidden_states if i in self.layers_to_capture",),
    ("sglang/srt/model_executor/model_runner_components/attention_backend_setup.py", 53, 54): (
        "model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)",
    ),
}


CITE = re.compile(r"([\w/]+\.py):(\d+(?:-\d+)?(?:, \d+(?:-\d+)?)*)")


def _cited(source: str):
    """``(path in the wheel, lo, hi)`` per range a rule's source cites (as tests/boundaries/test_rules.py)."""
    base = source.split(":")[0].rsplit("/", 1)[0]
    for f, nums in CITE.findall(source):
        for rng in filter(None, (x.strip() for x in nums.split(","))):
            lo, _, hi = rng.partition("-")
            yield (f if "/" in f else f"{base}/{f}"), int(lo), int(hi or lo)


@pytest.mark.skipif(not WHEELS, reason="sglang 0.5.17 wheel not in the offline cache")
def test_cited_ranges_hold_the_code():
    rules = [r for r in RULES.values() if (r.engine, r.version) == ("sglang", "0.5.17")]
    cited = {c for r in rules for c in _cited(r.source)}
    assert cited == set(SNIPPETS), cited ^ set(SNIPPETS)
    with zipfile.ZipFile(WHEELS[0]) as z:
        for (rel, lo, hi), snippets in {**SNIPPETS, **REASONS}.items():
            text = "\n".join(z.read(rel).decode().splitlines()[lo - 1 : hi])
            for snip in snippets:
                assert snip in text, f"{rel}:{lo}-{hi} lacks {snip!r}"


@pytest.mark.parametrize("arch", sorted({a for e, v, a in RULES if (e, v) == ("sglang", "0.5.23")}))
def test_ids_map_as_0523(arch):
    old, new = engine_rule("sglang", "0.5.17", arch), engine_rule("sglang", "0.5.23", arch)
    assert old.kind == new.kind
    if old.kind != "refused":
        for n in (8, 12):
            ids = [0, 1, n // 2 - 1, n - 3] if old.kind != "first_id_1" else [1, 2, n - 3]
            assert old.ids_to_boundaries(ids, n) == new.ids_to_boundaries(ids, n)
