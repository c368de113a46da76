"""Capture the target's residual stream at boundaries, behind one engine interface.

A *capture engine* takes token ids and layer ids in its own convention and returns, per sample,
the aux hidden states ``[T, n_aux * H]`` (concatenated in boundary order) and the final pre-norm
state ``[T, H]`` (boundary N, from which the target's next-token distribution is recomputed by its
norm and lm_head). The engine that really ran is named in ``engine_name``; the convention whose ids
it accepts is ``convention`` (HF capturing at SGLang's capture point is still HF output).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from eagle3nb.padding import pad_right
from eagle3nb.boundaries.conventions import Convention, check_boundaries, get_convention

__all__ = [
    "capture_boundaries",
    "CaptureEngine",
    "HFCaptureEngine",
    "Captured",
    "n_layers_of",
    "decoder_of",
    "final_norm_of",
]


# where the text decoder (the module holding ``.layers`` and the final ``.norm``) sits, tried in
# order: causal LMs (``model``: Llama, Qwen2/3, Qwen3-MoE, DeepSeek-V3, gpt-oss, GLM-4.5, Llama-4
# text, Gemma-3 text, MiniMax-M2), multimodal wrappers in transformers 5.x (``model.language_model``:
# Gemma3ForConditionalGeneration, Kimi_K25ForConditionalGeneration), and wrappers that hold a causal
# LM (``language_model.model``: Llama4ForConditionalGeneration); the model itself last.
_DECODER_PATHS = ("model", "model.language_model", "language_model.model", "language_model", "")


def decoder_of(model):
    """The text decoder of an HF causal LM or multimodal wrapper: the module whose ``layers`` are the
    N decoder layers and whose ``norm`` is the final norm (HF's ``hidden_states`` come from it).

    Raises:
        ValueError: no such module (names the model class and the places looked at).
    """
    for path in _DECODER_PATHS:
        mod = model
        for part in path.split(".") if path else []:
            mod = getattr(mod, part, None)
        if isinstance(getattr(mod, "layers", None), torch.nn.ModuleList) and hasattr(mod, "norm"):
            return mod
    raise ValueError(
        f"model of class {type(model).__name__}: no text decoder with .layers and .norm at "
        f"{[p or '<model>' for p in _DECODER_PATHS]}; eagle3nb cannot capture its boundaries "
        "(add where its layers live to eagle3nb/target/capture.py _DECODER_PATHS)"
    )


_decoder = decoder_of  # the name the steps used before wrappers were accepted


def final_norm_of(model):
    """The target's final norm (boundary N -> the state its lm_head reads): the text decoder's
    ``norm``, or ``model.model.norm`` for a head-only target (:mod:`eagle3nb.target.head`).

    Raises:
        ValueError: neither exists (see :func:`decoder_of`).
    """
    inner = getattr(model, "model", None)
    if not isinstance(getattr(inner, "layers", None), torch.nn.ModuleList) and hasattr(
        inner, "norm"
    ):
        return inner.norm  # head only: embedding, norm and lm_head, no layers
    return decoder_of(model).norm


def n_layers_of(model) -> int:
    """Number of decoder layers N of an HF causal LM or wrapper (its text decoder's layers); for a
    head-only target (:mod:`eagle3nb.target.head`, no layers loaded) its text config's
    ``num_hidden_layers``.

    Raises:
        ValueError: neither (see :func:`decoder_of`).
    """
    inner = getattr(model, "model", None)
    if getattr(inner, "layers", None) is None and hasattr(inner, "norm"):
        return int(model.config.num_hidden_layers)  # head only: the layers were never loaded
    return len(decoder_of(model).layers)


@contextmanager
def _boundary_hooks(model, boundaries: Sequence[int], store: dict):
    """Hooks that clone the residual stream at each boundary into ``store[b]``.

    Boundary b < N: input of decoder layer b (forward pre-hook). Boundary N: input of the final norm
    (the last layer's output before the norm). HF Llama keeps the residual stream whole (no fused
    add+norm), so the layer input *is* the residual stream; we clone because later in-place kernels
    could overwrite a view (failure kind "residual aliased").

    Only calls from the thread that entered the context are recorded. Why: a module's hooks fire
    in every thread that calls it, and online training calls the target's final norm (the TTT
    objective's labels) on the main thread while the capture thread runs the target (SGLang's
    boundary N from HF, the HF-fed source); the trainer's call then overwrote the capture's
    boundary N with a training batch's state (about 1 batch in 10 of the HF-fed tests, weights
    ~1e-3 off; ``tests/target/test_capture.py::test_hooks_ignore_other_threads``).
    """
    dec = decoder_of(model)
    n = len(dec.layers)
    handles = []
    owner = threading.get_ident()

    def grab(b):
        def hook(_mod, args, kwargs):
            if threading.get_ident() != owner:  # another thread's forward of the same module
                return
            x = args[0] if args else kwargs["hidden_states"]
            store[b] = x.detach().clone()

        return hook

    for b in boundaries:
        mod = dec.norm if b == n else dec.layers[b]
        handles.append(mod.register_forward_pre_hook(grab(b), with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def capture_boundaries(
    model, input_ids: torch.Tensor, boundaries: Sequence[int], attention_mask=None
) -> dict[int, torch.Tensor]:
    """Residual stream of an HF decoder at the given boundaries.

    Args:
        model: HF causal LM or multimodal wrapper of any class :func:`decoder_of` finds (dense
            Llama/Mistral/Qwen, MoE, MLA; see ``eagle3nb.target.models.SUPPORTED_ARCHS``).
        input_ids: ``[B, T]`` int64. Right padding only (positions are 0..T-1).
        boundaries: each in 0..N; N means the last layer's output before the final norm.
        attention_mask: ``[B, T]`` (1 = token, 0 = pad) or None.

    A model sharded by FSDP2 (:func:`eagle3nb.training.shard_target.shard_target`) runs its whole
    forward (the root's hooks gather the embeddings and final norm) with ``logits_to_keep=1``;
    every rank must call this the same number of times (the all-gathers are collective).

    Returns:
        ``{b: [B, T, H]}`` in the model's dtype, cloned.

    Raises:
        ValueError: a boundary outside 0..N, or an ``attention_mask`` row that is not ones then zeros
            (left padding, a gap, or an empty row).
    """
    n = n_layers_of(model)
    bs = check_boundaries(sorted(set(int(b) for b in boundaries)), n, "boundaries")
    if attention_mask is not None and attention_mask.numel():
        m = attention_mask != 0
        bad = ~m[:, 0] | (m[:, 1:] & ~m[:, :-1]).any(
            dim=1
        )  # starts with pad, or a pad before a token
        if bad.any():
            rows = bad.nonzero().flatten().tolist()
            raise ValueError(
                f"attention_mask rows {rows[:8]}: capture needs right padding (each row ones, then zeros); got left padding, a gap or an empty row"
            )
    store: dict[int, torch.Tensor] = {}
    kw = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    with _boundary_hooks(model, bs, store):
        if _is_fsdp_root(model):  # the root's forward gathers its group (embeddings, norm, head)
            model(**kw, logits_to_keep=1)  # lm_head on one position per row
            model.reshard()  # FSDP keeps the root's group whole after forward; free it
        else:
            decoder_of(model)(**kw)
    return {b: store[b] for b in bs}


def _is_fsdp_root(model) -> bool:
    """True for a model sharded by FSDP2 at its root (:mod:`eagle3nb.training.shard_target`)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed
        return False
    return isinstance(model, FSDPModule)


@dataclass
class Captured:
    """One sample's capture: ``aux`` ``[T, n_aux*H]``, ``final`` ``[T, H]`` (boundary N)."""

    aux: torch.Tensor
    final: torch.Tensor


class CaptureEngine(Protocol):
    """What an extraction notebook needs from an engine (HF here; SGLang/vLLM behind the same API).

    Attributes:
        engine_name: the engine that actually runs (e.g. ``"hf-transformers"``).
        engine_version: its package version.
        convention: the layer-id convention of the ids passed to :meth:`capture`.
    """

    engine_name: str
    engine_version: str
    convention: Convention

    def capture(self, samples: Sequence[Sequence[int]], ids: Sequence[int]) -> list[Captured]:
        """Per sample (ragged token id lists): aux ``[T, len(ids)*H]`` at the boundaries ``ids`` name
        in ``convention``, and ``final`` ``[T, H]`` (boundary N). Raises ValueError for ids the
        engine cannot capture; never returns fewer tensors than asked."""
        ...


class HFCaptureEngine:
    """Hugging Face transformers capturing at another engine's capture point.

    It maps ``ids`` through ``convention`` (default SGLang: boundary = id + 1) and captures the
    residual stream there, cloned, plus boundary N for the target distribution. The output is HF's
    output: ``engine_name`` says ``hf-transformers`` whatever the convention.

    Args:
        model: HF causal LM in eval mode.
        convention: name of the convention the ids are given in.
        batch_size: samples per padded forward (right padding; equal to one-by-one, see tests).
    """

    engine_name = "hf-transformers"

    def __init__(self, model, convention: str = "sglang", batch_size: int = 16):
        import transformers

        self.model = model
        self.convention = get_convention(convention)
        self.engine_version = transformers.__version__
        self.batch_size = int(batch_size)
        self.n_layers = n_layers_of(model)

    def boundaries(self, ids: Sequence[int]) -> list[int]:
        """Boundaries captured for ``ids`` (raises like the engine would refuse)."""
        return check_boundaries(
            self.convention.ids_to_boundaries(ids, self.n_layers), self.n_layers, "aux boundaries"
        )

    def capture(self, samples: Sequence[Sequence[int]], ids: Sequence[int]) -> list[Captured]:
        """Capture aux states for each sample.

        Args:
            samples: token id lists (ragged).
            ids: layer ids in ``self.convention``.

        Returns:
            One :class:`Captured` per sample, float tensors on CPU, ``aux [T, len(ids)*H]``,
            ``final [T, H]``.
        """
        bnds = self.boundaries(ids)
        n = self.n_layers
        out: list[Captured] = []
        dev = next(self.model.parameters()).device
        for s in range(0, len(samples), self.batch_size):
            chunk = [list(x) for x in samples[s : s + self.batch_size]]
            lens = [len(x) for x in chunk]
            ids_t, mask = pad_right(chunk)  # [b, T] int64 both
            states = capture_boundaries(
                self.model, ids_t.to(dev), sorted(set(bnds + [n])), mask.to(dev)
            )
            for i, L in enumerate(lens):
                aux = torch.cat([states[b][i, :L] for b in bnds], dim=-1).cpu()  # [L, n_aux*H]
                out.append(Captured(aux=aux, final=states[n][i, :L].cpu()))  # final: [L, H]
        return out


def reference_states(model, input_ids: Sequence[int]) -> dict[int, torch.Tensor]:
    """HF reference ``{b: [T, H] float32}`` for every boundary 0..N of one sample."""
    n = n_layers_of(model)  # the text model's layers (wrappers too)
    st = capture_boundaries(
        model, torch.tensor([list(input_ids)], device=next(model.parameters()).device), range(n + 1)
    )
    return {b: t[0].float().cpu() for b, t in st.items()}
