"""The SGLang 0.5.22 lines the ModelRunner capture route rests on (cited in
``eagle3nb/engines/sglang_runner.py``'s docstring, where :data:`SHOWN` names 0.5.22) hold that code in
the 0.5.22 wheel, and its recipe file ``benchmark/one_batch.py`` is 0.5.23's byte for byte. Read from
the venvs (``bash bench/setup_engine_versions.sh`` installs 0.5.22, not run by CI: skipped where a
venv is absent, as tests/boundaries/test_rules_versions.py is). No engine starts."""

import pytest

from eagle3nb.engines import sglang_runner
from testkit import ENGINES_HOME, cited_texts, venv_site_packages

P = "sglang/"
# (file, first line, last line): what the runner calls or relies on there, in SGLang 0.5.22
CITED_0522 = {
    (P + "benchmark/one_batch.py", 327, 387): (
        "def load_model(",
        "model_runner.alloc_memory_pool()",
    ),
    (P + "benchmark/one_batch.py", 450, 476): (
        "def prepare_synthetic_inputs_for_latency_test(",
        "req.extend_end = len(req.origin_input_ids)",
    ),
    (P + "benchmark/one_batch.py", 496, 533): (
        "dummy_tree_cache = TreeCacheNamespace(",
        "spec_algorithm=SpeculativeAlgorithm.NONE,",
        "_maybe_prepare_mlp_sync_batch(batch, model_runner)",
        "prefill_input_ids_cpu",
    ),
    (P + "benchmark/one_batch.py", 691, 699): ("publish(", "_init_process_global_configs()"),
    (P + "srt/runtime_context.py", 95, 95): ("def spawn_world_rank(",),
    (P + "srt/runtime_context.py", 230, 230): ("class SpawnRanks(",),
    (P + "srt/runtime_context.py", 1314, 1314): ("def get_schedule()",),
    (P + "srt/runtime_context.py", 1481, 1481): ("def publish(",),
    (P + "srt/managers/schedule_batch.py", 2556, 2567): (
        "def init_new(",
        "tree_cache: BasePrefixCache,",
        "enable_overlap: bool,",
        "spec_algorithm: SpeculativeAlgorithm,",
    ),
    (P + "srt/managers/schedule_batch.py", 2407, 2407): ("prefill_input_ids_cpu",),
    (P + "srt/model_executor/forward_batch_info.py", 937, 972): (
        "def init_new(",
        "capture_hidden_mode: Optional[CaptureHiddenMode] = None,",
        "return_hidden_states_before_norm: bool,",
    ),
    (P + "srt/layers/logits_processor.py", 815, 834): (
        "def _get_hidden_states_to_store(",
        "if logits_metadata.capture_hidden_mode.is_full():",
        "hidden_states_to_store = pack_aux_hidden_states(aux_hidden_states)",
        "hidden_states_to_store = hidden_states",
    ),
    (P + "srt/models/llama.py", 922, 934): (
        "def set_eagle3_layers_to_capture(",
        "self.model.layers_to_capture = [val + 1 for val in layer_ids]",
    ),
    (P + "srt/models/llama.py", 478, 498): ("if i in self.layers_to_capture",),
    (P + "srt/distributed/parallel_state.py", 3261, 3261): ("def destroy_model_parallel(",),
    (P + "srt/distributed/parallel_state.py", 3328, 3328): (
        "def destroy_distributed_environment(",
    ),
}


def test_runner_route_lines_of_sglang_0522_hold_what_the_runner_calls():
    root = venv_site_packages("sglang-0.5.22")
    if root is None:
        pytest.skip(
            f"{ENGINES_HOME / 'sglang-0.5.22'} absent (bash bench/setup_engine_versions.sh)"
        )
    assert "0.5.22" in sglang_runner.SHOWN
    doc = sglang_runner.__doc__
    for rel, lo, hi in cited_texts(root, CITED_0522, "sglang 0.5.22"):
        cite = f":{lo}-{hi}" if lo != hi else f":{lo}"
        assert cite in doc or f"{lo}," in doc or f", {lo}" in doc, f"docstring lacks {rel}{cite}"
    # no aux API anywhere in the wheel: `auto` picks the runner (sglang_runner.has_aux_api)
    assert not any(
        "enable_return_aux_hidden_states" in f.read_text(errors="replace")
        for f in (root / "sglang/srt").rglob("*.py")
    )
    new = venv_site_packages("sglang-0.5.23")
    if new is not None:  # the recipe the docstring cites for 0.5.23, unchanged
        rel = "sglang/benchmark/one_batch.py"
        assert (root / rel).read_bytes() == (new / rel).read_bytes()
