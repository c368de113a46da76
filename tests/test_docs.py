"""The documentation (issue 36 items 1-2): a short README, docs/ pages built by mkdocs without a
warning, pointers into them that resolve, and generated pages and numbers that are current.

The anchors are read from the site mkdocs builds (the ids of its headings), not computed here, so a
pointer is checked against what a reader's browser will find.
"""

import json
import re
import subprocess
import sys

import pytest

from eagle3nb import results_page
from eagle3nb.repo_paths import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
MAX_README_LINES = 260
# a pointer from code or config into the docs: docs/<page>.md, optionally #<anchor>
POINTER = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with --strict into a temp folder: (output, {page: set of anchor ids})."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    anchors = {
        p.with_suffix(".md").name: set(re.findall(r'\sid="([^"]+)"', p.read_text()))
        for p in out.glob("*.html")
    }
    return out, log, anchors


def test_site_builds_strict_without_a_warning(site):
    out, log, anchors = site
    assert "WARNING" not in log, log
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages <= set(anchors), f"pages not built: {pages - set(anchors)}"
    # offline: no script or stylesheet from the network
    for html in out.rglob("*.html"):
        remote = re.findall(
            r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', html.read_text()
        )
        assert not remote, f"{html.name} loads {remote}"


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The strict build is a real check: a page with a dead link and a dead anchor fails it."""
    import shutil

    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path)
    page = tmp_path / "docs" / "concepts.md"
    page.write_text(page.read_text() + "\n[a](no-such-page.md) [b](engines.md#no-such-heading)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr and "no-such-heading" in proc.stderr


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, (
        f"README.md has {n} lines (cap {MAX_README_LINES}): move detail to a docs/ page"
    )


def _check_pointer(page, anchor, anchors, where):
    assert (DOCS / page).is_file(), f"{where}: docs/{page} does not exist"
    if anchor:
        assert anchor in anchors[page], (
            f"{where}: docs/{page} has no heading #{anchor}; its anchors: {sorted(anchors[page])}"
        )


def test_readme_links_resolve(site):
    _, _, anchors = site
    for target in LINK.findall(README.read_text()):
        if target.startswith(("http://", "https://", "#")):
            continue
        path, _, anchor = target.partition("#")
        assert (REPO_ROOT / path).exists(), f"README.md links to {path}, which does not exist"
        if path.startswith("docs/") and path.endswith(".md"):
            _check_pointer(path.removeprefix("docs/"), anchor, anchors, "README.md")


def _pointer_sources():
    yield from (REPO_ROOT / "eagle3nb").rglob("*.py")
    yield from (REPO_ROOT / "notebooks").glob("*.ipynb")
    yield from (REPO_ROOT / "notebooks").glob("*.py")
    yield from (REPO_ROOT / "params").glob("*.yaml")
    yield from (REPO_ROOT / ".ci").glob("*")
    yield from (REPO_ROOT / "bench").glob("*.py")


def test_pointers_into_the_docs_name_a_page_and_heading(site):
    _, _, anchors = site
    found = 0
    for src in _pointer_sources():
        text = src.read_text()
        for page, anchor in POINTER.findall(text):
            _check_pointer(page, anchor, anchors, src.relative_to(REPO_ROOT))
            found += 1
        # the old form ("see README 'Scale out'") points at sections the README no longer has;
        # README.md of a drafter folder (the model card) is a file name, not a pointer
        stale = re.findall(r"README(?!\.md)[^\n]{0,40}", text)
        assert not stale, f"{src.relative_to(REPO_ROOT)}: points into the README: {stale}"
    assert found >= 3


def test_results_page_is_what_the_command_writes():
    want = results_page.render_from_files()
    assert results_page.PAGE.read_text() == want, (
        f"docs/results.md differs from its inputs; run `{results_page.COMMAND}`"
    )


def test_results_page_shows_the_reference_numbers():
    """The page's main table carries the reference run's numbers (read independently here)."""
    ref = json.loads(results_page.REFERENCE.read_text())
    page = results_page.PAGE.read_text()
    for name, tau in ref["eval"]["tau"].items():
        assert re.search(rf"\| `{re.escape(name)}` \| {tau} \|", page), name
    assert ref["measured"] in page


def _reference():
    return json.loads(results_page.REFERENCE.read_text())


def test_readme_headline_is_the_reference_run():
    """The one number the README states comes from the same source as docs/results.md, and it
    is the only dated number there."""
    ref, text = _reference(), README.read_text()
    tau = ref["eval"]["tau"]
    headline = [ln for ln in text.split("\n\n") if "held-out tau" in ln]
    assert len(headline) == 1, "README.md needs one paragraph with the headline 'held-out tau'"
    para = " ".join(headline[0].split())
    served = [k for k in tau if "served by" in k and "offset" not in k]
    assert served, "the reference run has no engine-served tau"
    for key in ["trained", "trained, layer offset", *served]:
        assert f"{tau[key]:.4f}" in para, f"README headline lacks {key} tau {tau[key]:.4f}"
    assert ref["measured"][:10] in para
    dates = set(re.findall(r"\b20\d\d-\d\d-\d\d\b", text))
    assert dates <= {ref["measured"][:10]}, f"dated numbers in README.md: {sorted(dates)}"


def test_readme_keeps_the_newcomer_commands():
    """.ci/run runs the README's test command; the main-job command stays as it was."""
    text = README.read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    test_cmd = [ln for ln in ci if "pytest" in ln]
    assert len(test_cmd) == 1 and test_cmd[0] in text.splitlines()
    assert "bash .ci/setup.sh && .venv/bin/python -m eagle3nb.run params/default.yaml" in text
