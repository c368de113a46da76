"""Engine side: SGLang's CUDA kernel limits and the torch-ops patch (SGLang 0.5.17).

SGLang's CUDA ``SiluAndMul`` takes its JIT kernel only for MLP widths that are a multiple of 16
bytes / element size and otherwise sgl-kernel's ``silu_and_mul``, which faulted on the tiny target's
width 172 (:func:`mlp_width_problem`); sgl-kernel's rmsnorm takes no float32. Both are avoided by
building the model with torch ops: SGLang's ``MultiPlatformOp`` picks its forward once, in
``__init__`` (``srt/layers/utils/multi_platform.py:36-38``, dispatch ``:109-135``, 0.5.17), so while
:func:`native_ops` is entered every op built takes ``forward_native``; :func:`install_native_ops`
does it for the life of SGLang's scheduler process (the Engine route: serving). Shown on an H100
with 0.5.17 (``../shared/reference/gpu_engines_h200.md``); gated on :data:`NATIVE_OPS_SHOWN`.
Imports stdlib at module level, sglang inside the functions.
"""

from __future__ import annotations

import contextlib
import json
import os

__all__ = [
    "NATIVE_OPS_SHOWN",
    "NATIVE_ENV",
    "mlp_width_problem",
    "native_ops",
    "install_native_ops",
]

NATIVE_OPS_SHOWN = ("0.5.17",)  # where the torch-ops patch ran (H100, 2026-12-06)


def mlp_width_problem(
    model_path: str, dtype: str, device: str, native: bool, version: str | None = None
) -> str | None:
    """Why SGLang's CUDA kernels would fail on this target, or None.

    float32 on CUDA with SGLang 0.5.17 (``version``): sgl-kernel's rmsnorm "failed to dispatch data
    type Float" (``../shared/reference/gpu_engines_h200.md``; other versions not known, not refused).

    SGLang routes ``SiluAndMul`` to its JIT kernel when the width is a multiple of 16 bytes /
    element size (8 in bf16/fp16, 4 in float32) and to sgl-kernel's AOT ``silu_and_mul`` otherwise
    (``srt/layers/activation.py:77-99``, 0.5.17), which faulted with "misaligned address" on the
    tiny target's width 172 (reported by cuBLAS as CUBLAS_STATUS_INTERNAL_ERROR at the next GEMM;
    ``../shared/reference/gpu_engines_h200.md``). CPU or torch ops (``native``): None.
    """
    if device == "cpu" or native:
        return None
    if dtype == "float32" and version in NATIVE_OPS_SHOWN:
        return (
            f"dtype=float32 on CUDA: SGLang {version}'s sgl-kernel rmsnorm takes bfloat16 and "
            "float16 only; set sglang_options.native_ops: true (torch ops) or use bfloat16"
        )
    with open(os.path.join(model_path, "config.json")) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg) if "intermediate_size" not in cfg else cfg
    width = cfg.get("intermediate_size")
    vec = 16 // (4 if dtype == "float32" else 2)
    if isinstance(width, int) and width % vec:
        return (
            f"{model_path}: MLP width intermediate_size={width} is not a multiple of {vec}, so "
            f"SGLang's CUDA SiluAndMul falls back to sgl-kernel's silu_and_mul, which faults on it "
            "(srt/layers/activation.py:77-99). Serve the function-preserving padded copy "
            "(eagle3nb.target.pad_mlp.write_padded_copy), or set sglang_options.native_ops: true "
            "(torch ops, SGLang 0.5.17)"
        )
    return None


NATIVE_ENV = (
    "EAGLE3NB_SGLANG_NATIVE_OPS"  # "1": SGLang's scheduler builds its models with torch ops
)


def install_native_ops() -> None:
    """In SGLang's scheduler process (``eagle3nb.engines.worker`` as ``__mp_main__``), before its
    models are built: every ``MultiPlatformOp`` takes ``forward_native`` for the process's life
    (the Engine route of :func:`native_ops`; the backend sets :data:`NATIVE_ENV`).

    Raises:
        RuntimeError: an SGLang version not in :data:`NATIVE_OPS_SHOWN`.
    """
    import sglang

    native_ops(sglang.__version__).__enter__()  # never left: the scheduler's models stay native


@contextlib.contextmanager
def native_ops(version: str):
    """While inside, every SGLang ``MultiPlatformOp`` built takes ``forward_native``
    (``srt/layers/utils/multi_platform.py:36-38``: the forward is picked once in ``__init__``).

    Raises:
        RuntimeError: from :func:`check_native`.
    """
    check_native(version)
    from sglang.srt.layers.utils.multi_platform import MultiPlatformOp

    old = MultiPlatformOp.dispatch_forward
    MultiPlatformOp.dispatch_forward = lambda self: self.forward_native
    try:
        yield
    finally:
        MultiPlatformOp.dispatch_forward = old


def check_native(version: str) -> None:
    """Refuse the torch-ops patch on an SGLang version it was not shown on.

    Raises:
        RuntimeError: ``version`` not in :data:`NATIVE_OPS_SHOWN` (0.5.23 replaced the class by
            ``sglang.kernels.fused_op.BaseFusedOp``, which has no ``dispatch_forward``).
    """
    if version not in NATIVE_OPS_SHOWN:
        raise RuntimeError(
            f"sglang_options.native_ops: the torch-ops patch relies on MultiPlatformOp."
            f"dispatch_forward of SGLang {', '.join(NATIVE_OPS_SHOWN)} (srt/layers/utils/"
            f"multi_platform.py:109-135); SGLang {version} has another op class. Leave native_ops "
            "off (on CUDA serve a padded copy: eagle3nb.target.pad_mlp)"
        )
