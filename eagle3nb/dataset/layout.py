"""How aux states are laid out on disk: shard layout, exact byte counts, optional int8 storage.

The dataset writer (:func:`eagle3nb.dataset.write.write_dataset`) builds every shard from
:func:`shard_layout` and checks it wrote exactly that layout, so :func:`estimate_dataset_bytes`,
which sums :func:`shard_file_bytes` over the same layouts, is the size of the shard files that will
be written (exact by construction; ``tests/dataset/test_shard_layout.py`` compares it with the bytes on disk).

Per token the payload is ``(n_aux + 1) x H x bytes`` (aux slots and boundary N) plus 8 B of id and
1 B of loss mask; with ``aux_storage="int8"`` the aux part becomes ``n_aux x H x 1`` plus one
float32 scale per token and aux slot (``n_aux x 4`` B), while boundary N stays in the capture dtype
(it gives the target distribution the loss is computed against). Each shard also stores
``offsets [S+1]`` and ``sample_ids [S]`` (int64) and a safetensors header.

int8 storage is symmetric absmax quantisation per token and aux slot (as LLM.int8 / SmoothQuant
quantise activations per token): ``scale = max|x| / 127``, ``q = round(x / scale)``; dequantised
``x' = q * scale`` so ``|x - x'| <= scale / 2`` element-wise.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Sequence

import torch

__all__ = [
    "AUX_STORAGE",
    "shard_layout",
    "header_bytes",
    "check_writer_memory",
    "available_memory_bytes",
    "quantization_error",
    "safetensors_header",
    "shard_file_bytes",
    "estimate_dataset_bytes",
    "quantize_aux",
    "dequantize_aux",
    "relative_error",
    "ST_DTYPES",
    "METADATA",
]

AUX_STORAGE = (
    "dtype",
    "int8",
)  # "dtype": aux stored in the capture dtype; "int8": per-token scales
METADATA = {"format": "eagle3nb-aux-dataset"}  # safetensors __metadata__ of every shard
# safetensors dtype tags, in the order its serializer sorts tensors (descending tag, then name);
# safetensors/src/tensor.rs `Dtype` and `prepare`
ST_DTYPES = {
    torch.int64: "I64",
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int8: "I8",
    torch.uint8: "U8",
}
_ST_ORDER = ["U8", "I8", "F16", "BF16", "F32", "I64"]  # ascending, as in the Rust enum


def _nbytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def shard_layout(
    lens: Sequence[int], n_aux: int, hidden: int, dtype: torch.dtype, aux_storage: str = "dtype"
) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """``{tensor name: (dtype, shape)}`` of one shard holding samples of ``lens`` tokens.

    Args:
        lens: token count of each stored sample (S samples, N = sum tokens).
        n_aux, hidden: aux slots and the target's hidden size H.
        dtype: capture dtype (boundary N, and aux unless int8).
        aux_storage: ``"dtype"`` or ``"int8"``.

    Raises:
        ValueError: unknown ``aux_storage``.
    """
    if aux_storage not in AUX_STORAGE:
        raise ValueError(f"aux_storage={aux_storage!r}: use one of {list(AUX_STORAGE)}")
    S, N = len(lens), int(sum(lens))
    out = {
        "input_ids": (torch.int64, (N,)),
        "loss_mask": (torch.uint8, (N,)),
        "aux": (torch.int8 if aux_storage == "int8" else dtype, (N, n_aux * hidden)),
        "final": (dtype, (N, hidden)),
        "offsets": (torch.int64, (S + 1,)),
        "sample_ids": (torch.int64, (S,)),
    }
    if aux_storage == "int8":
        out["aux_scale"] = (torch.float32, (N, n_aux))  # one scale per token and aux slot
    return out


def safetensors_header(layout: dict, metadata: dict | None = METADATA) -> tuple[bytes, list[str]]:
    """``(header, names)``: the safetensors header for ``layout`` (8-byte little-endian length +
    compact JSON padded with spaces to a multiple of 8) and the tensor names in file order, built
    as the safetensors serializer builds them (tensors sorted by dtype tag, descending, then name;
    ``__metadata__`` first, its keys sorted where the library's hash map order varies).

    Raises:
        KeyError: a dtype outside :data:`ST_DTYPES`.
    """
    names = sorted(layout, key=lambda k: (-_ST_ORDER.index(ST_DTYPES[layout[k][0]]), k))
    head: dict = {"__metadata__": dict(sorted(metadata.items()))} if metadata else {}
    off = 0
    for k in names:
        dt, shape = layout[k]
        n = _nbytes(dt)
        for s in shape:
            n *= s
        head[k] = {"dtype": ST_DTYPES[dt], "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    js = json.dumps(head, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js, names


def header_bytes(layout: dict, metadata: dict | None = METADATA) -> int:
    """Bytes of the safetensors header (8-byte length + JSON padded to 8) for ``layout``."""
    return len(safetensors_header(layout, metadata)[0])


def shard_file_bytes(layout: dict, metadata: dict | None = METADATA) -> int:
    """Size in bytes of the safetensors file for ``layout`` (header + tensor data)."""
    data = 0
    for dt, shape in layout.values():
        n = _nbytes(dt)
        for s in shape:
            n *= s
        data += n
    return header_bytes(layout, metadata) + data


def estimate_dataset_bytes(
    shard_lens: Sequence[Sequence[int]],
    n_aux: int,
    hidden: int,
    dtype: torch.dtype,
    aux_storage: str = "dtype",
) -> dict:
    """Disk need of a dataset, before any capture.

    Args:
        shard_lens: per shard, the token counts of the samples it will store (samples with an
            empty loss mask are skipped by the writer, so leave them out).

    Returns:
        ``{"shard_bytes": exact size of all shard files, "largest_shard_bytes": of one file,
        "per_token_bytes": payload per token,
        "formula": text, "n_tokens", "n_samples", "n_shards"}``. Samples later found non-finite
        are dropped by the writer, so the real size can only be smaller.
    """
    sizes = [
        shard_file_bytes(shard_layout(ls, n_aux, hidden, dtype, aux_storage)) for ls in shard_lens
    ]
    total = sum(sizes)
    b = _nbytes(dtype)
    per_tok = (
        (n_aux * hidden + n_aux * 4 if aux_storage == "int8" else n_aux * hidden * b)
        + hidden * b
        + 9
    )
    formula = (
        f"tokens x (n_aux x H x 1 + n_aux x 4 + H x {b}) + tokens x 9"
        if aux_storage == "int8"
        else f"tokens x (n_aux + 1) x H x {b} + tokens x 9"
    ) + " + samples x 16 + shards x (8 + header)"
    return {
        "shard_bytes": int(total),
        "largest_shard_bytes": int(max(sizes, default=0)),
        "per_token_bytes": int(per_tok),
        "formula": formula,
        "n_tokens": int(sum(sum(x) for x in shard_lens)),
        "n_samples": int(sum(len(x) for x in shard_lens)),
        "n_shards": len(shard_lens),
    }


def quantize_aux(aux: torch.Tensor, n_aux: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantisation per token and aux slot.

    Args:
        aux: ``[N, n_aux*H]`` float (any float dtype; computed in float32).

    Returns:
        ``(q [N, n_aux*H] int8, scale [N, n_aux] float32)`` with ``x ~= q * scale`` per slot; an
        all-zero slot gets scale 0 and q 0 (dequantises to exactly 0).
    """
    N, A = aux.shape
    x = aux.float().reshape(N, n_aux, A // n_aux if n_aux else 0)
    scale = x.abs().amax(dim=-1) / 127.0  # [N, n_aux]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(x / safe[..., None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(N, A), scale


def dequantize_aux(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``[N, n_aux*H] float32`` from :func:`quantize_aux`'s ``(q, scale)``."""
    N, A = q.shape
    n_aux = scale.shape[1]
    return (q.float().reshape(N, n_aux, A // n_aux if n_aux else 0) * scale[..., None]).reshape(
        N, A
    )


def relative_error(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """``(sum (x-y)^2, sum x^2)`` in float64, to accumulate a dataset-wide ``||x-y|| / ||x||``."""
    d = x.double() - y.double()
    return float((d * d).sum()), float((x.double() ** 2).sum())


def quantization_error(
    ref: torch.Tensor, q: torch.Tensor, scale: torch.Tensor
) -> tuple[list[float], list[float]]:
    """``(squared error, squared norm)`` per aux slot of :func:`quantize_aux`'s ``(q, scale)``
    against the unquantised ``ref [N, n_aux*H]`` (float64 sums over tokens and H): the shard's
    ``aux_sq_error`` / ``aux_sq_norm``, from which the manifest's relative error is computed."""
    n_aux = scale.shape[1]
    if not len(ref):
        return [0.0] * n_aux, [0.0] * n_aux
    err2 = ((ref - dequantize_aux(q, scale)).double() ** 2).reshape(len(ref), n_aux, -1)
    ref2 = (ref.double() ** 2).reshape(len(ref), n_aux, -1)
    return err2.sum(dim=(0, 2)).tolist(), ref2.sum(dim=(0, 2)).tolist()


# what 02a's writer holds at once, in shards: the shard on its way to disk (writer thread), the next
# shard's captured states, and their concatenation (eagle3nb.dataset.write.write_dataset)
WRITER_SHARDS_IN_MEMORY = 3


def available_memory_bytes() -> int:
    """The host's ``MemAvailable`` (``/proc/meminfo``), else free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_writer_memory(
    largest_shard_bytes: int, shard_size: int, available: int | None = None, workers: int = 1
) -> None:
    """Refuse an extraction whose shards cannot be held in memory, before any capture.

    Args:
        largest_shard_bytes: the largest shard file (:func:`estimate_dataset_bytes`).
        shard_size: the ``shard_size`` parameter that made it (samples per shard).
        available: host memory in bytes (default :func:`available_memory_bytes`).
        workers: writer processes on this host (``extract_workers``), each holding its shards.

    Raises:
        ValueError: ``workers`` x :data:`WRITER_SHARDS_IN_MEMORY` x the largest shard exceeds
            ``available``; the message names ``shard_size``, the sizes and a ``shard_size`` that
            fits.
    """
    avail = available_memory_bytes() if available is None else int(available)
    need = workers * WRITER_SHARDS_IN_MEMORY * int(largest_shard_bytes)
    if need > avail:
        fits = int(shard_size * 0.9 * avail // need)  # 10 % headroom: headers, longer samples
        who = "02a's writer holds" if workers == 1 else f"each of the {workers} writers holds"
        raise ValueError(
            f"shard_size={shard_size}: the largest shard is {largest_shard_bytes / 1e9:.2f} GB and "
            f"{who} up to {WRITER_SHARDS_IN_MEMORY} at once ({need / 1e9:.2f} GB in all), but "
            f"this host has {avail / 1e9:.2f} GB available: "
            + (
                f"set shard_size: {fits} or less"
                if fits >= 1
                else "shorten the samples (max_new_tokens) or free memory"
            )
        )
