"""Quantized variants of a target, written by eagle3nb from the local model (nothing downloaded).

The format is compressed-tensors (the library of vLLM's llm-compressor; ``quant_method:
compressed-tensors`` in config.json), written with that library's own presets, qparam
calculation, compressors and config writer: vLLM loads it with its own kernels, HF transformers
(with compressed-tensors installed) decompresses its weights to the model dtype on load.

Formats (:data:`FORMATS`):

- ``w8a8``: int8 weights, one scale per output channel, int8 activations per token (dynamic),
  symmetric (preset ``W8A8``, format ``int-quantized``). vLLM 0.32 on CPU runs it with
  ``CPUInt8ScaledMMLinearKernel`` (``model_executor/kernels/linear/scaled_mm/cpu.py``,
  ``can_implement`` accepts every shape; oneDNN int8 GEMM, or the AMX sgl kernel where
  ``check_cpu_sgl_kernel`` allows). HF: weights dequantized, activations NOT quantized.
- ``w4a16``: int4 weights in groups of 32 input channels, symmetric (preset ``W4A16`` with
  group 32, format ``pack-quantized``). vLLM 0.32 on CPU: ``CPUWNA16LinearKernel``
  (``model_executor/kernels/linear/mixed_precision/cpu.py`` ``can_implement``: input and output
  sizes multiples of 32, even group size). A Linear that breaks that rule (the embedded
  target's MLP: width 172) is left unquantized (``ignore``), and :func:`plan` says so.

The lm_head (tied to the embedding here) and the embedding are never quantized, so a captured
final state (boundary N) gives the variant's logits through the float32 final norm and head.

MoE targets (Mixtral, DeepSeek-V3): transformers 5.x holds a layer's routed experts as fused 3-D
parameters (``mlp.experts.gate_up_proj`` [E, 2I, H], ``mlp.experts.down_proj`` [E, H, I]), not
``nn.Linear``, so compressed-tensors' ``Linear`` targets leave them (and the router) in float;
:func:`plan` lists them as ignored. The variant is written in that in-memory layout
(``save_pretrained(save_original_format=False)``), not in the per-expert checkpoint layout
(``experts.{e}.w1.weight``): transformers 5.25 loads a compressed-tensors checkpoint's per-expert
tensors only through ``CompressedTensorsDequantize`` (``integrations/compressed_tensors.py``),
which keeps only ``weight_packed`` or fp8 experts and drops float or int8 ones ("experts ...
MISSING", "Concatenate ... Ckpt contains: 0"), while fused tensors load as they are. vLLM and SGLang
read only the per-expert layout, so a MoE variant is for HF sources.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from eagle3nb.manifest import atomic_write_json, read_json

__all__ = [
    "FORMATS",
    "VLLM_CPU_MULTIPLE",
    "plan",
    "write_quantized",
    "quantized_path",
    "load_quantized_hf",
]

FORMATS = {
    "w8a8": {
        "preset": "W8A8",
        "format": "int-quantized",
        "group_size": None,
        "what": "int8 weights per output channel + int8 activations per token (dynamic), symmetric",
        "vllm_cpu_kernel": "CPUInt8ScaledMMLinearKernel (any shape)",
    },
    "w4a16": {
        "preset": "W4A16",
        "format": "pack-quantized",
        "group_size": 32,
        "what": "int4 weights, groups of 32 input channels, symmetric; activations unquantized",
        "vllm_cpu_kernel": "CPUWNA16LinearKernel (input and output sizes multiples of 32)",
    },
}
# vLLM 0.32 CPUWNA16LinearKernel.can_implement: partition_weight_shape[0] and [1] % 32 == 0
VLLM_CPU_MULTIPLE = {"w8a8": 1, "w4a16": 32}
_QUANT_FILE = "eagle3nb_quantization.json"
# bumped when the written layout changes, so a variant written by an older eagle3nb is rewritten
# (2: MoE experts fused, in the layout transformers 5.25 loads)
_WRITER = 2


def quantized_path(root, fmt: str) -> Path:
    """Where :func:`write_quantized` puts format ``fmt`` under ``root`` (a run folder)."""
    return Path(root) / "quantized" / fmt


def _check_format(fmt: str) -> dict:
    if fmt not in FORMATS:
        raise ValueError(f"quantization {fmt!r}: use one of {sorted(FORMATS)} (or none)")
    return FORMATS[fmt]


def _fused_experts(model) -> dict[str, list[str]]:
    """``{module name: [its 3-D parameter names]}`` of the fused MoE expert modules of ``model``
    (transformers 5.x ``MixtralExperts``, ``DeepseekV3NaiveMoe``: weights ``[E, out, in]``)."""
    out = {}
    for name, mod in model.named_modules():
        fused = [n for n, p in mod.named_parameters(recurse=False) if p.dim() == 3]
        if fused and not isinstance(mod, torch.nn.Linear):
            out[name] = fused
    return out


def plan(model, fmt: str) -> dict:
    """Which ``nn.Linear`` modules of ``model`` (HF causal LM) get format ``fmt``.

    Returns:
        ``{"quantized": [names], "ignored": {name: reason}}``; the lm_head is always ignored, and
        for ``w4a16`` every Linear whose input or output size is not a multiple of 32 (vLLM's CPU
        kernel rule; see the module docstring) or of the group size. Fused MoE expert modules
        (3-D weights, not Linear; see the module docstring) are ignored too, with the reason.

    Raises:
        ValueError: an unknown ``fmt``.
    """
    spec = _check_format(fmt)
    mult = VLLM_CPU_MULTIPLE[fmt]
    quantized, ignored = [], {}
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        if name.split(".")[-1] == "lm_head":
            ignored[name] = "lm_head kept in the model dtype (the logits read by every source)"
            continue
        k, n = mod.in_features, mod.out_features
        g = spec["group_size"] or 1
        if k % mult or n % mult or k % g:
            ignored[name] = (
                f"in {k} / out {n} not multiples of {max(mult, g)}: vLLM 0.32 CPU "
                f"{spec['vllm_cpu_kernel']} cannot run it"
            )
            continue
        quantized.append(name)
    import transformers

    for name, params in _fused_experts(model).items():
        ignored[name] = (
            f"fused MoE experts ({', '.join(params)}, 3-D) are not nn.Linear in transformers "
            f"{transformers.__version__}, so compressed-tensors does not quantize them; they stay in "
            "the model dtype"
        )
    return {"quantized": quantized, "ignored": ignored}


def _set_weight_qparams(model) -> None:
    """Weight scales / zero points of every module carrying a quantization scheme, from its own
    weight's min/max (compressed-tensors ``calculate_qparams``: memoryless min-max, as the
    preset's observer)."""
    from compressed_tensors.quantization.utils import calculate_qparams

    for mod in model.modules():
        scheme = getattr(mod, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        w, a = mod.weight.data, scheme.weights
        if a.group_size:
            n, k = w.shape
            w = w.view(n, k // a.group_size, a.group_size)
            lo, hi = w.amin(-1), w.amax(-1)  # [N, K/g]
        else:
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)  # [N, 1]
        scale, zp = calculate_qparams(lo, hi, a)
        mod.weight_scale.data.copy_(scale)
        mod.weight_zero_point.data.copy_(zp)


def write_quantized(src_path, out_dir, fmt: str, source_sha256: str) -> dict:
    """Write the ``fmt`` variant of the HF model folder ``src_path`` to ``out_dir`` (config.json
    with ``quantization_config``, model.safetensors, the tokenizer files) through compressed-tensors.
    Skips the work when ``out_dir`` already holds it for the same source hash, written by this
    layout version (resume; an older layout is rewritten).

    Args:
        source_sha256: the source model's hash (recorded; a different one rewrites the folder).

    Returns:
        The record written to ``out_dir/eagle3nb_quantization.json``: format, preset, source
        hash, ``quantized`` and ``ignored`` modules (:func:`plan`), compressed-tensors version.

    Raises:
        ValueError: an unknown ``fmt``; no Linear of the model can take the format.
        ImportError: compressed-tensors is not installed (``pip install compressed-tensors``).
    """
    spec = _check_format(fmt)
    out = Path(out_dir)
    rec_file = out / _QUANT_FILE
    if rec_file.is_file():
        rec = read_json(rec_file)
        same = (rec.get("source_sha256"), rec.get("format"), rec.get("writer"))
        if same == (source_sha256, fmt, _WRITER):
            return rec
    import compressed_tensors
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    import transformers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src_path, dtype=torch.float32)
    pl = plan(model, fmt)
    if not pl["quantized"]:
        raise ValueError(
            f"quantization {fmt!r}: no Linear of {src_path} can take it ({pl['ignored']}); "
            "use w8a8 (any shape)"
        )
    scheme = preset_name_to_scheme(spec["preset"], ["Linear"])
    if spec["group_size"]:
        scheme.weights.group_size = spec["group_size"]
    experts = _fused_experts(model)
    qc = QuantizationConfig(
        config_groups={"group_0": scheme},
        ignore=sorted(n for n in pl["ignored"] if n not in experts),  # Linear modules only
        quantization_status=QuantizationStatus.INITIALIZED,
    )
    apply_quantization_config(model, qc)
    _set_weight_qparams(model)
    comp = ModelCompressor.from_pretrained_model(model, quantization_format=spec["format"])
    comp.compress_model(model)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # the in-memory layout: transformers reads fused experts as they are, but drops float/int8
    # per-expert tensors of a compressed-tensors checkpoint (module docstring)
    model.save_pretrained(tmp, save_original_format=False)
    comp.update_config(str(tmp))
    for f in Path(src_path).iterdir():  # tokenizer and generation files, as the source has them
        if f.is_file() and (f.name.startswith("tokenizer") or f.name == "special_tokens_map.json"):
            shutil.copy2(f, tmp / f.name)
    rec = {
        "format": fmt,
        "writer": _WRITER,
        "preset": spec["preset"],
        "compressed_tensors_format": spec["format"],
        "what": spec["what"],
        "vllm_cpu_kernel": spec["vllm_cpu_kernel"],
        "source": str(src_path),
        "source_sha256": source_sha256,
        "quantized": pl["quantized"],
        "ignored": pl["ignored"],
        "compressed_tensors_version": compressed_tensors.__version__,
        "transformers_version": transformers.__version__,
        "layout": "transformers fused experts (HF only)" if experts else "checkpoint",
        "config_quantization": json.loads((tmp / "config.json").read_text())["quantization_config"][
            "format"
        ],
    }
    atomic_write_json(tmp / _QUANT_FILE, rec)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return rec


def load_quantized_hf(path, dtype: str = "float32", device: str = "cpu"):
    """A quantized variant loaded by HF transformers (compressed-tensors installed), its weights
    dequantized to ``dtype``: transformers loads the compressed tensors and decompresses them on
    the first forward of the whole model (compressed-tensors' ``add_decompress_hook``), which a
    decoder-only call (HF capture) would skip, so one forward runs here.

    Returns:
        ``(model, tokenizer, path)`` as :func:`eagle3nb.target.models.load_target`.

    Raises:
        RuntimeError: a Linear still holds integer weights after that forward.
    """
    from eagle3nb.target.models import load_target

    model, tok, p = load_target(path, dtype, device)
    with torch.no_grad():
        model(torch.ones(1, 1, dtype=torch.long, device=next(model.parameters()).device))
    bad = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and not m.weight.dtype.is_floating_point
    ]
    if bad:
        raise RuntimeError(f"{path}: Linear weights still quantized after loading: {bad[:3]}")
    return model, tok, p
