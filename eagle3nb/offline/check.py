"""``python -m eagle3nb.offline check``, run on the host after ``install.sh``: the engine imports
from the bundle, its versions, and an engine started on a local target generating a few tokens,
compared with HF transformers' greedy tokens on the same device.

Nothing is downloaded: the target is a local folder (``resolve_model``: a path, then
``$EAGLE3NB_MODEL_PATH``, then ``../shared/models``).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Callable

__all__ = ["versions", "check_engine", "check_sglang"]

_PACKAGES = ("torch", "transformers", "vllm", "pydantic", "papermill", "plotly", "datasets")
_SGLANG_PACKAGES = ("torch", "transformers", "tokenizers", "sglang", "sgl_kernel", "flashinfer")


def versions(engine: str = "vllm") -> dict[str, str]:
    """``{package: version or 'absent (ImportError ...)'}`` and where the engine was imported from
    (``engine``: vllm, or sglang for SGLang's set)."""
    out = {"python": sys.version.split()[0]}
    for name in _SGLANG_PACKAGES if engine == "sglang" else _PACKAGES:
        try:
            mod = importlib.import_module(name)
            out[name] = getattr(mod, "__version__", "?")
            if name in ("vllm", "sglang", "transformers"):
                out[f"{name}_path"] = os.path.dirname(mod.__file__)
        except Exception as e:  # noqa: BLE001 - reported, the check goes on
            out[name] = f"absent ({type(e).__name__}: {str(e)[:120]})"
    return out


def check_engine(
    model: str, max_new_tokens: int = 8, dtype: str = "float32", log: Callable = print
) -> dict:
    """Start ``vllm.LLM`` on ``model`` and generate ``max_new_tokens`` greedy tokens for one
    prompt; the same with HF transformers (greedy argmax, no stop) on the same device.

    Returns:
        ``{"model", "engine_tokens", "hf_tokens", "equal", "start_s", "device"}``.

    Raises:
        FileNotFoundError: ``model`` names no local folder (from ``resolve_model``).
        RuntimeError: ``VLLM_USE_FLASHINFER_SAMPLER`` is not 0 (vLLM's sampler would import
            flashinfer, which the bundle lacks).
    """
    from eagle3nb.target.models import load_target, resolve_model

    path = str(resolve_model(model))
    if os.environ.get("VLLM_USE_FLASHINFER_SAMPLER") != "0":
        raise RuntimeError(
            "VLLM_USE_FLASHINFER_SAMPLER is not 0: source the bundle's env.sh (install.sh prints "
            "the export line) so vLLM's sampler does not import flashinfer"
        )
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf, tok, _ = load_target(path, dtype=dtype, device=device)
    ids = tok("Once upon a time", add_special_tokens=True)["input_ids"]
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(model=path, dtype=dtype, seed=0, enforce_eager=True, max_model_len=256,
              gpu_memory_utilization=0.3, enable_prefix_caching=False)  # fmt: skip
    start_s = time.time() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": ids}], sp)
    got = list(out[0].outputs[0].token_ids)
    del llm
    with torch.no_grad():  # greedy by hand: no generation config or eos stop differs from vLLM's
        x = torch.tensor([ids], device=device)
        for _ in range(max_new_tokens):
            nxt = hf(x).logits[0, -1].argmax()
            x = torch.cat([x, nxt.view(1, 1)], dim=1)
    want = x[0, len(ids) :].tolist()
    res = {"model": path, "engine_tokens": got, "hf_tokens": want, "equal": got == want}
    res |= {"start_s": round(start_s, 1), "device": device}
    log(f"vllm {got}\nhf   {want}\nequal: {got == want} (engine start {start_s:.1f} s, {device})")
    return res


def check_sglang(
    model: str, max_new_tokens: int = 8, dtype: str = "bfloat16", log: Callable = print
) -> dict:
    """Start ``sglang.Engine`` on ``model`` (GPU: triton attention, torch sampling, no CUDA graphs,
    the settings the slim set runs with, ``../shared/reference/gpu_engines_h200.md``) and generate
    ``max_new_tokens`` greedy tokens for one prompt; HF greedy on the same device and dtype.

    Returns:
        ``{"model", "engine_tokens", "hf_tokens", "equal", "start_s", "device", "dtype"}``
        (half precision may differ from HF in a token: reported, not refused).

    Raises:
        FileNotFoundError: ``model`` names no local folder.
        RuntimeError: an MLP width SGLang's CUDA kernels fault on (serve the padded copy,
            ``stories260K-hd32-mlp176``), before the engine starts.
    """
    import torch

    from eagle3nb.engines.sglang_ops import mlp_width_problem
    from eagle3nb.target.models import load_target, resolve_model

    path = str(resolve_model(model))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    import sglang

    if why := mlp_width_problem(path, dtype, device, False, sglang.__version__):
        raise RuntimeError(why)
    hf, tok, _ = load_target(path, dtype=dtype, device=device)
    ids = tok("Once upon a time", add_special_tokens=True)["input_ids"]

    kw = dict(model_path=path, dtype=dtype, random_seed=0, disable_cuda_graph=True,
              disable_radix_cache=True, log_level="error", mem_fraction_static=0.3)  # fmt: skip
    if device == "cuda":
        kw |= dict(attention_backend="triton", sampling_backend="pytorch")
    t0 = time.time()
    eng = sglang.Engine(**kw)
    start_s = time.time() - t0
    sp = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    got = [int(t) for t in eng.generate(input_ids=[ids], sampling_params=sp)[0]["output_ids"]]
    eng.shutdown()
    with torch.no_grad():
        x = torch.tensor([ids], device=device)
        for _ in range(max_new_tokens):
            x = torch.cat([x, hf(x).logits[0, -1].argmax().view(1, 1)], dim=1)
    want = x[0, len(ids) :].tolist()
    res = {"model": path, "engine_tokens": got, "hf_tokens": want, "equal": got == want}
    res |= {"start_s": round(start_s, 1), "device": device, "dtype": dtype}
    log(f"sglang {got}\nhf     {want}\nequal: {got == want} (start {start_s:.1f} s, {device})")
    return res
