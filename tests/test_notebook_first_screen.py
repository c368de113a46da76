"""The notebooks' first screen (issue 36 item 3): a title and three lines (what it does, what it
reads, what it writes), a parameters cell in groups (what to set first on top, scale-out knobs last)
whose comments fit a code cell that does not wrap, nbval's compared cells marked by a cell tag, and
one way to show a figure (``display(fig)``)."""

import re

import nbformat
import pytest

from eagle3nb.params import NOTEBOOKS, RunParams
from eagle3nb.params import sync
from eagle3nb.repo_paths import REPO_ROOT

CHECK_TAG = "nbval-check-output"


def _nb(name):
    return nbformat.read(REPO_ROOT / "notebooks" / f"{name}.ipynb", as_version=4)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_first_cell_is_a_title_and_three_lines(name):
    cell = _nb(name).cells[0]
    assert cell.cell_type == "markdown", f"{name}: the first cell must be the markdown header"
    lines = [line for line in cell.source.splitlines() if line.strip()]
    assert lines[0].startswith("# "), f"{name}: the header starts with a '# ' title"
    heads = [line.split("**")[1] if line.startswith("**") else line for line in lines[1:]]
    assert heads == ["Does:", "Reads:", "Writes:"], (
        f"{name}: after the title, three lines 'Does:', 'Reads:', 'Writes:' (the prose lives in "
        f"docs/notebooks.md); found {lines[1:]}"
    )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_parameters_cell_in_groups_with_short_comments(name):
    cell = next(c for c in _nb(name).cells if "parameters" in c.metadata.get("tags", []))
    seen, group = [], None
    for line in cell.source.splitlines():
        head = re.fullmatch(r"# --- (.+) ---", line)
        if head:
            group = head.group(1)
            assert group in sync.GROUPS and group not in seen, f"{name}: group line {line!r}"
            seen.append(group)
            continue
        key, _, comment = line.partition("  # ")
        key = key.split(" = ")[0]
        assert key in RunParams.model_fields, f"{name}: line {line!r} names no field"
        assert sync.group_of(key) == group, f"{name}: {key} sits under {group!r}"
        assert comment and len(comment) <= sync.MAX_CELL_HELP, (
            f"{name}: {key}'s comment is {len(comment)} characters (at most "
            f"{sync.MAX_CELL_HELP}); give it a short help in eagle3nb/data/parameter_cells.json"
        )
    assert seen == [g for g in sync.GROUPS if g in seen], f"{name}: groups out of order: {seen}"
    assert seen[0] == "run first"
    if "scale-out" in seen:
        assert seen[-1] == "scale-out"


def test_every_field_has_a_group_and_long_helps_a_short_one():
    fields = sync.CELLS["fields"]
    assert set(fields) == set(RunParams.model_fields)
    for name, entry in fields.items():
        assert entry["group"] in sync.GROUPS, name
        assert len(entry.get("short", "")) <= sync.MAX_CELL_HELP, name
    assert sync.GROUPS[-1] == "scale-out"


def test_installed_nbval_reads_the_check_output_tag():
    """The tag is nbval's, not ours: the installed plugin maps it to what the comment did."""
    from nbval.plugin import comment_markers, metadata_tags

    assert metadata_tags[CHECK_TAG] == comment_markers["NBVAL_CHECK_OUTPUT"] == "check"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_nbval_marks_are_tags_and_figures_are_displayed(name):
    for i, cell in enumerate(_nb(name).cells):
        if cell.cell_type != "code":
            continue
        assert "NBVAL_" not in cell.source, (
            f"{name} cell {i}: mark nbval's cells with a metadata tag ({CHECK_TAG}), not a comment"
        )
        if CHECK_TAG in cell.metadata.get("tags", []):
            assert cell.outputs, f"{name} cell {i}: tagged {CHECK_TAG} without stored outputs"
        for line in cell.source.splitlines():
            assert line.strip() != "fig" and ".show(" not in line, (
                f"{name} cell {i}: show a figure with display(fig), the one way used everywhere"
            )
