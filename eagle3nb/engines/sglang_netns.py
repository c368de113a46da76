"""Engine side: a loopback-only network namespace for the SGLang worker (its scheduler's torch
TCPStore listens on all interfaces whatever ``host`` says). Imports only stdlib."""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["loopback_prefix"]


def loopback_prefix() -> list[str]:
    """Command prefix that runs the worker in a network namespace whose only interface is loopback.

    SGLang's scheduler opens a torch TCPStore on all interfaces whatever ``host`` says; inside a
    fresh network namespace "all interfaces" is ``lo`` alone. Root: ``unshare -n``; otherwise an
    unprivileged user namespace (``unshare -r -n``) where the kernel allows one. Pipes (stdin/stdout)
    cross the namespace; TCP to the parent does not.

    Returns:
        argv prefix; append the worker's argv.

    Raises:
        RuntimeError: neither form works here (no ``unshare``/``ip``, or namespaces not permitted),
            naming the fallback: set ``EAGLE3NB_ENGINE_NETNS=off`` to run without the namespace on a
            host whose firewall already keeps other machines out.
    """
    if os.environ.get("EAGLE3NB_ENGINE_NETNS", "on") == "off":
        return []
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not unshare or not ip:
        raise RuntimeError(
            "running the SGLang worker loopback-only needs `unshare` (util-linux) and `ip` (iproute2); install them, or set EAGLE3NB_ENGINE_NETNS=off to run it in the host network namespace (its TCPStore then listens on all interfaces)"
        )
    tail = ["sh", "-c", f'{ip} link set lo up && exec "$0" "$@"']
    for flags in (["-n"], ["-r", "-n"]) if os.geteuid() == 0 else (["-r", "-n"],):
        probe = subprocess.run(
            [unshare, *flags, "--", "sh", "-c", f"{ip} link set lo up"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode == 0:
            return [unshare, *flags, "--", *tail]
    raise RuntimeError(
        f"cannot create a loopback-only network namespace here (`unshare -n` / `unshare -r -n` failed: {probe.stderr.strip()[:200]}); run as root or allow unprivileged user namespaces, or set EAGLE3NB_ENGINE_NETNS=off to run the SGLang worker in the host network namespace (its TCPStore then listens on all interfaces)"
    )
