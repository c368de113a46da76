"""SGLang's ``torch_native`` attention backend made to run chain EAGLE-3 (topk 1) on CPU (SGLang
0.5.23 and 0.5.22: ``srt/layers/attention/torch_native_backend.py`` is the same file in both, and
``DraftBackendFactory._create_backend`` has the same signature at the same line; the lines each
version's patched methods sit at are :data:`eagle3nb.engines.sglang_spec_versions.PATCHED`).

Two gaps (``../shared/reference/sglang_cpu_serving.md``), filled by :func:`install`, which
:func:`eagle3nb.engines.sglang_spec_cpu.install` calls after its version, device and topk gate:

1. ``DraftBackendFactory`` (``sglang/srt/speculative/draft_utils.py``) builds the draft worker's
   multi-step decode backend and its draft-extend backend from maps with no ``torch_native``
   entry (``ValueError: EAGLE is not supported in decode attention backend torch_native``); CPU
   runs use ``torch_native`` because ``intel_amx`` needs a CPU build of ``sgl_kernel``. The patched
   ``_create_backend`` adds ``torch_native``: for the decode map a multi-step backend of
   ``speculative_num_steps - 1`` stock ``TorchNativeAttnBackend`` s whose step i attends to
   ``seq_lens + i + 1`` keys of the request's own ``req_to_token`` row (the draft tokens' slots
   follow the verified ones there; the same derivation as ``IntelAMXMultiStepDraftBackend.
   init_forward_metadata``, ``srt/layers/attention/intel_amx_backend.py``); for the extend map a
   stock ``TorchNativeAttnBackend`` (a draft-extend batch carries its extend lengths).
2. ``TorchNativeAttnBackend.forward_extend`` (``srt/layers/attention/torch_native_backend.py``)
   reads ``extend_prefix_lens`` / ``extend_seq_lens``, which a TARGET_VERIFY batch does not carry
   (its ``seq_lens`` is the length before the drafts). For TARGET_VERIFY the patched method runs
   SGLang's own ``forward_extend`` on a view of the batch with prefix ``seq_lens``, extend
   ``draft_token_num`` and total ``seq_lens + draft_token_num`` (as ``IntelAMXAttnBackend.
   _build_extend_metadata`` derives them). Its attention is causal, which for a chain (topk 1) is
   exactly the tree mask; a tree (topk > 1) is refused.

Imports only stdlib at module level; SGLang and torch inside functions (engine side).
"""

from __future__ import annotations

__all__ = ["install", "VerifyView", "multi_step_backend"]

_CLASSES: dict = {}


class VerifyView:
    """A TARGET_VERIFY ``ForwardBatch`` seen as an extend batch: ``extend_prefix_lens`` =
    ``seq_lens`` (the verified length), ``extend_seq_lens`` = ``draft_token_num`` each,
    ``seq_lens`` = their sum; every other attribute is the batch's own.

    Args:
        forward_batch: SGLang ``ForwardBatch`` in TARGET_VERIFY mode; ``spec_info.draft_token_num``
            drafts per request (bonus token included), ``seq_lens`` int ``[bs]``.
    """

    def __init__(self, forward_batch):
        import torch

        n = int(forward_batch.spec_info.draft_token_num)
        self._batch = forward_batch
        self.extend_prefix_lens = forward_batch.seq_lens
        self.extend_seq_lens = torch.full_like(forward_batch.seq_lens, n)
        self.seq_lens = forward_batch.seq_lens + n

    def __getattr__(self, name):
        return getattr(self._batch, name)


def _classes() -> dict:
    """The two backend classes, built once SGLang is importable (they subclass its backend)."""
    if _CLASSES:
        return _CLASSES
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    class TorchNativeDraftStepBackend(TorchNativeAttnBackend):
        """One draft step: SGLang's decode attention over ``step_seq_lens`` keys per request
        (set by the multi-step backend) instead of the batch's verified ``seq_lens``."""

        step_seq_lens = None

        def _run_sdpa_forward_decode(
            self, query, output, k_cache, v_cache, rtt, rpi, seq_lens, *a, **kw
        ):
            lens = seq_lens if self.step_seq_lens is None else self.step_seq_lens
            return super()._run_sdpa_forward_decode(
                query, output, k_cache, v_cache, rtt, rpi, lens, *a, **kw
            )

    class TorchNativeMultiStepDraftBackend:
        """``speculative_num_steps - 1`` step backends for chain drafting (topk 1); step i's
        query (the draft token written at slot ``seq_lens + i``) attends to ``seq_lens + i + 1``
        keys. Mirrors ``IntelAMXMultiStepDraftBackend`` (``intel_amx_backend.py``).

        Raises:
            ValueError: ``topk`` is not 1. NotImplementedError: a sliding-window KV pool.
        """

        def __init__(self, model_runner, topk: int, speculative_num_steps: int):
            if int(topk) != 1:
                raise ValueError(
                    f"speculative_eagle_topk={topk}: eagle3nb's torch_native draft backend "
                    "serves chains only (topk 1)"
                )
            self.topk, self.speculative_num_steps = 1, int(speculative_num_steps)
            self.attn_backends = [
                TorchNativeDraftStepBackend(model_runner)
                for _ in range(self.speculative_num_steps - 1)
            ]
            if self.attn_backends and self.attn_backends[0].use_sliding_window_kv_pool:
                raise NotImplementedError("sliding-window KV pools: not in the CPU draft backend")

        def init_forward_metadata(self, forward_batch) -> None:
            for i, backend in enumerate(self.attn_backends):
                backend.swa_out_cache_loc = None
                backend.step_seq_lens = forward_batch.seq_lens + i + 1

    _CLASSES.update(
        step=TorchNativeDraftStepBackend,
        multi=TorchNativeMultiStepDraftBackend,
        base=TorchNativeAttnBackend,
    )
    return _CLASSES


def multi_step_backend(model_runner, topk: int, speculative_num_steps: int):
    """A ``TorchNativeMultiStepDraftBackend`` (see :func:`_classes`) for ``model_runner``."""
    return _classes()["multi"](model_runner, topk, speculative_num_steps)


def install() -> list[str]:
    """Patch ``DraftBackendFactory._create_backend`` and ``TorchNativeAttnBackend.forward_extend``
    in this process (see the module docstring). Idempotent.

    Returns:
        The qualified names patched now ([] when already patched).
    """
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    base = _classes()["base"]
    done = []
    create = DraftBackendFactory._create_backend
    if not getattr(create, "_eagle3nb", False):

        def _create_backend(self, backend_name, backend_map, error_template, stamps_children=False):
            if "torch_native" not in backend_map:
                runner = self.draft_model_runner
                if stamps_children:  # the decode map: one backend per draft step

                    def make():
                        return "torch_native", multi_step_backend(
                            runner, self.topk, self.speculative_num_steps
                        )
                else:  # the draft-extend map

                    def make():
                        return "torch_native", base(runner)

                backend_map = dict(backend_map, torch_native=make)
            return create(self, backend_name, backend_map, error_template, stamps_children)

        _create_backend._eagle3nb = True
        DraftBackendFactory._create_backend = _create_backend
        done.append("DraftBackendFactory._create_backend")
    extend = base.forward_extend
    if not getattr(extend, "_eagle3nb", False):

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
            if forward_batch.forward_mode.is_target_verify():
                topk = getattr(forward_batch.spec_info, "tree_topk", None)
                if topk != 1:
                    raise NotImplementedError(
                        f"TARGET_VERIFY with tree_topk={topk}: eagle3nb's torch_native verify "
                        "is causal, exact for chains (topk 1) only"
                    )
                forward_batch = VerifyView(forward_batch)
            return extend(self, q, k, v, layer, forward_batch, save_kv_cache)

        forward_extend._eagle3nb = True
        base.forward_extend = forward_extend
        done.append("TorchNativeAttnBackend.forward_extend")
    return done
