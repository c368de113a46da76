"""An engine imported into the notebook's process (``vllm_python: ""`` / ``sglang_python: ""``, a
GPU box) must leave the trainer's process settings as they were: :func:`keep_compile_threads`.

Notebook side; imports torch only.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["keep_compile_threads"]

_KEY = "TORCHINDUCTOR_COMPILE_THREADS"


@contextlib.contextmanager
def keep_compile_threads():
    """Around an engine's import and start in this process: this process keeps its torch.compile
    threads.

    ``import vllm`` sets ``TORCHINDUCTOR_COMPILE_THREADS=1`` for its own worker processes
    (``vllm/env_override.py``, read in 0.26.0 and 0.32.0; vLLM issues 10480 and 10619), and
    inductor reads it when its config is first imported (``torch/_inductor/config.py``
    ``decide_compile_threads``): 03 training on CUDA beside an in-process vLLM would compile its
    kernels one at a time. So inductor's config is imported first (its thread count taken from this
    host) and the variable is put back as it was when the block ends.
    """
    import torch._inductor.config  # noqa: F401 (fixes compile_threads before the engine imports)

    old = os.environ.get(_KEY)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_KEY, None)
        else:
            os.environ[_KEY] = old
