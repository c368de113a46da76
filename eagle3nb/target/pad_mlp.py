"""A function-preserving copy of a Llama-family target with its MLP zero-padded to a wider width.

Why: SGLang's CUDA ``SiluAndMul`` takes its JIT kernel only when the MLP width is a multiple of 16
bytes / element size (8 in bf16/fp16); other widths go to sgl-kernel's ``silu_and_mul``, which
faulted on the tiny target's 172 ("misaligned address", reported as CUBLAS_STATUS_INTERNAL_ERROR;
sglang 0.5.17 ``srt/layers/activation.py:77-99``, ``../shared/reference/gpu_engines_h200.md``).

The copy adds ``pad`` rows of zeros to every ``gate_proj`` and ``up_proj`` weight (output features)
and ``pad`` zero columns to every ``down_proj`` weight (input features): the extra units compute
``silu(0) * 0 = 0`` and ``down_proj`` multiplies them by 0, so hidden states and logits are the
original's (up to float summation order; HF ``LlamaMLP``: ``down(act(gate(x)) * up(x))``). Every
other tensor, the tokenizer and the generation config are copied unchanged; ``padded_mlp.json``
names the source, its weights' sha256 and both widths, so the copy is never taken for the original.

Names in :data:`DERIVED` are built on first use by :func:`eagle3nb.target.models.resolve_model`
into :func:`eagle3nb.target.moe_copy.cache_dir`. CLI:
``python -m eagle3nb.target.pad_mlp SRC_FOLDER DST [--multiple 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3nb.target.derived import publish_derived_copy

__all__ = ["DERIVED", "padded_width", "pad_mlp_weights", "write_padded_copy"]

# derived model name -> (source model name, width multiple)
DERIVED = {"stories260K-hd32-mlp176": ("stories260K-hd32", 8)}


def padded_width(width: int, multiple: int = 8) -> int:
    """``width`` rounded up to a multiple of ``multiple`` (172 -> 176 for 8).

    Raises:
        ValueError: a width or multiple below 1.
    """
    if width < 1 or multiple < 1:
        raise ValueError(f"padded_width({width}, {multiple}): both must be >= 1")
    return -(-width // multiple) * multiple


def pad_mlp_weights(sd: dict, width: int, new_width: int) -> dict:
    """The state dict with every ``*.mlp.gate_proj/up_proj.weight`` ``[width, H]`` padded with zero
    rows to ``[new_width, H]`` and every ``*.mlp.down_proj.weight`` ``[H, width]`` with zero columns
    to ``[H, new_width]`` (same dtype); other tensors as they are.

    Raises:
        ValueError: no MLP weight found, or one whose width is not ``width`` (the tensor named).
    """
    out, n = {}, 0
    for k, t in sd.items():
        if k.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            if t.shape[0] != width:
                raise ValueError(
                    f"{k}: {tuple(t.shape)}, expected {width} rows (intermediate_size)"
                )
            t = torch.cat([t, t.new_zeros(new_width - width, t.shape[1])], 0)
            n += 1
        elif k.endswith("mlp.down_proj.weight"):
            if t.shape[1] != width:
                raise ValueError(f"{k}: {tuple(t.shape)}, expected {width} columns")
            t = torch.cat([t, t.new_zeros(t.shape[0], new_width - width)], 1)
            n += 1
        out[k] = t.contiguous()
    if n == 0:
        raise ValueError(
            "no *.mlp.gate_proj/up_proj/down_proj.weight tensors: not a Llama-family MLP"
        )
    return out


def write_padded_copy(src: str | os.PathLike, dst: str | os.PathLike, multiple: int = 8) -> Path:
    """Write the MLP-padded copy of the model folder ``src`` to ``dst`` (config with the new
    ``intermediate_size``, weights, tokenizer files, ``padded_mlp.json``). Built in a temp folder
    and renamed into place; an existing ``dst`` is kept. Returns ``dst``.

    Raises:
        FileNotFoundError: ``src`` has no config.json or model.safetensors.
        ValueError: a config without an int ``intermediate_size``, or a width already a multiple
            (nothing to pad: use the original), or see :func:`pad_mlp_weights`.
    """
    src, dst = Path(src), Path(dst)
    if (dst / "config.json").is_file():
        return dst
    if not (src / "config.json").is_file() or not (src / "model.safetensors").is_file():
        raise FileNotFoundError(f"{src}: a padded copy needs config.json and model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    width = cfg.get("intermediate_size")
    if not isinstance(width, int):
        raise ValueError(f"{src}/config.json: no int intermediate_size (got {width!r})")
    new = padded_width(width, multiple)
    if new == width:
        raise ValueError(f"{src}: intermediate_size={width} is already a multiple of {multiple}")
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        weights = pad_mlp_weights({k: f.get_tensor(k) for k in f.keys()}, width, new)
    info = {"intermediate_size": width, "padded_intermediate_size": new,
            "why": "SGLang's CUDA SiluAndMul faults on MLP widths that are not a multiple of 8",
            "made_by": "eagle3nb.target.pad_mlp"}  # fmt: skip
    new_cfg = {**cfg, "intermediate_size": new}
    return publish_derived_copy(src, dst, weights, new_cfg, "padded_mlp.json", info)


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m eagle3nb.target.pad_mlp SRC_FOLDER DST [--multiple 8]``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", help="Llama-family model folder (config.json, model.safetensors)")
    ap.add_argument("dst", help="folder to write the padded copy to")
    ap.add_argument("--multiple", type=int, default=8, help="pad the MLP width to a multiple of it")
    a = ap.parse_args(argv)
    print(write_padded_copy(a.src, a.dst, a.multiple))


if __name__ == "__main__":
    main()
