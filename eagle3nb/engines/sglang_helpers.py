"""02b's real-SGLang path, notebook side: start the SGLang worker loopback-only, take boundary N from
the HF reference (SGLang cannot give it, see :mod:`eagle3nb.engines.sglang_backend`), check that
state against SGLang's own next-token log-probabilities. SGLang's speed with and without capture is measured with the same functions as
vLLM's (:func:`eagle3nb.engines.speed.measure_speed`, :class:`eagle3nb.engines.speed.TimedCapture`).
"""

from __future__ import annotations

import os
import subprocess
from typing import Sequence

import torch

from eagle3nb.padding import pad_right
from eagle3nb.target.capture import capture_boundaries, decoder_of, n_layers_of
from eagle3nb.engines import sglang_backend, sglang_netns
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS, EngineClient
from eagle3nb.engines.pool import open_engine

__all__ = [
    "start_sglang",
    "SGLANG_OPTION_KEYS",
    "SGLANG_FIXED_KWARGS",
    "check_sglang_options",
    "hf_final",
    "final_logprob_check",
    "namespace_report",
    "FINAL_LOGPROB_TOL",
    "FINAL_LOGPROB_TOL_CUDA",
]

# |log p_SGLang(x_t) - log p_HF-final(x_t)| bound: float32 kernels differ by ~1e-5 in log-prob;
# bf16 rounds the residual stream to 8 mantissa bits per layer (measured ~0.1 on this model)
FINAL_LOGPROB_TOL = {"float32": 1e-3, "float16": 0.2, "bfloat16": 0.5}
# SGLang on CUDA in float32: TF32 dots in its kernels (triton attention, torch matmul defaults), as
# the state tolerance (boundaries.alignment.TOLERANCE_CUDA); SGLang 0.5.17 on an H100 differed from
# HF's float32 by 3.8e-3 in log-prob on the default target (bench/gpu_2026-12-06, sglang_job.json)
FINAL_LOGPROB_TOL_CUDA = {"float32": 2e-2, "float16": 0.2, "bfloat16": 0.5}


# keys of ``sglang_options`` (read by SGLangBackend, eagle3nb/engines/sglang_backend.py)
SGLANG_OPTION_KEYS = {"max_total_tokens", "engine_kwargs", "capture_route", "native_ops"}
CAPTURE_ROUTES = ("auto", "engine", "runner")  # eagle3nb.engines.sglang_runner.ROUTES
# sglang.Engine arguments eagle3nb sets for a correct capture (SGLangBackend._start): overriding one
# would change which tensors come back or drop rows, so engine_kwargs may not name them
SGLANG_FIXED_KWARGS = {
    "model_path",
    "dtype",
    "device",
    "random_seed",
    "disable_radix_cache",
    "chunked_prefill_size",
    "enable_return_aux_hidden_states",
    "speculative_algorithm",
    "return_aux_hidden_state_layer_ids",
    "context_length",
}


def check_sglang_options(opts: dict) -> dict:
    """Validate ``sglang_options`` before any engine starts; returns them as the backend takes them.

    ``max_total_tokens`` (int > 0: SGLang's KV pool in tokens) and ``engine_kwargs`` (a dict passed
    to ``sglang.Engine`` as is: ``tp_size``, ``ep_size``, ``dp_size``, ``mem_fraction_static``,
    ``attention_backend``, ... on GPUs), ``capture_route`` (auto, engine or runner: SGLang's aux
    API or its in-process ModelRunner, :mod:`eagle3nb.engines.sglang_runner`) and ``native_ops``
    (bool: the runner's model built with torch ops; SGLang 0.5.17 only). The run's ``seed`` and ``dtype``, and the capture settings
    of :data:`SGLANG_FIXED_KWARGS`, come from eagle3nb and cannot be overridden here.

    Raises:
        ValueError: an unknown key, a non-positive ``max_total_tokens``, a ``capture_route`` not
            auto/engine/runner, a ``native_ops`` not a bool, ``engine_kwargs`` not a mapping, or
            naming a fixed argument (the message names the key and the fix).
    """
    opts = dict(opts or {})
    if bad := sorted(set(opts) - SGLANG_OPTION_KEYS):
        raise ValueError(
            f"sglang_options has unknown keys {bad}; allowed: {sorted(SGLANG_OPTION_KEYS)} (anything else for sglang.Engine goes under engine_kwargs, e.g. {{engine_kwargs: {{tp_size: 8}}}})"
        )
    mtt = opts.get("max_total_tokens")
    if mtt is not None and (not isinstance(mtt, int) or isinstance(mtt, bool) or mtt < 1):
        raise ValueError(
            f"sglang_options.max_total_tokens={mtt!r}: give a positive int (tokens in the KV pool)"
        )
    route = opts.get("capture_route", "auto")
    if route not in CAPTURE_ROUTES:
        raise ValueError(
            f"sglang_options.capture_route={route!r}: give one of {list(CAPTURE_ROUTES)} (auto: the "
            "aux API where the installed SGLang has it, else the in-process ModelRunner)"
        )
    if not isinstance(opts.get("native_ops", False), bool):
        raise ValueError(
            f"sglang_options.native_ops={opts['native_ops']!r}: give true or false (torch ops in "
            "the capture runner's model, SGLang 0.5.17 only)"
        )
    kw = opts.get("engine_kwargs", {})
    if not isinstance(kw, dict):
        raise ValueError(
            f"sglang_options.engine_kwargs={kw!r}: give a mapping of sglang.Engine arguments, e.g. {{tp_size: 8}}"
        )
    if fixed := sorted(set(kw) & SGLANG_FIXED_KWARGS):
        raise ValueError(
            f"sglang_options.engine_kwargs sets {fixed}, which eagle3nb sets for a correct capture (seed and dtype come from the run parameters, context_length from the run); remove them"
        )
    return opts


def start_sglang(
    model_path,
    dtype: str,
    device: str,
    seed: int,
    python: str | None,
    workdir_parent=None,
    context_length: int | None = None,
    options: dict | None = None,
    role: str | None = None,
) -> EngineClient:
    """Start the SGLang worker (``eagle3nb.engines.worker`` in SGLang's venv) in a loopback-only
    network namespace, with the CPU switch and shim on CPU and neither on a GPU; or hand back a
    running one of the same key when ``$EAGLE3NB_KEEP_ENGINES`` keeps workers
    (:mod:`eagle3nb.engines.pool`).

    Args:
        python: the SGLang venv's python (None: the default cache path; ``""``: in this process,
            for a GPU box where sglang imports here; no namespace then).
        device: ``cpu`` or ``cuda[:N]`` (already resolved).
        options: ``sglang_options`` (:func:`check_sglang_options`), e.g. ``engine_kwargs:
            {tp_size: 8}`` to shard a large target over the GPUs of one host.
        role: e.g. ``"plain"``: a second worker of the same key, held beside the first (as
            :func:`eagle3nb.engines.vllm_helpers.start_vllm`).

    Raises:
        FileNotFoundError: the venv or the CPU shim is missing (run ``bash .ci/setup_engines.sh``).
        RuntimeError: no loopback-only namespace can be made here (message names the fallback).
        eagle3nb.engines.client.EngineError: SGLang failed to start (its message and log tail).
    """
    python = DEFAULT_ENGINE_PYTHONS["sglang"] if python is None else python
    env = sglang_backend.launch_env(device, base=dict(os.environ))
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
    if device != "cpu" and os.environ.get("SGLANG_USE_CPU_ENGINE"):
        raise RuntimeError(
            "SGLANG_USE_CPU_ENGINE is set in this environment but device is a GPU; unset it (it is the CPU-only switch)"
        )
    if not python:  # in-process (GPU box): the environment must already be the engine's
        os.environ.update(changed)
        prefix = []
    else:
        prefix = sglang_netns.loopback_prefix()
    opts = {"device": device, "seed": int(seed), **check_sglang_options(options)}
    if context_length:
        opts["context_length"] = int(context_length)
    return open_engine(
        "sglang",
        model_path,
        dtype,
        opts,
        python=python,
        param="sglang_python",
        workdir_parent=workdir_parent,
        env={**changed, "EAGLE3NB_ENGINE_ROLE": role} if role else changed,
        prefix=prefix,
    )


@torch.no_grad()
def hf_final(model, samples: Sequence[Sequence[int]], batch_size: int = 16) -> list[torch.Tensor]:
    """Boundary N (last layer's output before the final norm) from the HF model, ``[T, H]`` per
    sample on CPU, right-padded batches (equal to one-by-one, see tests/target/test_capture.py)."""
    n = n_layers_of(model)  # the text model's (wrappers too)
    dev = next(model.parameters()).device
    out = []
    for s in range(0, len(samples), batch_size):
        chunk = [list(x) for x in samples[s : s + batch_size]]
        ids, mask = pad_right(chunk)  # [b, T] int64 both
        st = capture_boundaries(model, ids.to(dev), [n], mask.to(dev))[n]
        out += [st[i, : len(x)].cpu() for i, x in enumerate(chunk)]
    return out


@torch.no_grad()
def final_logprob_check(
    model, sample: Sequence[int], final: torch.Tensor, sglang_logprobs: torch.Tensor, dtype: str
) -> dict:
    """Does the stored ``final`` give the distribution SGLang itself computes?

    Compares log p(x_t | x_<t) from ``lm_head(norm(final))`` (the training objective's target, see
    :func:`eagle3nb.training.objective.target_probs`) with SGLang's ``input_token_logprobs`` (its lm_head over
    its final-normed state) for t = 1..T-1.

    Returns:
        ``{"max_abs_diff", "mean_abs_diff", "tolerance", "ok", "n_positions"}`` (log-prob units).
    """
    x = final.to(next(model.parameters()).device, next(model.parameters()).dtype)
    lp = (
        model.get_output_embeddings()(decoder_of(model).norm(x)).float().log_softmax(-1).cpu()
    )  # [T, V]
    ours = lp[:-1].gather(-1, torch.tensor(list(sample)[1:])[:, None])[:, 0]
    d = (ours - sglang_logprobs[1:].float()).abs()
    on_cuda = next(model.parameters()).device.type == "cuda"
    tol = (FINAL_LOGPROB_TOL_CUDA if on_cuda else FINAL_LOGPROB_TOL).get(dtype, 0.5)
    return {
        "max_abs_diff": float(d.max()),
        "mean_abs_diff": float(d.mean()),
        "tolerance": tol,
        "ok": bool(d.max() <= tol),
        "n_positions": int(d.numel()),
    }


def namespace_report(pid: int | None) -> dict:
    """Network interfaces and TCP listeners inside the worker's network namespace (``nsenter -n``,
    needs root), to show that only loopback exists there.

    Returns:
        ``{"interfaces": [names], "listeners": ["addr:port", ...], "loopback_only": bool}`` or
        ``{"error": reason}`` when it cannot look (not root, in-process engine).
    """
    if pid is None:
        return {"error": "engine runs in this process (no separate namespace)"}
    if os.geteuid() != 0:
        return {"error": "nsenter needs root"}
    try:
        links = subprocess.run(
            ["nsenter", "-t", str(pid), "-n", "ip", "-o", "link"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        ss = subprocess.run(
            ["nsenter", "-t", str(pid), "-n", "ss", "-Hltn"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": f"nsenter failed: {e}"}
    ifaces = [ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines() if ln.strip()]
    listeners = [ln.split()[3] for ln in ss.splitlines() if len(ln.split()) >= 4]
    return {"interfaces": ifaces, "listeners": listeners, "loopback_only": ifaces == ["lo"]}
