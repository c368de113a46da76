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
