"""nbval, for the notebooks: numbers that vary with the machine in the cells tagged
``nbval-check-output`` (tau, printed at its real precision) are masked before outputs are
compared, by the regexes of ``nbval_sanitize.cfg`` next to this file. Set here so that the test command
of README.md needs no ``--nbval-sanitize-with`` (one given on the command line wins)."""

from pathlib import Path

SANITIZE = Path(__file__).with_name("nbval_sanitize.cfg")


def pytest_configure(config):
    """Point nbval at ``nbval_sanitize.cfg`` unless ``--nbval-sanitize-with`` names a file."""
    if getattr(config.option, "nbval_sanitize_with", "") is None:
        config.option.nbval_sanitize_with = str(SANITIZE)


def pytest_collection_modifyitems(config, items):
    """nbval's cells carry the ``engines`` and ``slow`` marks (pyproject.toml): the notebooks
    re-run the session's smoke run, whose steps start vLLM and SGLang (``-m "not engines"`` and
    the contributors' fast command leave them out)."""
    import pytest

    here = Path(__file__).parent
    for item in items:
        if Path(str(item.path)).parent == here and str(item.path).endswith(".ipynb"):
            item.add_marker(pytest.mark.engines)
            item.add_marker(pytest.mark.slow)
