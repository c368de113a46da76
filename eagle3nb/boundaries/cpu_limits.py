"""What each engine version is measured not to run on CPU, per architecture class and per config
(:data:`CPU_LIMITS`, :data:`CPU_CONFIG_LIMITS`), read by preflight before any notebook runs
(tests/test_cpu_refusals.py). Each version's limits, with how they were measured, live in its file
in :mod:`eagle3nb.boundaries.versions`; this module gathers them. Measured on this machine kind
(``../shared/reference/architectures.md`` sections 3 and 4).
"""

from __future__ import annotations

from eagle3nb.boundaries.versions import VERSIONS

__all__ = ["CPU_LIMITS", "CPU_CONFIG_LIMITS", "cpu_limit", "cpu_config_limit"]

# (engine, version, class) -> {use: why it fails on CPU}; use "capture" (02a/02b), "serve" (04,
# the Llama head) or "serve_mla" (04, the MLA head: drafter_head mla)
CPU_LIMITS: dict[tuple[str, str, str], dict[str, str]] = {
    (vf.engine, vf.version, arch): dict(uses)
    for vf in VERSIONS.values()
    for arch, uses in vf.cpu_limits.items()
}
# (engine, version, class) -> [(use, test(cfg) -> why it fails or None)]: limits that depend on the
# target's config (eagle3nb.boundaries.cpu_checks)
CPU_CONFIG_LIMITS = {
    (vf.engine, vf.version, arch): list(tests)
    for vf in VERSIONS.values()
    for arch, tests in vf.cpu_config_limits.items()
}


def cpu_limit(engine: str, version: str, arch: str, use: str) -> str | None:
    """Why ``engine`` at ``version`` cannot ``use`` ("capture", "serve" or "serve_mla") a target of class
    ``arch`` on CPU, as measured here; None where nothing is known to fail."""
    return CPU_LIMITS.get((engine, str(version).split("+")[0], arch), {}).get(use)


def cpu_config_limit(engine: str, version: str, arch: str, cfg: dict, use: str) -> str | None:
    """Why ``engine`` at ``version`` cannot ``use`` a target of class ``arch`` with this text
    config (``cfg``: config.json's text model) on CPU: :func:`cpu_limit`'s class-wide reason, else
    a config-dependent one (:data:`CPU_CONFIG_LIMITS`: vLLM MLA latent width and YaRN, gpt-oss
    YaRN factor, Llama-4 chunk size); None where nothing is known to fail."""
    why = cpu_limit(engine, version, arch, use)
    if why:
        return why
    for u, test in CPU_CONFIG_LIMITS.get((engine, str(version).split("+")[0], arch), []):
        if u == use and (why := test(cfg)):
            return why
    return None


# vLLM 0.32's CPU attention (CPU_ATTN) head sizes, v1/attention/backends/cpu_attn.py:69-70
# (get_supported_head_sizes); a drafter's layer runs on it as the target's do (issue 43 item 3)
VLLM_CPU_HEAD_SIZES = {"0.32.0": (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)}


def cpu_drafter_limit(engine: str, version: str, drafter_cfg: dict) -> str | None:
    """Why ``engine`` at ``version`` cannot run the drafter whose config.json is ``drafter_cfg``
    (eagle3nb's form: ``head_dim`` at the top level) on CPU: vLLM's CPU attention head sizes
    (:data:`VLLM_CPU_HEAD_SIZES`; an MLA drafter runs on CPU_MLA, :data:`CPU_CONFIG_LIMITS`); None
    where nothing is known to fail."""
    sizes = VLLM_CPU_HEAD_SIZES.get(str(version).split("+")[0]) if engine == "vllm" else None
    hd = drafter_cfg.get("head_dim")
    if sizes is None or hd is None or "kv_lora_rank" in drafter_cfg or int(hd) in sizes:
        return None
    return (
        f"the drafter's head_dim={hd} is not a head size of vLLM {version}'s CPU attention "
        f"{list(sizes)} (v1/attention/backends/cpu_attn.py:69-70, checked at engine build: "
        "'head_size not supported', v1/attention/backend.py:103, 300); serve it on GPU, or retrain with a head_dim it takes "
        "(draft_num_heads so that hidden_size / heads is one of them)"
    )
