"""The parameter surface rendered: notebooks' parameters cells and the parameter table of
docs/parameters.md, from RunParams.

python -m eagle3nb.params sync           # write them
python -m eagle3nb.params sync --check   # only say what is out of step (exit 1)
"""

from __future__ import annotations

import json
from pathlib import Path


from eagle3nb.repo_paths import REPO_ROOT

from eagle3nb.params.schema import ALL, NOTEBOOKS, RUN_LEVEL, RunParams


NB_DIR = REPO_ROOT / "notebooks"
# the documentation page holding the table of every parameter (between the two markers)
PARAMS_PAGE = REPO_ROOT / "docs" / "parameters.md"
TABLE_BEGIN, TABLE_END = "<!-- params:begin -->", "<!-- params:end -->"
SYNC_COMMAND = "python -m eagle3nb.params sync"


def _extra(name: str) -> dict:
    return RunParams.model_fields[name].json_schema_extra


def declared_by(name: str) -> list[str] | str:
    """The notebooks whose parameters cell declares field ``name``, or :data:`RUN_LEVEL`."""
    return _extra(name)["notebooks"]


def default_of(name: str):
    """Field ``name``'s default (a fresh one for fields with a default factory)."""
    return RunParams.model_fields[name].get_default(call_default_factory=True)


# each field's group (cells list them in this order) and, where its schema help is long, a short
# one: a code cell does not wrap, so a cell line's comment keeps to about 80 characters
CELLS = json.loads((Path(__file__).parents[1] / "data" / "parameter_cells.json").read_text())
GROUPS: list[str] = CELLS["groups"]
MAX_CELL_HELP = 80


def group_of(name: str) -> str:
    """Field ``name``'s group in the parameters cells (one of :data:`GROUPS`).

    Raises:
        KeyError: ``name`` has no entry in eagle3nb/data/parameter_cells.json (add one).
    """
    return CELLS["fields"][name]["group"]


def help_of(name: str, notebook: str | None = None) -> str:
    """Field ``name``'s full help (the schema's, as docs/parameters.md shows it); with ``notebook``,
    the comment of its line in that notebook's parameters cell: the notebook's own wording where it
    has one, cut to the short help of eagle3nb/data/parameter_cells.json where it runs long."""
    if notebook is None:
        return RunParams.model_fields[name].description
    entry = CELLS["fields"][name]
    own = _extra(name).get("notebook_help", {}).get(notebook)
    if own is not None:
        return own if len(own) <= MAX_CELL_HELP else entry["short_in"][notebook]
    return entry.get("short", RunParams.model_fields[name].description)


def literal(value) -> str:
    """``value`` as the Python literal a parameters cell holds (strings in double quotes)."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def parameters_cell(notebook: str) -> str:
    """The source of ``notebook``'s ``parameters`` cell: one ``name = literal  # short help`` line
    per field it declares, under a ``# --- group ---`` line per group (:data:`GROUPS` order, what to
    set first on top, scale-out knobs last), in RunParams order within a group.

    Raises:
        ValueError: ``notebook`` is not one of :data:`NOTEBOOKS`.
    """
    if notebook not in NOTEBOOKS:
        raise ValueError(f"notebook={notebook!r} is unknown; use one of {NOTEBOOKS}")
    names = [n for n in RunParams.model_fields if notebook in declared_by(n)]
    lines = []
    for group in GROUPS:
        mine = [n for n in names if group_of(n) == group]
        if mine:
            lines.append(f"# --- {group} ---")
            lines += [f"{n} = {literal(default_of(n))}  # {help_of(n, notebook)}" for n in mine]
    return "\n".join(lines)


def params_table() -> str:
    """docs/parameters.md's table of all parameters: name, default, notebooks that declare it, help."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| parameter | default | notebooks | help |", "|---|---|---|---|"]
    for n in RunParams.model_fields:
        nbs = declared_by(n)
        where = (
            "run-level (`eagle3nb.run`)"
            if nbs == RUN_LEVEL
            else "all"
            if tuple(nbs) == ALL
            else ", ".join(nb.split("_")[0] for nb in nbs)
        )
        notes = "".join(
            f"<br>in {nb.split('_')[0]}: {h}"
            for nb, h in _extra(n).get("notebook_help", {}).items()
        )
        rows.append(
            f"| `{n}` | `{literal(default_of(n))}` | {where} | {cell(help_of(n) + notes)} |"
        )
    return "\n".join(rows)


def page_with_table(text: str) -> str:
    """``text`` (docs/parameters.md) with the table between its markers rendered from RunParams.

    Raises:
        ValueError: the markers are not there exactly once each.
    """
    if text.count(TABLE_BEGIN) != 1 or text.count(TABLE_END) != 1:
        raise ValueError(
            f"{PARAMS_PAGE} must hold {TABLE_BEGIN} and {TABLE_END} once each (the parameter table goes between them)"
        )
    head, rest = text.split(TABLE_BEGIN)
    _, tail = rest.split(TABLE_END)
    return f"{head}{TABLE_BEGIN}\n{params_table()}\n{TABLE_END}{tail}"


def _parameters_cell_of(nb, path: Path):
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(
            f"{path}: {len(cells)} cells tagged 'parameters'; a notebook needs exactly one"
        )
    return cells[0]


def out_of_step() -> list[Path]:
    """The files whose rendering of RunParams differs from :func:`parameters_cell` / :func:`params_table`."""
    import nbformat

    stale = [
        NB_DIR / f"{name}.ipynb"
        for name in NOTEBOOKS
        if _parameters_cell_of(
            nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4), NB_DIR / f"{name}.ipynb"
        ).source
        != parameters_cell(name)
    ]
    text = PARAMS_PAGE.read_text()
    return stale + ([PARAMS_PAGE] if page_with_table(text) != text else [])


def sync() -> list[Path]:
    """Write each notebook's parameters cell (and nothing else in it) and the table of
    docs/parameters.md from RunParams; returns the files changed."""
    import nbformat

    changed = []
    for name in NOTEBOOKS:
        path = NB_DIR / f"{name}.ipynb"
        nb = nbformat.read(path, as_version=4)
        cell = _parameters_cell_of(nb, path)
        if cell.source != parameters_cell(name):
            cell.source = parameters_cell(name)
            nbformat.write(nb, path)
            changed.append(path)
    text = PARAMS_PAGE.read_text()
    if page_with_table(text) != text:
        PARAMS_PAGE.write_text(page_with_table(text))
        changed.append(PARAMS_PAGE)
    return changed


def _cli():
    import typer

    app = typer.Typer(
        add_completion=False,
        help="The parameter surface: RunParams rendered into the notebooks' parameters cells and docs/parameters.md.",
    )

    @app.command("sync")
    def sync_cmd(
        check: bool = typer.Option(
            False, "--check", help="change nothing; exit 1 when a file is out of step"
        ),
    ):
        """Write notebooks/*.ipynb parameters cells and docs/parameters.md's parameter table from RunParams."""
        files = out_of_step() if check else sync()
        for f in files:
            typer.echo(f"{'out of step' if check else 'wrote'}: {f.relative_to(REPO_ROOT)}")
        if check and files:
            typer.echo(f"run: {SYNC_COMMAND}", err=True)
            raise typer.Exit(1)
        if not files:
            typer.echo(
                "in step: notebooks/*.ipynb parameters cells and docs/parameters.md match RunParams"
            )

    @app.command("show")
    def show_cmd(notebook: str = typer.Argument(..., help=f"one of {', '.join(NOTEBOOKS)}")):
        """Print a notebook's parameters cell as rendered from RunParams."""
        typer.echo(parameters_cell(notebook))

    app()
