"""SGLang hands the captured aux states to the caller as tensors, not as Python float lists.

Why: SGLang 0.5.23's scheduler stores each request's prefill hidden states as
``tensor.cpu().clone().tolist()``
(``sglang/srt/managers/scheduler_components/batch_result_processor.py``,
``_append_prefill_hidden_states``), then pickles those lists to the detokenizer and again to the
tokenizer manager (``detokenizer_manager.py:505``, ``tokenizer_manager.py:2598``), where
``meta_info["hidden_states"]`` is read. For ``[T, n_ids * H]`` float32 states that is one Python
float per value, built, pickled and unpickled twice, then turned back into a tensor by the backend:
most of SGLang's capture overhead over plain prefill on the default model (issue 16). SGLang's own
IPC already pickles tensors (pooled hidden states, ``output_streamer.py:296``), so the scheduler
can append the cloned ``[T, n_ids * H]`` tensor itself. The values are the same: ``tolist`` of a
float32 or bfloat16 tensor gives exactly its values, and the backend converts either form to
float32.

How it reaches SGLang's scheduler process: SGLang starts it with multiprocessing's ``spawn``,
which imports the parent's main module (:mod:`eagle3nb.engines.worker`) in the child as
``__mp_main__`` before the scheduler's code; the worker calls :func:`install` there when
:data:`ENV` is ``"1"`` (the SGLang backend sets it unless the user set it, so ``0`` turns this off).
Only SGLang :data:`PATCHED_VERSION` (the source read above) is patched; other versions, and every
call other than a full prefill capture with ``return_hidden_states=True``, run SGLang's own code.
The backend reports which form arrived (``info()["hidden_states_transport"]``).

Imports only stdlib at module level (the worker imports it in every SGLang child process).
"""

from __future__ import annotations

import os

__all__ = ["ENV", "PATCHED_VERSION", "install", "enabled"]

ENV = "EAGLE3NB_SGLANG_TENSOR_HIDDEN"
PATCHED_VERSION = "0.5.23"


def enabled() -> bool:
    """Whether this process (an SGLang child) should patch: :data:`ENV` is ``"1"``."""
    return os.environ.get(ENV) == "1"


def install() -> bool:
    """Patch SGLang's scheduler in this process to keep prefill hidden states as tensors.

    Returns:
        True when patched (or already), False when the installed SGLang is not
        :data:`PATCHED_VERSION` or lacks the method (SGLang's own lists then flow as before).
    """
    import sglang

    if getattr(sglang, "__version__", None) != PATCHED_VERSION:
        return False
    from sglang.srt.managers.scheduler_components import batch_result_processor as m

    owner = next(
        (
            c
            for c in vars(m).values()
            if isinstance(c, type) and "_append_prefill_hidden_states" in vars(c)
        ),
        None,
    )
    if owner is None:
        return False
    orig = owner._append_prefill_hidden_states
    if getattr(orig, "_eagle3nb_tensor", False):
        return True

    def _append_prefill_hidden_states(
        self,
        *,
        req,
        logits_output,
        hidden_state_offset: int,
        capture_hidden_mode,
        extend_input_len: int,
        store: bool = True,
    ) -> int:
        # the one case eagle3nb's capture uses: every prefill row of a request that asked for them
        if capture_hidden_mode.is_full() and store and req.return_hidden_states is True:
            end = hidden_state_offset + extend_input_len
            # clone: a view would pickle the whole batch's storage
            req.hidden_states.append(
                logits_output.hidden_states[hidden_state_offset:end].cpu().clone()
            )
            return end
        return orig(
            self,
            req=req,
            logits_output=logits_output,
            hidden_state_offset=hidden_state_offset,
            capture_hidden_mode=capture_hidden_mode,
            extend_input_len=extend_input_len,
            store=store,
        )

    _append_prefill_hidden_states._eagle3nb_tensor = True
    owner._append_prefill_hidden_states = _append_prefill_hidden_states
    return True
