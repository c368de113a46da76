"""Code style: the repository is formatted by ``ruff format`` and passes ``ruff check``.

Both use ``pyproject.toml``'s ``[tool.ruff]`` settings and the ruff of the running environment
(pinned in the ``dev`` extra, because the formatter's output changes between ruff versions). A
failure shows ruff's own report and the command that fixes it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUFF = [sys.executable, "-m", "ruff"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run([*RUFF, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ruff {' '.join(args)} ran past 300 s: {e}", pytrace=False)
    if r.returncode != 0 and "No module named ruff" in r.stderr:
        pytest.fail(
            f"ruff is not installed in {sys.executable}'s environment; "
            f"{sys.executable} -m pip install -e '.[dev]' installs the pinned one",
            pytrace=False,
        )
    return r


def _report(r: subprocess.CompletedProcess, limit: int = 20000) -> str:
    out = (r.stdout + r.stderr).strip()
    return out if len(out) <= limit else out[:limit] + f"\n... ({len(out) - limit} more characters)"


def test_ruff_format():
    r = _ruff("format", "--check", "--output-format", "concise", ".")
    if r.returncode != 0:
        pytest.fail(
            f"ruff format --check (exit {r.returncode}):\n{_report(r)}\n\n"
            f"see the changes: {sys.executable} -m ruff format --diff .\n"
            f"fix with: {sys.executable} -m ruff format .",
            pytrace=False,
        )


def test_ruff_check():
    r = _ruff("check", "--no-fix", "--output-format", "full", ".")
    if r.returncode != 0:
        pytest.fail(
            f"ruff check (exit {r.returncode}):\n{_report(r)}\n\n"
            f"fix with: {sys.executable} -m ruff check --fix . (what it cannot fix, by hand)",
            pytrace=False,
        )
