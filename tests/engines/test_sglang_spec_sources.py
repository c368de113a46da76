"""Each SGLang version's table of the CPU stand-ins (eagle3nb.engines.sglang_spec_versions) against
that version's own wheel: every op's schema is its ``sgl_kernel`` wrapper's argument list, passed to
``torch.ops.sgl_kernel.<op>`` positionally in that order (what the registered stand-in receives);
every cited chain caller calls that op there; every patched method sits at its cited line. Read with
``ast`` from the venv's files, no engine started: SGLang 0.5.23 from CI's venv, 0.5.22 from the
bench's (``bash bench/setup_engine_versions.sh``, outside CI: skipped with the reason where absent,
testkit.version_site_packages)."""

import ast
import re

import pytest

from testkit import requires_engine, version_site_packages
from eagle3nb.engines import sglang_spec_versions as sv

_DEF = {
    "DraftBackendFactory._create_backend": "def _create_backend(",
    "TorchNativeAttnBackend.forward_extend": "def forward_extend(",
    "TorchNativeAttnBackend._run_sdpa_forward_decode": "def _run_sdpa_forward_decode(",
    "run_scheduler_process": "def run_scheduler_process(",
}


def _at(root, cite: str) -> tuple[list[str], int]:
    rel, line = cite.rsplit(":", 1)
    return (root / rel).read_text().splitlines(), int(line)


def _schema_names(schema: str) -> list[str]:
    return [arg.split()[-1] for arg in schema.split(",")]


def _wrapper(root, cite: str, name: str) -> tuple[list[str], list[str]]:
    """The wrapper at ``cite``: its parameter names, and the names it passes to the op."""
    rel, line = cite.rsplit(":", 1)
    tree = ast.parse((root / rel).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    assert fn.lineno == int(line), f"{rel}: def {name} at line {fn.lineno}, cited {line}"
    call = next(
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == f"torch.ops.sgl_kernel.{name}"
    )
    assert not call.keywords, f"{name}: the wrapper passes keywords; the schema order is not enough"
    return [a.arg for a in fn.args.args], [ast.unparse(a) for a in call.args]


# CI's venv holds 0.5.23 (the engines mark); the bench's venvs hold the others (skipped without)
VERSIONS = [
    pytest.param(v, marks=requires_engine("sglang", v)) if v == "0.5.23" else v for v in sv.VERSIONS
]


@pytest.mark.parametrize("version", VERSIONS)
def test_each_versions_table_holds_in_its_own_wheel(version):
    root = version_site_packages("sglang", version)
    for name, site in sv.table(version).items():
        params, passed = _wrapper(root, site.wrapper, name)
        assert _schema_names(site.schema) == params == passed, (version, name)
        for cite in site.callers:
            lines, n = _at(root, cite)
            assert re.search(rf"\b\w*{name}\(", lines[n - 1]), f"{version} {cite}: {lines[n - 1]!r}"
    for method, cite in sv.PATCHED[version].items():
        lines, n = _at(root, cite)
        assert lines[n - 1].strip().startswith(_DEF[method]), f"{version} {cite}: {method}"
