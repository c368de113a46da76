"""The wheel: eagle3nb built as a wheel and installed in a fresh virtual environment works without
the repository.

Builds the wheel from a clean copy of the checkout (the files git tracks plus untracked ones it does
not ignore, as a fresh clone would have them: building in the checkout itself reuses setuptools'
``build/lib``, which keeps modules that were deleted or moved), checks it holds every module of
``eagle3nb/`` and the package data, installs it with ``--no-deps`` into a ``python -m venv`` in a
temporary folder whose only view of the main environment's dependencies is a ``.pth`` line naming
their site-packages, and then, from a folder outside the repository with ``PYTHONPATH`` unset:
imports every subpackage and module (``pkgutil.walk_packages``; only engine-side modules that import
vLLM or SGLang when imported are skipped, found from the source), checks ``eagle3nb`` and its
default prompt file come from the new environment, and runs ``python -m eagle3nb.run --help`` and
the ``eagle3nb-run`` script.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE_SIDE = ("worker", "vllm_backend", "sglang_backend", "vllm_connector")
ENGINES = {"vllm", "sglang"}
DATA_FILES = {
    "eagle3nb/data/prompts_tinystories.txt",
    "eagle3nb/data/chat_stories.openai.jsonl",
    "eagle3nb/data/chat_stories.sharegpt.jsonl",
    "eagle3nb/data/chat_template_stories.jinja",
    "eagle3nb/data/bench_tinystories_mtbench.jsonl",
}


def _run(cmd: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if r.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, cmd))} exited {r.returncode}\n--- stdout\n{r.stdout[-4000:]}"
            f"\n--- stderr\n{r.stderr[-6000:]}",
            pytrace=False,
        )
    return r


def _checkout_copy(dest: Path) -> Path:
    """The files a fresh clone has (tracked, plus untracked files git does not ignore)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        ignore = shutil.ignore_patterns(
            ".git", ".venv", "outputs", "build", "dist", "*.egg-info", "__pycache__", "node_modules"
        )
        shutil.copytree(REPO, dest, ignore=ignore)
        return dest
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():  # a tracked file deleted in the work tree is not copied
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _imports_at_import_time(tree: ast.AST) -> set[str]:
    """Top-level names of the modules a file imports when it is imported (not inside functions)."""
    found = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
        todo.extend(ast.iter_child_nodes(node))
    return found


def _source_modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in sorted((root / "eagle3nb").rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


# run by the new environment's python, from outside the repository
IMPORT_ALL = r"""
import importlib, json, pkgutil, sys, traceback
import eagle3nb
from eagle3nb.text import prompts
skip = set(sys.argv[1].split(",")) - {""}
seen, failed = [], {}
def onerror(name):
    failed[name] = traceback.format_exc()
for info in pkgutil.walk_packages(eagle3nb.__path__, "eagle3nb.", onerror=onerror):
    seen.append(info.name)
    if info.name in skip or info.name.endswith(".__main__"):  # a __main__ runs its command
        continue
    try:
        importlib.import_module(info.name)
    except BaseException:
        failed[info.name] = traceback.format_exc()
print(json.dumps({"file": eagle3nb.__file__, "prompts": str(prompts.DEFAULT_PROMPTS),
                  "prompts_exist": prompts.DEFAULT_PROMPTS.is_file(),
                  "seen": seen, "failed": failed, "sys_path": sys.path}))
"""


def test_wheel_installs_and_imports_outside_the_repo(tmp_path):
    src = _checkout_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(dist),
            str(src),
        ],
        cwd=tmp_path,
    )
    wheels = list(dist.glob("eagle3nb-*.whl"))
    assert len(wheels) == 1, f"expected one eagle3nb wheel in {dist}: {sorted(dist.iterdir())}"
    wheel = wheels[0]

    # the wheel holds every module of the source tree and the package data, nothing else of ours
    names = set(zipfile.ZipFile(wheel).namelist())
    lacking = sorted({"eagle3nb/engines/worker.py", *DATA_FILES} - names)
    assert not lacking, (
        f"the wheel lacks {lacking} (pyproject.toml: [tool.setuptools.packages.find], "
        f"[tool.setuptools.package-data]); it holds {sorted(names)}"
    )
    source = _source_modules(src)
    wheel_py = {n for n in names if n.startswith("eagle3nb/") and n.endswith(".py")}
    src_py = {p.relative_to(src).as_posix() for p in source.values()}
    assert wheel_py == src_py, (
        f"modules in the source but not in the wheel: {sorted(src_py - wheel_py)}; "
        f"in the wheel but not in the source: {sorted(wheel_py - src_py)}"
    )

    # a fresh venv; the main environment's dependencies appended by a .pth (not the repo)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = Path(
        _run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    # a .venv inside the checkout (as CI makes it) is fine: its site-packages holds the editable
    # install's finder, which a .pth-appended path does not run; only the repo root itself would
    # put the source package on sys.path
    assert not any(Path(d).resolve() == REPO for d in deps), (
        f"the main environment's site-packages {list(deps)} is the repository root"
    )
    (site / "zz_main_env_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ]
    )

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    }
    env["PYTHONNOUSERSITE"] = "1"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # engine-side modules that import vLLM or SGLang when imported: only the engine's venv can
    side = {f"eagle3nb.engines.{n}" for n in ENGINE_SIDE}
    skip = sorted(
        m for m in side if _imports_at_import_time(ast.parse(source[m].read_text())) & ENGINES
    )
    r = _run([str(py), "-c", IMPORT_ALL, ",".join(skip)], cwd=elsewhere, env=env, timeout=180)
    got = json.loads(r.stdout.strip().splitlines()[-1])

    installed = Path(got["file"]).resolve()
    assert venv.resolve() in installed.parents, (
        f"eagle3nb was imported from {installed}, not from the new venv {venv}; sys.path: {got['sys_path']}"
    )
    assert all(REPO != Path(p).resolve() for p in got["sys_path"] if p), got["sys_path"]
    assert got["prompts_exist"] and venv.resolve() in Path(got["prompts"]).resolve().parents, got
    assert not got["failed"], "modules that do not import from the installed wheel:\n" + "\n".join(
        f"--- {m}\n{tb}" for m, tb in got["failed"].items()
    )
    expected = set(source) - {"eagle3nb"}
    assert set(got["seen"]) == expected, (
        f"pkgutil.walk_packages missed {sorted(expected - set(got['seen']))}, "
        f"found extra {sorted(set(got['seen']) - expected)}"
    )

    for cmd in (
        [str(py), "-m", "eagle3nb.run", "--help"],
        [str(venv / "bin" / "eagle3nb-run"), "--help"],
    ):
        r = _run(cmd, cwd=elsewhere, env=env)
        assert "Usage" in r.stdout, r.stdout
