"""Run parameters: one validated model for params/*.yaml and every notebook's parameters cell.

Each parameter is written once, as a field of :class:`RunParams`: its default, its range, its help
(the field's ``description``) and the notebooks that declare it. The ``parameters`` cell of each
notebook and the parameter table of docs/parameters.md are rendered from these fields
(:func:`eagle3nb.params.sync.parameters_cell`, :func:`~eagle3nb.params.sync.params_table`) and written by::

    python -m eagle3nb.params sync           # notebooks/*.ipynb parameters cells + docs/parameters.md
    python -m eagle3nb.params sync --check   # only say what is out of step (exit 1)

Papermill only warns about unknown parameters; here an unknown key, a wrong type or an
out-of-range value fails before any work starts, naming the key, the value and the fix.

Modules: ``schema`` (RunParams and the notebook groups), ``load`` (YAML files, a notebook's
globals, the device; errors that name the fix), ``sync`` (rendering into notebooks and docs/parameters.md).
"""

from eagle3nb.params.load import (
    collect,
    load_params,
    load_run_params,
    parse_sets,
    resolve_device,
)
from eagle3nb.params.schema import ALL, NOTEBOOKS, RENAMED, RUN_LEVEL, VLLM, RunParams

__all__ = [
    "RunParams",
    "NOTEBOOKS",
    "ALL",
    "VLLM",
    "RUN_LEVEL",
    "RENAMED",
    "load_params",
    "load_run_params",
    "parse_sets",
    "collect",
    "resolve_device",
]
