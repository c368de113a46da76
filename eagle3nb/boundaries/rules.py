"""Each engine's layer-id rule, keyed by (engine, engine version, target architecture class).

The same id names different boundaries in different engines, in different versions of one engine,
and (SGLang) in different model files of one version. This table holds, per key, how ids map to
boundaries (boundary b = the residual stream entering decoder layer b, HF ``hidden_states[b]``;
boundary N = the last layer's output before the final norm), which boundaries the engine can capture
or be served, and refusals with their reason. A key the table lacks is never assumed: it is refused
with a message saying how to measure the rule (:func:`engine_rule`).

Read in the installed engine sources (``~/.cache/eagle3nb/engines/*/lib/python3.11/site-packages``)
and measured on tiny random-weight models (``../shared/reference/architectures.md``):

SGLang 0.5.23 (``sglang/srt/...``); explicit ids become ``layers_to_capture`` in each model's
``set_eagle3_layers_to_capture``, captured in the layer loop *before* layer i for i in that list; the
capture-only mode refuses ids >= N (``model_runner_components/spec_aux_hidden_state.py:113-130``)
and negative or duplicate ids (``arg_groups/validation_hook.py``):

- ``models/llama.py:929-941`` (Llama; Mistral ``mistral.py:33`` and Llama-4 text ``llama4.py:546``
  subclass it), ``qwen2.py:781-794``, ``qwen3.py:778-791``, ``glm4_moe.py:1269-1281``,
  ``minimax_m2.py:1067-1080``: ``[val + 1 for val in layer_ids]`` -> id L = boundary L+1; the final
  norm captures nothing (``llama.py:497-499``), so boundaries 1..N-1.
- ``qwen3_moe.py:1128-1143`` the same +1, but ``qwen2_moe.py:1153-1156`` sets a flag on
  ``self.layers[id]``: boundary N (layer index N) raises ``IndexError`` at engine start.
- ``deepseek_v2.py:3458-3473`` (DeepSeek-V3, and Kimi-K2.5 through ``kimi_k25.py:928-941``):
  ``if layer_ids and layer_ids[0] == 1: [val + 1 ...] else: list(layer_ids)`` -> +1 **only when the
  first id is 1**, otherwise ids are boundaries (measured: ids [0..4] -> b0..b4, [1..4] -> b2..b5).
- ``gpt_oss.py:1337-1352``: unshifted if ``max(layer_ids) == num_layers`` else +1; the final norm
  captures at ``end_layer`` (``gpt_oss.py:722-739``), so id N-1 (or N) gives boundary N.
- ``gemma3_causal.py:634-672`` (rule ``917-926``; wrapper ``gemma3_mm.py:543-545``) appends the
  previous layer's MLP-branch output without the residual: refused (sglang PR #39286).
- ``mixtral.py:341`` (``MixtralForCausalLM``, also eagle3nb's MoE copy of a Llama) has no
  ``set_eagle3_layers_to_capture``: ``model_runner_components/attention_backend_setup.py:55-61``
  raises, so capture and EAGLE-3 serving are refused (plain generation runs).

vLLM 0.32.0 (``vllm/...``): ``model_executor/models/interfaces.py:1601-1611``
``_maybe_add_hidden_state`` appends ``hidden_states + residual`` before the loop (index
``start_layer``) and after each layer (index idx+1) -> id L = boundary L, 0..N (``llama.py:427-441``
also Mistral and ``Llama4ForCausalLM`` ``llama4.py:708``; ``qwen2.py:422-433``, Qwen3 ``qwen3.py:280``;
``qwen3_moe.py:505-515``; ``gpt_oss.py:527-533``; ``minimax_m2.py:403-410``). DeepSeek
(``deepseek_v2.py:1545-1568``, end ``1586-1587``; Kimi-K2.5 ``kimi_k25.py:291``) adds
``hidden_states + residual`` before layer idx with ``residual = None`` at layer 0 (``1525``): id 0
raises ``TypeError``. GLM-4.5 (``glm4_moe.py:534``) and Gemma-3 (``gemma3.py:367``,
``gemma3_mm.py:500``) and Mixtral (``mixtral.py:375``) lack ``SupportsEagle3``:
``v1/worker/gpu_model_runner.py:5234-5238`` raises (plain generation runs).

vLLM 0.26.0 and SGLang 0.5.17 (the GPU host's engines): the same rule per class as 0.32.0 and
0.5.23, read in their own sources at their own lines (:data:`eagle3nb.boundaries.vllm_0_26_0.VLLM_0260`,
:data:`eagle3nb.boundaries.sglang_0_5_17.SGLANG_0517`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from eagle3nb.boundaries.cpu_limits import (  # re-exported: the CPU refusals preflight reads
    CPU_CONFIG_LIMITS,
    CPU_LIMITS,
    cpu_config_limit,
    cpu_limit,
)
from eagle3nb.boundaries.sglang_0_5_17 import SGLANG_0517
from eagle3nb.boundaries.vllm_0_26_0 import VLLM_0260

__all__ = [
    "EngineRule",
    "RULES",
    "CPU_LIMITS",
    "cpu_limit",
    "cpu_config_limit",
    "CPU_CONFIG_LIMITS",
    "engine_rule",
    "known_versions",
    "MEASURE_HOWTO",
]

MEASURE_HOWTO = (
    "measure it: build a tiny random-weight model of this class from its config (as "
    "tests/target/tiny_archs.py does), capture it through that engine version at a few ids (e.g. "
    "eagle3nb.engines.<engine>_backend Backend.capture), name every slot by the HF boundary it "
    "equals (eagle3nb.boundaries.alignment; adjacent boundaries differ by >= 0.45 relative), read the "
    "model file's set_eagle3_layers_to_capture in the installed engine, then add the rule to RULES "
    "in eagle3nb/boundaries/rules.py"
)


@dataclass(frozen=True)
class EngineRule:
    """How one engine version names the boundaries of one architecture class.

    Attributes:
        engine, version, arch: the key (``"sglang"`` / ``"vllm"``, the package version, the HF class).
        kind: ``"plus1"`` (id L = boundary L+1), ``"same"`` (id L = boundary L), ``"first_id_1"``
            (SGLang DeepSeek: +1 only when the first id is 1, else id = boundary), ``"unless_n"``
            (SGLang gpt-oss: id = boundary when the ids include N, else +1), or ``"refused"``.
        lo, hi_below_n: lowest boundary, and how far below N the highest lies (0: N itself).
        refused: why this combination is refused (None where it is supported).
        source: the installed engine's file and lines the rule was read from.
        limit: why the capturable range stops where it does.
    """

    engine: str
    version: str
    arch: str
    kind: str
    lo: int
    hi_below_n: int
    source: str
    refused: Optional[str] = None
    limit: str = ""  # why the range stops where it does (named in range errors)

    def _name(self) -> str:
        return f"{self.engine} {self.version} on {self.arch}"

    def _check(self, n_layers: int) -> None:
        if self.refused:
            raise ValueError(f"{self._name()} is refused: {self.refused} ({self.source})")
        if not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(
                f"n_layers={n_layers!r}: must be the target's num_hidden_layers (>= 1)"
            )

    def _in_range(self, bs: Sequence[int], n: int, what: str) -> list[int]:
        lo, hi = self.lo, n - self.hi_below_n
        bad = [b for b in bs if not lo <= b <= hi]
        if bad:
            raise ValueError(
                f"{what}: {self._name()} captures boundaries {lo}..{hi} of a {n}-layer target, not "
                f"{bad} ({self.limit or 'its capture range'}; {self.source}); pick boundaries in "
                "that range"
            )
        return list(bs)

    def ids_to_boundaries(self, ids: Sequence[int], n_layers: int) -> list[int]:
        """Boundaries this engine captures (or feeds a drafter) for explicit ``ids``, in id order.

        Raises:
            ValueError: refused combination, empty or negative ids, or a boundary outside the range
                this engine captures for this class (naming the rule and its source).
        """
        self._check(n_layers)
        ids = [int(i) for i in ids]
        if not ids or min(ids) < 0:
            raise ValueError(f"ids={ids}: {self._name()} needs non-negative layer ids")
        shift = {
            "plus1": 1,
            "same": 0,
            "first_id_1": 1 if ids[0] == 1 else 0,
            "unless_n": 0 if max(ids) == n_layers else 1,
        }[self.kind]
        return self._in_range([i + shift for i in ids], n_layers, f"ids={ids}")

    def boundaries_to_ids(self, boundaries: Sequence[int], n_layers: int) -> list[int]:
        """Ids to give this engine so that it captures ``boundaries`` (increasing, as a run's are).

        Raises:
            ValueError: refused combination, a boundary outside the capturable range, or boundaries
                the rule cannot name (SGLang DeepSeek: a first boundary of 1, since first id 1 means
                boundary 2 and first id 0 boundary 0; SGLang gpt-oss: boundary 0 without N).
        """
        self._check(n_layers)
        bs = self._in_range(
            [int(b) for b in boundaries], n_layers, f"boundaries={list(boundaries)}"
        )
        if self.kind == "same":
            ids = bs
        elif self.kind == "plus1":
            ids = [b - 1 for b in bs]
        elif self.kind == "first_id_1":
            ids = bs  # first id != 1 -> unshifted
            if bs and bs[0] == 1:
                raise ValueError(
                    f"boundaries={bs}: {self._name()} cannot capture a first boundary of 1 (first "
                    f"id 1 is shifted to boundary 2, any other first id is unshifted; "
                    f"{self.source}); start at boundary 0 or >= 2"
                )
        else:  # unless_n: +1 names boundaries 1..N (id N-1 -> N); unshifted only with N included
            ids = [b - 1 for b in bs] if min(bs) >= 1 else bs
            if min(bs) == 0 and n_layers not in bs:
                raise ValueError(
                    f"boundaries={bs}: {self._name()} names boundary 0 only when the ids include "
                    f"N={n_layers} ({self.source}); drop boundary 0 or add boundary {n_layers}"
                )
        assert self.ids_to_boundaries(ids, n_layers) == bs  # the table's own round trip
        return ids

    def default_boundaries(self, n_layers: int) -> list[int]:
        """Boundaries the engine uses when a drafter config names no ids: ``[2, N//2, N-3]``
        stored unshifted in SGLang (``llama.py:934-936``), ``(2, N//2, N-3)`` as vLLM ids
        (``interfaces.py:1712-1733``): boundaries 2, N//2, N-3 in both."""
        self._check(n_layers)
        return [2, n_layers // 2, n_layers - 3]


def _rules() -> dict[tuple[str, str, str], EngineRule]:
    sg, vl = "sglang/srt/models/", "vllm/model_executor/models/"
    gemma_sg = (
        "it captures each layer's MLP-branch output without the residual (0.7-1.7 relative from "
        "every boundary; upstream sglang PR #39286, open); vLLM 0.32 has no EAGLE-3 support for "
        "Gemma-3 either, so set extract_engine: hf"
    )
    no_eagle3 = (
        "the model class does not implement SupportsEagle3, so capture and EAGLE-3 serving raise "
        "'Model does not support EAGLE3 interface' (vllm/v1/worker/gpu_model_runner.py:5234-5238); "
        "turn vllm_extract off and leave vllm out of eval_engines, or serve with SGLang"
    )
    mixtral_sg = (  # its plain generation also takes head_dim = hidden / heads (mixtral.py:151)
        "no set_eagle3_layers_to_capture in models/mixtral.py: capture and EAGLE-3 serving raise "
        "(model_runner_components/attention_backend_setup.py:55-61); set extract_engine: hf, and "
        "generate_engine hf or vllm when the config sets its own head_dim (eagle3nb's MoE copy)"
    )
    mixtral_vl = (
        "no SupportsEagle3: capture and EAGLE-3 serving raise 'Model does not support EAGLE3 "
        "interface' (v1/worker/gpu_model_runner.py:5234-5238); turn vllm_extract off and leave vllm out of eval_engines"
    )
    no_n = "the final norm captures nothing, so boundary N never comes back"
    moe_n = "boundary N (layer index N) raises IndexError at engine start, qwen2_moe.py:1156"
    ds_n = "ids must lie below N (spec_aux_hidden_state.py:113-130) and layer N has no capture"
    ds0 = "id 0 raises TypeError: residual is None before layer 0 (deepseek_v2.py:1525, 1562)"
    sglang = {
        "LlamaForCausalLM": ("plus1", 1, 1, sg + "llama.py:929-941", no_n),
        "MistralForCausalLM": ("plus1", 1, 1, sg + "mistral.py:33 -> llama.py:929-941", no_n),
        "Qwen2ForCausalLM": ("plus1", 1, 1, sg + "qwen2.py:781-794", no_n),
        "Qwen3ForCausalLM": ("plus1", 1, 1, sg + "qwen3.py:778-791", no_n),
        "Qwen3MoeForCausalLM": (
            "plus1",
            1,
            1,
            sg + "qwen3_moe.py:1128-1143, qwen2_moe.py:1153-1156",
            moe_n,
        ),
        "Glm4MoeForCausalLM": ("plus1", 1, 1, sg + "glm4_moe.py:1269-1281", no_n),
        "Llama4ForCausalLM": ("plus1", 1, 1, sg + "llama4.py:546 -> llama.py:929-941", no_n),
        "MiniMaxM2ForCausalLM": ("plus1", 1, 1, sg + "minimax_m2.py:1067-1080", no_n),
        "DeepseekV3ForCausalLM": ("first_id_1", 0, 1, sg + "deepseek_v2.py:3458-3473", ds_n),
        "Kimi_K25ForConditionalGeneration": (
            "first_id_1",
            0,
            1,
            sg + "kimi_k25.py:928-941 -> deepseek_v2.py:3458-3473",
            ds_n,
        ),
        "GptOssForCausalLM": ("unless_n", 0, 0, sg + "gpt_oss.py:1337-1352, 722-739", ""),
        "MixtralForCausalLM": ("refused", 0, 0, sg + "mixtral.py:341", mixtral_sg),
        "Gemma3ForCausalLM": ("refused", 0, 0, sg + "gemma3_causal.py:634-672, 917-926", ""),
        "Gemma3ForConditionalGeneration": (
            "refused",
            0,
            0,
            sg + "gemma3_mm.py:543-545 -> gemma3_causal.py:634-672",
            "",
        ),
    }
    ds = vl + "deepseek_v2.py:1525, 1545-1568, 1586-1587"
    vllm = {
        "LlamaForCausalLM": ("same", 0, 0, vl + "llama.py:427-441", ""),
        "MistralForCausalLM": ("same", 0, 0, vl + "mistral.py:236 -> llama.py:427-441", ""),
        "Qwen2ForCausalLM": ("same", 0, 0, vl + "qwen2.py:422-433", ""),
        "Qwen3ForCausalLM": ("same", 0, 0, vl + "qwen3.py:280 -> qwen2.py:422-433", ""),
        "Qwen3MoeForCausalLM": ("same", 0, 0, vl + "qwen3_moe.py:505-515", ""),
        "GptOssForCausalLM": ("same", 0, 0, vl + "gpt_oss.py:527-533", ""),
        "Llama4ForCausalLM": ("same", 0, 0, vl + "llama4.py:708 -> llama.py:427-441", ""),
        "MiniMaxM2ForCausalLM": ("same", 0, 0, vl + "minimax_m2.py:403-410", ""),
        "DeepseekV3ForCausalLM": ("same", 1, 0, ds, ds0),
        "Kimi_K25ForConditionalGeneration": ("same", 1, 0, vl + "kimi_k25.py:291 -> " + ds, ds0),
        "Glm4MoeForCausalLM": ("refused", 0, 0, vl + "glm4_moe.py:534", ""),
        "MixtralForCausalLM": ("refused", 0, 0, vl + "mixtral.py:375", mixtral_vl),
        "Gemma3ForCausalLM": ("refused", 0, 0, vl + "gemma3.py:367", ""),
        "Gemma3ForConditionalGeneration": ("refused", 0, 0, vl + "gemma3_mm.py:500", ""),
    }
    out = {}
    tables = (("sglang", "0.5.23", sglang), ("vllm", "0.32.0", vllm), ("vllm", "0.26.0", VLLM_0260),
              ("sglang", "0.5.17", SGLANG_0517))  # fmt: skip
    for engine, version, table in tables:
        for arch, (kind, lo, hi_below, src, limit) in table.items():
            why = None
            if kind == "refused":  # a refused row's last field, when set, is its own reason
                why = limit or (gemma_sg if engine == "sglang" else no_eagle3)
                limit = ""
            key = (engine, version, arch)
            out[key] = EngineRule(engine, version, arch, kind, lo, hi_below, src, why, limit)
    return out


RULES: dict[tuple[str, str, str], EngineRule] = _rules()


def known_versions(engine: str) -> list[str]:
    """Versions of ``engine`` the table holds rules for."""
    return sorted({v for e, v, _ in RULES if e == engine})


def engine_rule(engine: str, version: str, arch: str) -> EngineRule:
    """The rule of ``engine`` at ``version`` for architecture class ``arch``.

    ``version`` may carry a local suffix (``0.32.0+cpu``), which is ignored. A refused combination is
    returned (its methods raise with the reason), so callers can show it in a support matrix.

    Raises:
        ValueError: an engine, version or class the table does not hold, naming what it holds and
            how to measure the missing rule (:data:`MEASURE_HOWTO`); never assumed from a neighbour.
    """
    v = str(version).split("+")[0]
    rule = RULES.get((engine, v, arch))
    if rule is None:
        versions = known_versions(engine)
        archs = sorted({a for e, vv, a in RULES if e == engine and vv == v})
        what = (
            f"engine={engine!r} is unknown (known: sglang, vllm)"
            if not versions
            else f"{engine} {version} is not in the table (known versions: {versions})"
            if not archs
            else f"{engine} {version} has no rule for {arch} (known classes: {archs})"
        )
        raise ValueError(f"{what}; the layer-id rule is never assumed, {MEASURE_HOWTO}")
    return rule
