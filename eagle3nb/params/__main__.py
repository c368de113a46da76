"""``python -m eagle3nb.params sync [--check]`` / ``show NOTEBOOK`` (see :mod:`eagle3nb.params.sync`)."""

from eagle3nb.params.sync import _cli

_cli()
