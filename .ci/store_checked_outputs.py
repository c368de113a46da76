"""Execute the stored notebooks with their own defaults (as nbval does), keep the outputs of the
cells marked `# NBVAL_CHECK_OUTPUT` only, and strip everything else (plots, timings, widget state).

    .venv/bin/python .ci/store_checked_outputs.py          # refresh the outputs nbval compares
    .venv/bin/python .ci/store_checked_outputs.py --strip  # only strip, no execution
"""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NB = Path(__file__).resolve().parents[1] / "notebooks"
ORDER = ["01_generate", "02a_extract_vllm", "02b_extract_sglang", "03_train", "04_eval_acceptance"]


def strip(nb, executed=None):
    nb.metadata.pop("widgets", None)
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        keep = c.source.lstrip().startswith("# NBVAL_CHECK_OUTPUT")
        c.outputs = executed.cells[i].outputs if (keep and executed is not None) else ([] if not keep else c.outputs)
        for o in c.outputs:
            o.pop("execution_count", None)
        c.execution_count = i if keep else None  # nbval skips reference cells that look unrun
        c.metadata.pop("execution", None)
    return nb


def main():
    run = "--strip" not in sys.argv
    for name in ORDER:
        path = NB / f"{name}.ipynb"
        nb = nbformat.read(path, as_version=4)
        executed = None
        if run:
            executed = nbformat.read(path, as_version=4)
            NotebookClient(executed, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(NB)}}).execute()
        nbformat.write(strip(nb, executed), path)
        print("stored", path.name)


if __name__ == "__main__":
    main()
