"""What an offline bundle holds: which engine version a host's torch allows, the wheels that engine
path and eagle3nb's headless notebooks need beyond the host's image, and what is pruned.

Facts from ``../shared/reference/gpu_engines_h200.md`` (measured on the H200 host, 2026-12-03) and
from the wheels themselves (``Requires-Dist: torch==`` in the engine wheel's METADATA, re-read at
every build: :func:`eagle3nb.offline.bundle.build` refuses a wheel whose pin differs from this
table). Versions of the extra wheels were resolved here for CPython 3.12 manylinux x86_64 with pip's
resolver (``pip install --dry-run --report --python-version 3.12 --platform ...``) against the
engine's own ``Requires-Dist`` ranges, 2026-12-04.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "EnginePin",
    "ENGINE_PINS",
    "WheelSet",
    "WHEEL_SETS",
    "EAGLE3NB_HEADLESS",
    "HAVE_IMAGES",
    "PRUNE_RULES",
    "normalize",
    "pick_engine",
    "beside_names",
    "check_python",
    "have_names",
]

REF = "../shared/reference/gpu_engines_h200.md"


@dataclass(frozen=True)
class EnginePin:
    """Engine versions ``first``..``last`` (inclusive) pin ``torch==torch``; ``source`` says where."""

    engine: str
    first: str
    last: str
    torch: str
    source: str


ENGINE_PINS: tuple[EnginePin, ...] = (
    EnginePin("vllm", "0.20.0", "0.25.1", "2.11.0", REF + " (vLLM section: 0.20.0-0.26.0)"),
    EnginePin(
        "vllm",
        "0.26.0",
        "0.26.0",
        "2.11.0",
        "METADATA of vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl: Requires-Dist: torch==2.11.0",
    ),
    EnginePin("vllm", "0.27.0", "0.30.0", "2.13", REF + " (0.27-0.30 pin 2.13)"),
    EnginePin("vllm", "0.34.0", "0.34.0", "2.14", REF + " (0.34 pins 2.14)"),
    EnginePin("sglang", "0.5.12", "0.5.16", "2.11.0", REF + " (SGLang: 0.5.12-0.5.17 pin 2.11.0)"),
    EnginePin(
        "sglang",
        "0.5.17",
        "0.5.17",
        "2.11.0",
        "METADATA of sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl: Requires-Dist: torch==2.11.0",
    ),
    EnginePin("sglang", "0.5.18", "0.5.21", "2.13.0", REF + " (0.5.18 pins 2.13)"),
    EnginePin("sglang", "0.5.23", "0.5.23", "2.14.1", REF + " (0.5.23 pins 2.14.1)"),
)


@dataclass(frozen=True)
class WheelSet:
    """The wheels one engine version needs beyond a host image: ``engine`` (the engine wheel's
    requirement) and ``extras`` (``name==version``), resolved for the Pythons in ``pythons``."""

    engine: str
    version: str
    pythons: tuple[str, ...]
    extras: tuple[str, ...]
    env: dict[str, str]
    source: str
    # the set whose installed site this one is used beside (after it on PYTHONPATH): its wheels
    # are not repeated here, and install.sh writes a python wrapper with both sites on the path
    beside: tuple[str, str] | None = None
    # names installed even where the host has them (they must come ahead of the host's versions)
    ahead: tuple[str, ...] = ()


# the 21 wheels the reference names for vLLM 0.26.0 (+ jiter, which openai 3.x requires, and
# httpcore2, which httpx2 requires), at the versions pip resolves inside vLLM 0.26.0's ranges
_VLLM_0260 = (
    "cbor2==6.3.0",
    "pyzmq==27.3.0",
    "openai-harmony==0.0.8",
    "openai==3.60.0",
    "jiter==0.19.0",
    "httpx2==2.16.2",
    "httpcore2==2.16.2",
    "sniffio==1.3.1",
    "msgspec==0.23.0",
    "pybase64==1.5.1",
    "cachetools==8.0.2",
    "llguidance==1.7.6",
    "xgrammar==0.2.7",
    "apache-tvm-ffi==0.1.10",
    "fastapi==0.136.3",
    "starlette==1.10.0",
    "partial-json-parser==0.2.1.1.post7",
    "compressed-tensors==0.17.0",
    "loguru==0.7.3",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
)

# SGLang 0.5.17's slim set, run on an H100 of the image on 2026-12-06 (REF): sglang-kernel without
# its FA3 library (PRUNE_RULES), flashinfer (pure Python, compiles on first use), and the
# transformers/tokenizers 0.5.17 pins, ahead of the image's 5.17 (with it SGLang's config registry
# fails: "'qwen3_asr' is already used by a Transformers config"). orjson, setproctitle and uvicorn:
# imported at module level by sglang/srt/entrypoints, managers and utils (grep of the 0.5.17 wheel)
# and neither in the image nor in vLLM's set; versions as pip resolves them for CPython 3.12,
# 2026-12-06. gguf: imported by sglang/srt/layers/quantization/gguf.py when sglang.Engine loads
# (found missing on the H100, bench/gpu_2026-12-06; pure Python, its numpy/pyyaml/tqdm/requests are
# on the image). Everything else SGLang imports comes from the image or from vLLM's site (beside).
_SGLANG_0517 = (
    "sglang-kernel==0.4.5",
    "flashinfer-python==0.6.15.post1",
    "transformers==5.12.1",
    "tokenizers==0.22.2",
    "orjson==3.13.0",
    "setproctitle==1.3.8",
    "uvicorn==0.55.0",
    "gguf==0.19.0",
)

WHEEL_SETS: dict[tuple[str, str], WheelSet] = {
    ("vllm", "0.26.0"): WheelSet(
        "vllm",
        "0.26.0",
        ("3.12",),
        _VLLM_0260,
        # vLLM's sampler imports flashinfer (not in the set) unless told not to
        # (vllm/v1/sample/ops/topk_topp_sampler.py)
        {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
        REF,
    ),
    ("sglang", "0.5.17"): WheelSet(
        "sglang",
        "0.5.17",
        ("3.12",),
        _SGLANG_0517,
        {"SGLANG_DISABLE_REQUEST_LOGGING": "1"},
        REF + " (SGLang 0.5.17 on an H100 of the same image, 2026-12-06)",
        beside=("vllm", "0.26.0"),
        ahead=("transformers", "tokenizers"),
    ),
}

# what eagle3nb's notebooks import when run headless (papermill, nbclient, ipykernel, plotly,
# ipywidgets/anywidget, datasets, typer, pydantic), closed over their dependencies by pip's
# resolver; names the host already has are dropped by --have
EAGLE3NB_HEADLESS = (
    "papermill==2.7.0",
    "nbclient==0.11.0",
    "nbformat==5.11.1",
    "fastjsonschema==2.22.3",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "jupyter-client==8.10.0",
    "jupyter-core==5.9.1",
    "platformdirs==4.14.9",
    "traitlets==5.16.1",
    "tornado==6.6.1",
    "pyzmq==27.3.0",
    "ipykernel==7.4.0",
    "comm==0.2.3",
    "debugpy==1.8.22",
    "nest-asyncio2==1.7.4",
    "matplotlib-inline==0.2.2",
    "ipython==9.18.1",
    "ipython-pygments-lexers==1.1.1",
    "jedi==0.20.1",
    "parso==0.8.7",
    "pexpect==4.9.0",
    "ptyprocess==0.7.0",
    "prompt-toolkit==3.0.53",
    "wcwidth==0.9.4",
    "stack-data==0.6.3",
    "asttokens==3.0.2",
    "executing==2.3.0",
    "pure-eval==0.2.4",
    "entrypoints==0.4.2",
    "tenacity==9.2.1",
    "plotly==7.1.0",
    "narwhals==2.29.0",
    "ipywidgets==8.1.9",
    "jupyterlab-widgets==3.0.17",
    "widgetsnbextension==4.0.16",
    "anywidget==0.11.0",
    "psygnal==0.16.1",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "xxhash==4.1.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typer==0.29.2",
    "tzdata==2026.6",
    "truststore==0.10.5",
)

# the H200 image's packages (/work/.library/device/KINDS.md, "Python packages already there",
# read on a running machine 2026-11-17)
_H200 = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio
h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"""

HAVE_IMAGES: dict[str, frozenset[str]] = {"h200": frozenset(_H200.split())}

# (glob under the staging folder, why it goes, when: "always", "dense_only", "other_pythons")
PRUNE_RULES: tuple[tuple[str, str, str], ...] = (
    (
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        "FlashAttention-2 kernels: an H200 (sm90) runs FA3 (_vllm_fa3_C) (" + REF + ")",
        "always",
    ),
    ("vllm/vllm-rs", "the optional Rust frontend binary; eagle3nb starts LLM in Python", "always"),
    (
        "vllm/third_party/deep_gemm/_C.cpython-*-x86_64-linux-gnu.so",
        "deep_gemm extensions built for other Python versions than the host's",
        "other_pythons",
    ),
    ("bin", "console scripts whose shebang names this build machine's Python", "always"),
    (
        "sgl_kernel/flash_ops.abi3.so",
        "sglang-kernel's FlashAttention-3 library (1.1 GB): eagle3nb starts SGLang with "
        "attention_backend=triton on the host (" + REF + ")",
        "always",
    ),
    (
        "sgl_kernel/*.cpython-*-x86_64-linux-gnu.so",
        "sglang-kernel extensions built for other Python versions than the host's",
        "other_pythons",
    ),
    (
        "vllm/_moe_C*.so",
        "--dense-only: fused-MoE kernels, needed only by MoE targets (Mixtral, Qwen3-MoE, ...)",
        "dense_only",
    ),
)


def normalize(name: str) -> str:
    """PEP 503 name (``Pydantic_Core`` -> ``pydantic-core``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def have_names(text: str) -> frozenset[str]:
    """Package names from a ``--have`` file: one a line, ``pip freeze``/``pip list`` forms accepted
    (``name==1.0``, ``name 1.0``); blank lines and ``#`` comments skipped."""
    out = set()
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith(("Package", "---")):
            out.add(normalize(re.split(r"[=<>!~ ;\[@]", line, maxsplit=1)[0]))
    return frozenset(out)


def _vt(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def _pin_matches(pin: str, torch: str) -> bool:
    t = torch.split("+")[0]
    return t == pin or (pin.count(".") == 1 and t.startswith(pin + "."))


def pick_engine(torch: str, engine: str = "vllm") -> tuple[EnginePin, WheelSet]:
    """The newest ``engine`` version whose torch pin is ``torch`` (local suffix ignored), and its
    wheel set.

    Raises:
        ValueError: naming ``--torch``: no row pins that torch, or the picked version has no
            measured wheel set (the message names the known ones and the fix).
    """
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?(\+\w+)?", str(torch)):
        raise ValueError(
            f"--torch {torch}: not a torch version; pass the host's torch as X.Y.Z (python -c "
            '"import torch; print(torch.__version__)" on the host)'
        )
    rows = [p for p in ENGINE_PINS if p.engine == engine and _pin_matches(p.torch, torch)]
    if not rows:
        known = ", ".join(
            f"{p.first}-{p.last} -> {p.torch}" for p in ENGINE_PINS if p.engine == engine
        )
        raise ValueError(
            f"--torch {torch}: no {engine} version in the table pins this torch ({known}); pass "
            "the host's torch, or add the engine's row to ENGINE_PINS in eagle3nb/offline/sets.py"
        )
    row = max(rows, key=lambda p: _vt(p.last))
    ws = WHEEL_SETS.get((engine, row.last))
    if ws is None:
        sets = ", ".join(f"{e} {v}" for e, v in WHEEL_SETS)
        raise ValueError(
            f"--torch {torch}: {engine} {row.last} pins it, but no wheel set is measured for that "
            f"version (known: {sets}); use a host with a torch a known set pins, or add a WheelSet "
            "to WHEEL_SETS in eagle3nb/offline/sets.py"
        )
    return row, ws


def beside_names(ws: WheelSet) -> frozenset[str]:
    """Normalised names of the wheels the set ``ws`` is used beside already installs (its engine
    and extras; eagle3nb's headless set goes with it too): not repeated in ``ws``'s bundle. Empty
    when ``ws`` has no ``beside``.

    Raises:
        ValueError: ``beside`` names a set :data:`WHEEL_SETS` does not hold.
    """
    if ws.beside is None:
        return frozenset()
    other = WHEEL_SETS.get(ws.beside)
    if other is None:
        raise ValueError(f"{ws.engine} {ws.version}: beside={ws.beside} is not in WHEEL_SETS")
    reqs = (other.engine, *other.extras, *EAGLE3NB_HEADLESS)
    return frozenset(normalize(r.partition("==")[0]) for r in reqs)


def check_python(python: str, ws: WheelSet) -> str:
    """``python`` as ``X.Y`` when the wheel set is resolved for it.

    Raises:
        ValueError: naming ``--python-version``, the value, the Pythons the set has and the fix.
    """
    m = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)?", str(python))
    py = f"{m.group(1)}.{m.group(2)}" if m else None
    if py not in ws.pythons:
        raise ValueError(
            f"--python-version {python}: the wheel set of {ws.engine} {ws.version} is resolved for "
            f"Python {', '.join(ws.pythons)} only (binary wheels such as pydantic-core are built "
            f"per Python); pass the host's python3 --version as X.Y, or resolve a set for it in "
            "WHEEL_SETS in eagle3nb/offline/sets.py"
        )
    return py
