"""SGLang serves an EAGLE-3 drafter on CPU (SGLang 0.5.23 and 0.5.22): torch stand-ins for the
CUDA-only kernel ops of its chain-drafting path, and the install that puts them (and
:mod:`sglang_spec_attn`'s attention pieces) in place, only where they are missing.

Why: the PyPI ``sglang-kernel`` wheel SGLang installs (0.4.10 for 0.5.23, 0.4.9 for 0.5.22) is a
CUDA build with no ``*_cpu`` op (``hasattr(torch.ops.sgl_kernel, name)`` is False after ``import
sgl_kernel``), yet with any speculative algorithm SGLang's CPU path calls them
(``../shared/reference/sglang_cpu_serving.md``). The Python wrappers in ``sgl_kernel/speculative.py``
and ``sgl_kernel/kvcacheio.py`` look the op up in ``torch.ops.sgl_kernel`` at call time, so an op
registered there under the same schema is what SGLang runs. :data:`OPS` lists the stand-ins
(:mod:`sglang_spec_ops`) in the order the chain path calls them; each version's schemas, wrappers
and calling lines are :mod:`sglang_spec_versions`' tables (the same ops and schemas in both
versions, called from other files). Not reached with ``speculative_eagle_topk = 1``:
``fill_accept_out_cache_loc_cpu`` (topk > 1), ``build_draft_decode_metadata_cpu`` (the AMX
backend), ``rotate_input_ids_cpu`` (multi-layer EAGLE).

Where it runs: in SGLang's scheduler child (the process that runs the model). The backend sets
:data:`ENV` to ``"1"`` before it starts a speculative engine; the worker module, imported as
``__mp_main__`` in every SGLang child, calls :func:`hook_scheduler`, which wraps SGLang's
``run_scheduler_process`` so that, at the scheduler's start, :data:`ENV` is read (from the
environment the parent had then: :mod:`sglang_forkserver`'s children restore it before their
target runs) and :func:`install` runs with the scheduler's own ``server_args``. Gated on the SGLang
:data:`VERSIONS`, device cpu and ``speculative_eagle_topk == 1``; anything else is refused by name.
On GPU nothing is patched. Imports only stdlib (and its sibling engine-side modules) at module
level; torch and SGLang inside functions.
"""

from __future__ import annotations

import os
import sys

from eagle3nb.engines import sglang_spec_ops
from eagle3nb.engines.sglang_spec_versions import VERSIONS, table

__all__ = [
    "ENV",
    "VERSIONS",
    "OPS",
    "check",
    "install",
    "register_ops",
    "enabled",
    "hook_scheduler",
]

ENV = "EAGLE3NB_SGLANG_SPEC_CPU"
LATEST = VERSIONS[-1]  # the schemas register_ops defines when no version is named

# name -> stand-in, in the order the chain path calls them (schemas: sglang_spec_versions.TABLES)
OPS = {name: getattr(sglang_spec_ops, name) for name in sglang_spec_ops.__all__}
_LIBS: dict = {}  # namespace -> torch.library.Library (kept alive: dropping it unregisters)


def register_ops(namespace: str = "sgl_kernel", version: str = LATEST) -> list[str]:
    """Register each :data:`OPS` stand-in as ``torch.ops.<namespace>.<name>`` (CPU) under SGLang
    ``version``'s schema (:func:`sglang_spec_versions.table`) where no op of that name exists; for
    ``sgl_kernel``, ``import sgl_kernel`` first (it registers its own).

    Returns:
        The names registered now (an op already there, SGLang's own or an earlier call's, is kept).

    Raises:
        RuntimeError: ``version`` has no table (before anything is registered).
    """
    import torch

    sites = table(version)
    if namespace == "sgl_kernel":
        import sgl_kernel  # noqa: F401  (its ops first: a real CPU build keeps its own)
    space = getattr(torch.ops, namespace)
    missing = [name for name in OPS if not hasattr(space, name)]
    if missing:
        lib = _LIBS.setdefault(namespace, torch.library.Library(namespace, "FRAGMENT"))
        for name in missing:
            lib.define(f"{name}({sites[name].schema}) -> ()")
            lib.impl(name, OPS[name], "CPU")
    return missing


def check(version: str, device: str, topk: int) -> None:
    """Refuse, by name, what the stand-ins were not written for.

    Raises:
        RuntimeError: ``version`` is not one of :data:`VERSIONS` (the ops' schemas, their callers
            and the patched methods are read from those sources, :mod:`sglang_spec_versions`), or
            ``device`` is not ``cpu`` (GPUs have SGLang's own kernels: nothing is patched there).
        ValueError: ``topk`` is not 1 (tree drafting would need the tree mask in the verify
            attention and ``fill_accept_out_cache_loc_cpu``).
    """
    table(version)
    if str(device) != "cpu":
        raise RuntimeError(
            f"device={device!r}: the CPU speculative stand-ins are for device cpu only; on a GPU "
            "SGLang's own kernels serve the drafter and nothing is patched"
        )
    if int(topk) != 1:
        raise ValueError(
            f"speculative_eagle_topk={topk}: the CPU stand-ins serve chain drafting only "
            "(topk 1: the verify attention is causal); use speculative_eagle_topk=1"
        )


def install(version: str, device: str, topk: int) -> dict:
    """:func:`check`, then register the missing ops under ``version``'s schemas
    (:func:`register_ops`) and patch SGLang's
    ``torch_native`` attention for speculative decoding (:func:`sglang_spec_attn.install`), in
    this process. Idempotent.

    Returns:
        ``{"ops": names registered now, "attention": what was patched now}``.
    """
    check(version, device, topk)
    from eagle3nb.engines import sglang_spec_attn

    return {"ops": register_ops(version=version), "attention": sglang_spec_attn.install()}


def enabled() -> bool:
    """Whether this process's environment asks for the stand-ins (:data:`ENV` is ``"1"``)."""
    return os.environ.get(ENV) == "1"


def hook_scheduler() -> bool:
    """Wrap ``sglang.srt.managers.scheduler.run_scheduler_process`` in this process (an SGLang
    child, before it unpickles its target, which pickle resolves by name) so that the scheduler
    runs :func:`install` with its own ``server_args`` first when :data:`ENV` is ``"1"`` at its
    start. Imports the scheduler module only when it is already imported (the forkserver's
    children) or :data:`ENV` is set now (spawned children).

    Returns:
        True when the hook is in place.
    """
    name = "sglang.srt.managers.scheduler"
    if name not in sys.modules and not enabled():
        return False
    import importlib

    mod = importlib.import_module(name)
    orig = mod.run_scheduler_process
    if getattr(orig, "_eagle3nb_spec_cpu", False):
        return True

    def run_scheduler_process(server_args, *args, **kwargs):
        if enabled():
            import sglang

            install(sglang.__version__, server_args.device, server_args.speculative_eagle_topk)
        return orig(server_args, *args, **kwargs)

    run_scheduler_process._eagle3nb_spec_cpu = True
    mod.run_scheduler_process = run_scheduler_process
    return True
