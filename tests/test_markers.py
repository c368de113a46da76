"""The test marks (pyproject.toml ``markers``; docs/development.md#tests): one ``requires_engine`` for the
engine venvs instead of a skip per file, and engine starts refused in every test without the
``engines`` mark (tests/conftest.py refuses their EngineClient starts), so the contributors' fast command
``-m "not engines and not browser and not slow"`` never starts an engine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import testkit
from testkit import ENGINE_PYTHONS, engine_skip_reason, requires_engine

from eagle3nb.engines import client

_INIT = client.EngineClient.__init__

TESTS = Path(__file__).parent
# a skip written by hand for an engine venv: skipif(...)/skip(...) whose text names a venv or the
# engine pythons (testkit.engine_skip_reason is the one wording; vLLM 0.26.0's sdist sources,
# not a venv, keep their own skip in tests/boundaries/test_rules.py)
OWN_SKIP = re.compile(
    r"(?:skipif|\.skip)\((?:[^()]|\([^()]*\))*?(?:venv|ENGINE_PYTHONS|isfile\(PY)", re.S
)


def test_no_test_file_carries_its_own_engine_venv_skip():
    found = []
    for f in sorted(TESTS.rglob("*.py")):
        if f.name in ("testkit.py", "test_markers.py") or "node_modules" in f.parts:
            continue
        for m in OWN_SKIP.finditer(f.read_text()):
            line = f.read_text()[: m.start()].count("\n") + 1
            found.append(f"{f.relative_to(TESTS)}:{line}")
    assert not found, f"use testkit.requires_engine(engine) instead of a skip of your own: {found}"


def test_the_pattern_finds_the_old_copies():
    """The check above can fail: the three shapes the copies had are found."""
    old = [
        'pytestmark = pytest.mark.skipif(\n    not Path(VLLM_PY).is_file(),\n    reason=f"vLLM'
        ' engine venv absent ({VLLM_PY})",\n)',
        '@pytest.mark.skipif(not os.path.isfile(PY), reason=f"SGLang venv absent ({PY})")',
        '    if not all(roots.values()):\n        pytest.skip(f"engine venvs absent: {roots} '
        '(bash .ci/setup_engines.sh)")',
    ]
    assert all(OWN_SKIP.search(s) for s in old)
    assert not OWN_SKIP.search('@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")')


def test_requires_engine_is_the_engines_mark_and_refuses_unknown_engines():
    mark = requires_engine("sglang", "0.5").mark
    assert (mark.name, mark.args, mark.kwargs) == ("engines", ("sglang",), {"version": "0.5"})
    with pytest.raises(ValueError, match=r"requires_engine\('hf'\).*'vllm', 'sglang'"):
        requires_engine("hf")


def test_skip_reason_names_the_absent_venv_and_the_command(monkeypatch, tmp_path):
    gone = str(tmp_path / "vllm" / "bin" / "python")
    monkeypatch.setitem(testkit.ENGINE_PYTHONS, "vllm", gone)
    assert engine_skip_reason("vllm") == (
        f"vllm engine venv absent ({gone}); create it with `bash .ci/setup_engines.sh`"
    )


def test_a_test_without_the_mark_cannot_start_an_engine():
    """What an unmarked test that starts an engine meets: refused before any process starts,
    naming the mark (the installed engine is there: only the start is refused)."""
    with pytest.raises(
        RuntimeError, match=r"not marked requires_engine.*requires_engine\('vllm'\)"
    ):
        client.EngineClient("vllm", "m", python=ENGINE_PYTHONS["vllm"], param="vllm_python")
    with pytest.raises(RuntimeError, match=r"requires_engine\('sglang'\)"):
        client.EngineClient("sglang", "m", python=ENGINE_PYTHONS["sglang"])


@requires_engine("vllm", "0.32")
def test_a_marked_test_gets_the_installed_engine_and_version_skips_name_both():
    assert client.EngineClient.__init__ is _INIT  # starts allowed
    reason = engine_skip_reason("vllm", "9.")
    assert reason.startswith("needs vllm 9.*, the venv") and "has 0.32" in reason
