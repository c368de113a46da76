"""Execute the stored notebooks with their own defaults (as nbval does), keep the outputs of the
cells tagged `nbval-check-output` only, and strip everything else (plots, timings, widget state).
Run it after changing what such a cell prints (docs/development.md#changing-a-notebook):

    .venv/bin/python notebooks/store_checked_outputs.py          # refresh the outputs nbval compares
    .venv/bin/python notebooks/store_checked_outputs.py --strip  # only strip, no execution
"""

import shutil
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

# run order: each notebook reads what the previous ones wrote
from eagle3nb.params import NOTEBOOKS as ORDER
from eagle3nb.params import RunParams
from eagle3nb.rundir import RunDir

NB = Path(__file__).resolve().parent
# the cell tag nbval (0.11, plugin.py metadata_tags) reads as the # NBVAL_CHECK_OUTPUT comment
CHECKED = "nbval-check-output"


def strip(nb, executed=None):
    nb.metadata.pop("widgets", None)
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        keep = CHECKED in c.metadata.get("tags", [])
        c.outputs = (
            executed.cells[i].outputs
            if (keep and executed is not None)
            else ([] if not keep else c.outputs)
        )
        for o in c.outputs:
            o.pop("execution_count", None)
        c.execution_count = i if keep else None  # nbval skips reference cells that look unrun
        c.metadata.pop("execution", None)
    return nb


def main():
    run = "--strip" not in sys.argv
    if run:  # a fresh smoke run: 03 refuses (rightly) to resume a checkpoint of other defaults
        smoke = RunDir(RunParams()).root
        shutil.rmtree(smoke, ignore_errors=True)
    for name in ORDER:
        path = NB / f"{name}.ipynb"
        nb = nbformat.read(path, as_version=4)
        executed = None
        if run:
            executed = nbformat.read(path, as_version=4)
            NotebookClient(
                executed,
                timeout=1200,
                kernel_name="python3",
                resources={"metadata": {"path": str(NB)}},
            ).execute()
        nbformat.write(strip(nb, executed), path)
        print("stored", path.name)


if __name__ == "__main__":
    main()
