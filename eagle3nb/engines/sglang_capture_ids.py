"""Which layers a loaded SGLang model captures, set between forwards (the runner route,
:mod:`eagle3nb.engines.sglang_runner`) so that each forward captures what a fresh load of the same
model with those ids would: one model load serves every id set (the twin measurement's probes).

SGLang sets the captured layers once per engine: the model runner's start calls the model's
``set_eagle3_layers_to_capture(ids)`` (0.5.23 ``srt/model_executor/model_runner_components/
attention_backend_setup.py:40-61``). Calling it again on a loaded model is not a fresh load for
every class (read in 0.5.23 and 0.5.22):

- Llama, Mistral, Qwen2, Qwen3, GLM-4-MoE (0.5.23 ``models/llama.py:929-941``,
  ``qwen2.py:781-794``, ``qwen3.py:778-791``, ``glm4_moe.py:1269-1281``) replace
  ``model.layers_to_capture`` and set ``capture_aux_hidden_states``: a re-set is complete.
- Qwen2-MoE and Qwen3-MoE (``qwen3_moe.py:1128-1143`` -> ``qwen2_moe.py:1153-1156``; 0.5.22
  ``qwen2_moe.py:1160-1163``) set a flag ``_is_layer_to_capture`` on each named layer and never
  clear it, and the forward reads the flag (``qwen2_moe.py:1195-1202``): every earlier set's
  layers would still be captured.
- the capture-only engine's two refusals are made at its start, not by the setter: ids >= N at
  the model runner's init (0.5.23 ``model_runner_components/spec_aux_hidden_state.py:84-130``,
  ``_check_capture_layer_ids_in_range``) and, at the first forward, the logits processor's count
  of the captured states (``layers/logits_processor.py:505-514`` sets ``expected_aux_hidden_states``
  at init, ``:920-951`` raises). The runner's ``ServerArgs`` name no ids, so neither is armed.
  0.5.22 has neither (its refusals come from the model code, or :func:`check_aux_width`).

:func:`set_capture` puts the model back into its state after a load (capture off, empty lists,
no layer flag set), runs SGLang's own range check where the version has it, calls the model's
own setter, and arms the logits processor's own count for this set: a set SGLang's capture-only
engine refuses raises SGLang's own error here, in this process, and the next set starts clean.
``tests/engines/test_measured_rules.py`` shows a set captured after re-sets equal, bit for bit,
to the same set on a fresh load (float32, CPU).

Engine side: stdlib only at module level; SGLang is imported inside :func:`set_capture`.
"""

from __future__ import annotations

__all__ = ["reset_capture", "set_capture"]


def _decoders(model) -> list:
    """The inner decoder module(s) holding ``layers`` and ``layers_to_capture``."""
    found = (getattr(model, "model", None), getattr(model, "language_model", None))
    return [m for m in found if m is not None]


def reset_capture(model) -> None:
    """Capture off, as after a load: ``capture_aux_hidden_states`` False on the model and its
    decoder, ``layers_to_capture`` empty, every layer's ``_is_layer_to_capture`` False (absent
    after a load in ``qwen2_moe.py``, False from init in 0.5.22's ``lfm2.py:441``; the forward
    reads either as False)."""
    model.capture_aux_hidden_states = False
    for inner in _decoders(model):
        if hasattr(inner, "layers_to_capture"):
            inner.layers_to_capture = []
        if hasattr(inner, "capture_aux_hidden_states"):
            inner.capture_aux_hidden_states = False
        for layer in getattr(inner, "layers", None) or []:
            if hasattr(layer, "_is_layer_to_capture"):
                layer._is_layer_to_capture = False


def set_capture(model, model_config, ids) -> None:
    """Make the next forward of the loaded SGLang ``model`` capture SGLang ids ``ids`` as a fresh
    capture-only engine with those ids would (module docstring); ``ids`` None: capture off.

    Args:
        model: the runner's model (``ModelRunner.model``). model_config: ``ModelRunner.model_config``.
        ids: SGLang layer ids (boundary = id + 1 for the +1 classes), or None.

    Raises:
        ValueError: SGLang's own range check (0.5.23: ``--return-aux-hidden-state-layer-ids [..]
            out of range for a target with N layers``), before any forward.
        Exception: whatever the model's own setter raises (Qwen-MoE, layer index N:
            ``IndexError``). At the forward, SGLang's logits processor raises its own
            ``ValueError`` (``The model captured k aux hidden states, but ... names n layers``)
            where fewer states came back than ids were asked.
    """
    reset_capture(model)
    lp = getattr(model, "logits_processor", None)
    armed = lp is not None and hasattr(lp, "_check_aux_hidden_states")
    if armed:  # SGLang's own count off for a plain pass (it is None unless ids were named)
        lp.expected_aux_hidden_states, lp._aux_hidden_states_checked = None, False
    if ids is None:
        return
    ids = [int(i) for i in ids]
    try:  # 0.5.23; absent before (0.5.22 has no capture-only mode)
        from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
            _check_capture_layer_ids_in_range as in_range,
        )
    except ImportError:
        in_range = None
    if in_range is not None:
        in_range(ids, model_config)
    model.set_eagle3_layers_to_capture(ids)
    if armed:
        lp.expected_aux_hidden_states = len(ids)
