"""The package layout, read from the source with ``ast`` (nothing is imported).

Checks the import graph of ``eagle3nb/**/*.py`` (absolute ``eagle3nb.`` imports and relative ones,
module level or inside functions; imports under ``if TYPE_CHECKING:`` count for the direction
rules but not as cycles, since they never run):

- no import cycle between modules (the failure names the cycle, file:line per edge);
- boundaries/ (boundary b, engine ids, engine rules) imports no other eagle3nb module;
- the libraries (target/, text/, dataset/, training/, drafter/, viz/) never import
  ``eagle3nb.params``, ``eagle3nb.steps`` or ``eagle3nb.engines``: those sit above them;
- the engine side of engines/ (worker, the backends, the vLLM connector), which runs in the engine's
  own virtual environment, imports only the standard library, torch, safetensors, the engine and
  each other (and the packages it lives in, whose ``__init__`` runs on import);
- sizes: no module over 400 lines, no function over 80 lines in steps/;
- the package map in ``eagle3nb/__init__.py``'s docstring names every subpackage and module, and
  nothing that no longer exists.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import eagle3nb

REPO = Path(__file__).resolve().parents[1]
PKG_DIR = REPO / "eagle3nb"
PKG = "eagle3nb"

LIBRARIES = ("target", "text", "dataset", "training", "drafter", "viz")
ABOVE_LIBRARIES = ("eagle3nb.params", "eagle3nb.steps", "eagle3nb.engines")
ENGINE_SIDE = (
    "worker",
    "child_watch",
    "vllm_backend",
    "sglang_backend",
    "sglang_runner",
    "sglang_capture_ids",
    "sglang_netns",
    "sglang_ops",
    "sglang_transport",
    "sglang_forkserver",
    "sglang_spec_cpu",
    "sglang_spec_ops",
    "sglang_spec_versions",
    "sglang_spec_attn",
    "sglang_serve",
    "vllm_connector",
    "vllm_eager",
)
ENGINE_SIDE_THIRD_PARTY = {
    "torch",
    "safetensors",
    "vllm",
    "sglang",
    "psutil",
    "sgl_kernel",
    "zmq",
}  # psutil, sgl_kernel, zmq (pyzmq): SGLang's own
MAX_MODULE_LINES = 400
# Files allowed past MAX_MODULE_LINES, up to LISTED_MODULE_MAX, each with a one-line reason: a
# module that reads as one concern is better whole than split by size (issue 36).
LISTED_MODULE_MAX = 600
LONG_MODULES: dict[str, str] = {
    "eagle3nb/drafter/model.py": "the drafter in one readable file, every flavour of its head",
    "eagle3nb/training/loop.py": "one training loop, start to end, resume and init included",
    "eagle3nb/steps/train/step.py": "03's one step: checks, loop, export, card",
    "eagle3nb/boundaries/engine_read.py": "every id key and flag either engine reads, in one place",
    "eagle3nb/drafter/export.py": "export and load back of every head (Llama, MLA) and flavour",
    "eagle3nb/params/schema.py": "every run parameter once: default, range, help, notebooks",
    "eagle3nb/engines/vllm_backend.py": "the vLLM backend: its three engines and their checks",
}
MAX_STEP_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}
PACKAGES = {_module_name(p) for p in PKG_DIR.rglob("__init__.py")}


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to an absolute dotted name."""

    source: str  # importing module
    target: str  # an eagle3nb module (as written), or a top-level package name
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``

    @property
    def internal(self) -> bool:
        return self.target == PKG or self.target.startswith(PKG + ".")

    def where(self) -> str:
        return f"{MODULES[self.source].relative_to(REPO)}:{self.line}"


def _top(dotted: str) -> str:
    """Internal names stay whole (a module, or a name that does not exist); others -> top level."""
    return dotted if dotted == PKG or dotted.startswith(PKG + ".") else dotted.split(".")[0]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _ImportCollector(ast.NodeVisitor):
    def __init__(self, module: str):
        self.module = module
        self.found: list[Import] = []
        self._type_only = 0

    def _add(self, dotted: str, node: ast.AST) -> None:
        self.found.append(Import(self.module, _top(dotted), node.lineno, self._type_only > 0))

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.visit(node.test)
            self._type_only += 1
            for child in node.body:
                self.visit(child)
            self._type_only -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".")
            if self.module not in PACKAGES:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            parent = ".".join(base + ([node.module] if node.module else []))
        else:
            parent = node.module or ""
        if parent == "__future__":
            return
        for alias in node.names:
            sub = f"{parent}.{alias.name}"
            # ``from pkg import module`` imports the module; ``from module import name`` the module
            self._add(sub if sub in MODULES else parent, node)


def _imports_of(module: str) -> list[Import]:
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    collector = _ImportCollector(module)
    collector.visit(tree)
    return collector.found


IMPORTS: dict[str, list[Import]] = {m: _imports_of(m) for m in MODULES}


def _cycles(edges: dict[str, list[Import]]) -> list[list[Import]]:
    """One cycle (as its edges) per strongly connected component with a cycle (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in edges.get(v, []):
            w = e.target
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            components.append(comp)

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)

    cycles = []
    for comp in components:
        members = set(comp)
        start = min(comp)
        self_loop = [e for e in edges.get(start, []) if e.target == start]
        if len(comp) == 1:
            if self_loop:
                cycles.append(self_loop[:1])
            continue
        # breadth-first from start back to start inside the component: a shortest cycle
        prev: dict[str, Import] = {}
        frontier = [start]
        seen = {start}
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for e in edges.get(v, []):
                    if e.target == start:
                        found = e
                        break
                    if e.target in members and e.target not in seen:
                        seen.add(e.target)
                        prev[e.target] = e
                        nxt.append(e.target)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while path[0].source != start:
            path.insert(0, prev[path[0].source])
        cycles.append(path)
    return cycles


def _fail(message: str) -> None:
    pytest.fail(message, pytrace=False)


def _describe(cycle: list[Import]) -> str:
    chain = " -> ".join([cycle[0].source] + [e.target for e in cycle])
    hops = "\n".join(f"    {e.source} imports {e.target} at {e.where()}" for e in cycle)
    return f"  {chain}\n{hops}"


def test_the_source_is_what_the_test_reads():
    assert Path(eagle3nb.__file__).resolve().parent == PKG_DIR, (
        f"eagle3nb is imported from {eagle3nb.__file__}, not from {PKG_DIR}: the layout checks "
        "would read other files than the tests import"
    )
    assert len(MODULES) > 30 and "eagle3nb.engines.worker" in MODULES


def test_no_import_cycles():
    edges = {
        m: [e for e in imps if e.internal and not e.type_only and e.target in MODULES]
        for m, imps in IMPORTS.items()
    }
    cycles = _cycles(edges)
    if cycles:
        _fail(
            "import cycles between eagle3nb modules (imports inside functions count too; move what "
            "both sides need into a lower module, or pass it in as an argument):\n"
            + "\n".join(_describe(c) for c in cycles)
        )


def test_internal_imports_resolve():
    missing = [
        f"  {e.where()}: {e.target}"
        for imps in IMPORTS.values()
        for e in imps
        if e.internal and e.target not in MODULES
    ]
    if missing:
        _fail("imports of eagle3nb modules that do not exist:\n" + "\n".join(missing))


def test_libraries_do_not_import_params_steps_or_engines():
    bad = []
    for m, imps in IMPORTS.items():
        if m.split(".")[1:2] and m.split(".")[1] in LIBRARIES:
            for e in imps:
                if any(e.target == a or e.target.startswith(a + ".") for a in ABOVE_LIBRARIES):
                    bad.append(f"  {e.where()}: {m} imports {e.target}")
    if bad:
        _fail(
            f"{', '.join(d + '/' for d in LIBRARIES)} are libraries below "
            f"{', '.join(ABOVE_LIBRARIES)}; pass what they need as arguments instead:\n"
            + "\n".join(bad)
        )


def test_boundaries_is_the_ground_floor():
    """boundaries/ (boundary b, each engine's ids and rules) imports no other eagle3nb folder, so
    every layer above can read it and it can never read back a decision made above it."""
    bad = [
        f"  {e.where()}: {m} imports {e.target}"
        for m, imps in IMPORTS.items()
        if m == f"{PKG}.boundaries" or m.startswith(f"{PKG}.boundaries.")
        for e in imps
        if e.internal
        and not (e.target == f"{PKG}.boundaries" or e.target.startswith(f"{PKG}.boundaries."))
    ]
    if bad:
        _fail(
            "boundaries/ is the ground floor: it imports no other eagle3nb module:\n"
            + "\n".join(bad)
        )


def test_engine_side_imports_only_stdlib_torch_safetensors_and_the_engine():
    side = {f"{PKG}.engines.{n}" for n in ENGINE_SIDE}
    assert side <= set(MODULES), f"engine-side modules missing: {sorted(side - set(MODULES))}"
    # the packages these live in run their __init__ on import, in the engine's environment too
    checked = side | {PKG, f"{PKG}.engines"}
    allowed = set(sys.stdlib_module_names) | ENGINE_SIDE_THIRD_PARTY
    bad = []
    for m in sorted(checked):
        for e in IMPORTS[m]:
            ok = e.target in checked if e.internal else e.target in allowed
            if not ok:
                bad.append(f"  {e.where()}: {m} imports {e.target}")
    if bad:
        _fail(
            "the engine side of eagle3nb/engines/ runs in the engine's own virtual environment "
            "(another torch build, none of eagle3nb's other dependencies); it may import only the "
            f"standard library, {', '.join(sorted(ENGINE_SIDE_THIRD_PARTY))} and "
            f"{', '.join(sorted(checked))}:\n" + "\n".join(bad)
        )


def test_no_module_over_400_lines():
    long = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    over = []
    for m, n in long.items():
        rel = str(MODULES[m].relative_to(REPO))
        cap = LISTED_MODULE_MAX if rel in LONG_MODULES else MAX_MODULE_LINES
        if n > cap:
            over.append(f"  {rel}: {n} lines (cap {cap})")
    if over:
        _fail(
            f"modules over {MAX_MODULE_LINES} lines, or over {LISTED_MODULE_MAX} for those in "
            "LONG_MODULES (split by concern, or list the file with a one-line reason):\n"
            + "\n".join(over)
        )


def test_long_modules_listed_exist_with_reason():
    for rel, why in LONG_MODULES.items():
        assert (REPO / rel).is_file(), f"LONG_MODULES names {rel}, which does not exist"
        assert why.strip(), f"LONG_MODULES: {rel} needs a one-line reason"


def _long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = node.end_lineno - start + 1
            if n > limit:
                out.append(f"  {path.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_function_over_80_lines_in_steps():
    over = [
        line
        for m, p in MODULES.items()
        if m.startswith(f"{PKG}.steps.") or m == f"{PKG}.steps"
        for line in _long_functions(p, MAX_STEP_FUNCTION_LINES)
    ]
    if over:
        _fail(
            f"functions over {MAX_STEP_FUNCTION_LINES} lines in eagle3nb/steps/ (a step reads as a "
            "short sequence of named calls; move the parts into the libraries):\n" + "\n".join(over)
        )


_MAP_LINE = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<slash>/?) {2,}\S")


def _package_map(doc: str) -> dict[str, int]:
    """Dotted names the map in ``doc`` names -> docstring line; indented names are members of the
    subpackage (``name/``) above them, at any depth."""
    named: dict[str, int] = {}
    parents: list[tuple[int, str]] = []  # (indent, name) of the subpackages enclosing this line
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Package map")), len(lines))
    for i, line in enumerate(lines[start + 1 :], start + 2):
        m = _MAP_LINE.match(line)
        if not m:
            continue
        indent = len(m["indent"])
        while parents and parents[-1][0] >= indent:
            parents.pop()
        if indent and not parents:
            continue  # indented under a top-level module: not a member of anything
        dotted = ".".join([PKG, *(name for _, name in parents), m["name"]])
        named[dotted] = i
        if m["slash"]:
            parents.append((indent, m["name"]))
    return named


def _existing_names() -> set[str]:
    names = {m for m in MODULES if m != PKG}
    # folders of package data (no __init__.py) are in the map too
    for d in PKG_DIR.rglob("*"):
        if d.is_dir() and d.name != "__pycache__" and not d.name.startswith("."):
            names.add(_module_name(d / "__init__.py"))
    return names


def test_package_map_names_every_module():
    doc = ast.get_docstring(ast.parse((PKG_DIR / "__init__.py").read_text())) or ""
    named = _package_map(doc)
    assert named, (
        "eagle3nb/__init__.py's docstring has no package map (a 'Package map' line, then the map)"
    )
    existing = _existing_names()
    missing = sorted(existing - set(named))
    stale = sorted(set(named) - existing)
    if missing or stale:
        _fail(
            "eagle3nb/__init__.py's package map (one line per subpackage 'name/   purpose', its modules "
            "indented under it, then top-level modules 'name   purpose'; two spaces or more before "
            "the purpose) is out of date:\n"
            + "".join(f"  not in the map: {n}\n" for n in missing)
            + "".join(
                f"  in the map (docstring line {named[n]}) but not in the package: {n}\n"
                for n in stale
            )
        )
