"""vLLM on CUDA with CUDA graphs off (``enforce_eager``): aux id 0 is not boundary 0.

Measured on an H200 with vLLM 0.26.0 (bench/h200_2026-12-04/boundaries.json, the default target
in float32): captured at ids [0, 1, 3], id 0's slot equalled HF's boundary N (relative error
2.9e-4) with ``enforce_eager=True``, and boundary 0 exactly with CUDA graphs on; ids 1 and 3 were
right in both. It explains the layer-offset copy (ids [0, 1, 3]) served by vLLM 0.26.0 on that
GPU at tau 1.8655 against 2.9951 simulated (bench/h200_2026-12-04/default.json), where on CPU
(vLLM 0.32.0) both were 2.9666.

Why, in vLLM 0.26.0's sources: before layer 0 the residual is None, so
``_maybe_add_hidden_state`` keeps ``hidden_states`` itself, not a new tensor
(``model_executor/models/interfaces.py:1357``, called at ``models/llama.py:419``); layer 0 then
makes that same tensor its residual (``llama.py:317-318``), and every later RMSNorm with a residual
adds into it in place (``model_executor/layers/layernorm.py:88``,
``fused_add_rms_norm.maybe_inplace``) up to the final norm: the kept "boundary 0" ends as boundary
N. Compiled (CUDA graphs on), the in-place op is functionalised and the kept tensor stays boundary
0. vLLM 0.32.0 keeps the tensor the same way (``interfaces.py:1609-1610``); on CPU it measured
right, and it was not run on a GPU here.

Engine-side module: stdlib only (the vLLM backend and 04 both call it).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["id0_hazard", "refuse_id0"]

SOURCE = (
    "vllm 0.26.0 model_executor/models/interfaces.py:1357, models/llama.py:317-318 and 419, "
    "layers/layernorm.py:88; measured: bench/h200_2026-12-04/boundaries.json"
)


def id0_hazard(ids: Iterable[int], on_cuda: bool, enforce_eager: bool) -> str | None:
    """Why vLLM would not capture boundary 0 at id 0 here, or None when it would (or 0 is not
    asked for).

    Args:
        ids: vLLM aux ids (= boundaries) the engine is asked to capture or a drafter reads.
        on_cuda: the engine runs on a CUDA device. enforce_eager: ``vllm_options.enforce_eager``
            (the backend's default is True).
    """
    if not (on_cuda and enforce_eager and 0 in {int(i) for i in ids}):
        return None
    return (
        "vLLM on CUDA with enforce_eager=True captures boundary N, not boundary 0, at aux id 0: "
        "the embedding tensor it keeps is updated in place by every later fused add + RMSNorm "
        f"({SOURCE}); set vllm_options.enforce_eager: false (CUDA graphs on, which measured "
        "boundary 0), or train on boundaries above 0"
    )


def refuse_id0(ids: Iterable[int], on_cuda: bool, enforce_eager: bool, what: str) -> None:
    """Raise before an engine is built for ``what`` (capture, a drafter folder) when
    :func:`id0_hazard` says id 0 would be wrong.

    Raises:
        ValueError: naming ``what``, the ids, the reason and the fix.
    """
    why = id0_hazard(ids, on_cuda, enforce_eager)
    if why:
        raise ValueError(f"{what} asks vLLM for aux ids {sorted(set(map(int, ids)))}: {why}")
