#!/usr/bin/env bash
# Create .venv and install eagle3nb with everything the workbook and its tests need (CPU).
# torch is pinned to the CPU wheel found on this machine kind; an unpinned torch pulls a CUDA build.
# Every package is held at the version in .ci/constraints.txt (pip -c), the environment the tests ran
# in; to move one, edit that file, rerun this script, run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
C=.ci/constraints.txt
.venv/bin/python -m pip install -q -c "$C" torch==2.13.0
.venv/bin/python -m pip install -q -c "$C" -e '.[dev]'
# the real engines (vLLM, SGLang), each in its own cached venv; EAGLE3NB_NO_ENGINES=1 skips them
[ "${EAGLE3NB_NO_ENGINES:-0}" = 1 ] || bash .ci/setup_engines.sh
.venv/bin/python -c "import torch, transformers, papermill, nbval, plotly; print('eagle3nb env ready: torch', torch.__version__, '| transformers', transformers.__version__)"
