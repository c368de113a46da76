"""vLLM in the workbook, notebook side: parameters and start (engine speed, for every engine:
:mod:`eagle3nb.engines.speed`; served acceptance: :mod:`eagle3nb.steps.evaluate.served`).

The engine itself runs behind :class:`eagle3nb.engines.client.EngineClient` (its own venv, or this
process when ``vllm_python: ""``); the backend is :mod:`eagle3nb.engines.vllm_backend`. Used by
01 (``generate_engine: vllm``), 02a (``vllm_extract``) and 04 (``eval_engines``).
"""

from __future__ import annotations

from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS, EngineClient, check_engine_python
from eagle3nb.engines.pool import open_engine

__all__ = [
    "VLLM_OPTION_KEYS",
    "vllm_steps",
    "vllm_python",
    "check_vllm_params",
    "start_vllm",
]

# keys the vLLM backend reads from ``vllm_options`` (eagle3nb/engines/vllm_backend.py docstring)
VLLM_OPTION_KEYS = {"max_model_len", "kv_cache_gib", "enforce_eager", "llm_kwargs", "max_num_seqs"}


def vllm_steps(p) -> list[str]:
    """The notebooks of run ``p`` that start vLLM."""
    return [
        nb
        for nb, on in (
            ("01_generate", p.generate_engine == "vllm"),
            ("02a_extract_vllm", p.vllm_extract),
            ("03_train", p.training_mode == "online" and p.online_engine == "vllm"),
            ("04_eval_acceptance", "vllm" in p.eval_engines),  # auto skips what cannot run
            ("05_drift", p.drift_matrix and any(s.startswith("vllm") for s in p.drift_sources)),
        )
        if on
    ]


def vllm_python(p) -> str:
    """``p.vllm_python`` with None = the cached venv of ``.ci/setup_engines.sh``; ``""`` = in-process."""
    return DEFAULT_ENGINE_PYTHONS["vllm"] if p.vllm_python is None else p.vllm_python


def check_vllm_params(p, model_cfg: dict) -> None:
    """Refuse, before any work, a run that uses vLLM and cannot start it.

    Raises:
        ValueError: an unknown ``vllm_options`` key; a target whose head_dim vLLM's CPU attention
            rejects (< 32, "Unsupported CPU attention configuration") on ``device: cpu``; on
            ``device: cpu`` an MLA target in float32 with ``llm_kwargs.attention_backend: AMX_MLA``
            (its weight packing refuses float32, ``v1/attention/backends/mla/amx_mla.py:303``;
            without the key the backend asks for CPU_MLA, :mod:`eagle3nb.engines.vllm_backend`).
        FileNotFoundError / ImportError: the vLLM venv is missing (names ``vllm_python`` and
            ``bash .ci/setup_engines.sh``).
    """
    bad = sorted(set(p.vllm_options) - VLLM_OPTION_KEYS)
    if bad:
        raise ValueError(
            f"vllm_options has unknown keys {bad}; allowed: {sorted(VLLM_OPTION_KEYS)} (anything else for vllm.LLM goes under llm_kwargs, e.g. {{llm_kwargs: {{tensor_parallel_size: 2}}}})"
        )
    used = vllm_steps(p)
    if not used:
        return
    check_engine_python("vllm", vllm_python(p), "vllm_python")
    hd = model_cfg.get("head_dim") or (
        model_cfg.get("hidden_size", 0) // max(model_cfg.get("num_attention_heads", 1), 1)
    )
    text = model_cfg.get("text_config") or model_cfg
    backend = (p.vllm_options.get("llm_kwargs") or {}).get("attention_backend")
    if p.device == "cpu" and text.get("kv_lora_rank") is not None and p.dtype == "float32":
        if str(backend).upper() == "AMX_MLA":  # measured: eagle3nb.boundaries.cpu_limits
            raise ValueError(
                f"vllm_options.llm_kwargs.attention_backend={backend!r} with dtype=float32 on model="
                f"{p.model!r} (MLA): AMX_MLA takes no float32 weights ('expect weight to be "
                "bfloat16, float16, int8, fp8_e4m3 or uint8', v1/attention/backends/mla/amx_mla.py"
                ":303); remove attention_backend (eagle3nb then asks for CPU_MLA, measured equal to "
                "HF in float32), or set dtype: bfloat16 (AMX_MLA unmeasured here)"
            )
    if p.device == "cpu" and hd < 32:
        raise ValueError(
            f"model={p.model!r} has head_dim={hd}; vLLM's CPU attention needs head_dim >= 32 (used by {used}); use a target with head_dim >= 32 (e.g. stories260K-hd32), or turn vLLM off: generate_engine: hf, vllm_extract: false, eval_engines without vllm"
        )


def start_vllm(
    p, model_path, dtype: str, workdir_parent, role: str | None = None, threads: int | None = None
) -> EngineClient:
    """Start the vLLM worker for run ``p`` (temp files and engine log under ``workdir_parent``), or
    hand back a running one of the same key when ``$EAGLE3NB_KEEP_ENGINES`` keeps workers
    (:mod:`eagle3nb.engines.pool`; its temp files are then in the system temp folder).
    ``role`` (e.g. ``"plain"``) makes a second worker of the same key, held beside the first
    (04 times with and without the drafter turn about on two workers); ``threads``: the
    worker's thread count (None: the run's budget, :mod:`eagle3nb.threads`)."""
    opts = dict(p.vllm_options)
    return open_engine(
        "vllm",
        model_path,
        dtype,
        opts,
        python=vllm_python(p),
        param="vllm_python",
        workdir_parent=workdir_parent,
        env={"EAGLE3NB_ENGINE_ROLE": role} if role else None,
        threads=threads,
    )
