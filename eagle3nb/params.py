"""Run parameters: one validated model for params/*.yaml and every notebook's parameters cell.

Papermill only warns about unknown parameters; here an unknown key, a wrong type or an
out-of-range value fails before any work starts, naming the key, the value and the fix.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = ["resolve_device", "RunParams", "load_params", "collect", "check_against_model", "RunDir", "REPO_ROOT", "update_metrics", "read_metrics"]

REPO_ROOT = Path(__file__).resolve().parents[1]


class RunParams(BaseModel):
    """All parameters of a run (defaults = the seconds-long smoke run of the notebooks)."""

    model_config = ConfigDict(extra="forbid")

    # common
    interactive: bool = True
    run_name: str = Field("smoke", pattern=r"^[A-Za-z0-9._-]+$")
    outputs_dir: str = "outputs"
    model: str = "stories260K-hd32"
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = Field("cpu", pattern=r"^(cpu|auto|cuda(:[0-9]+)?)$")
    seed: int = 0
    # 01_generate
    prompts_file: str = "eagle3nb/data/prompts_tinystories.txt"
    heldout_fraction: float = Field(0.15, gt=0, lt=1)
    max_train_prompts: int = Field(24, ge=0)
    max_new_tokens: int = Field(32, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    gen_batch_size: int = Field(64, ge=1)
    mode: Literal["completion", "chat"] = "completion"
    chat_template: Optional[str] = None
    # 02b_extract_sglang
    engine: Literal["sglang", "hf"] = "sglang"
    sglang_python: Optional[str] = None
    measure_engine_speed: bool = False
    drift_samples: int = Field(4, ge=0)
    drift_both_dtypes: bool = False
    convention: str = "sglang"
    layer_ids: Optional[list[int]] = None
    shard_size: int = Field(64, ge=1)
    capture_batch_size: int = Field(32, ge=1)
    allow_boundary_mismatch: bool = False
    compare_run: Optional[str] = None
    aux_storage: Literal["dtype", "int8"] = "dtype"
    extract_workers: int = Field(1, ge=1)
    # 03_train
    training_mode: Literal["offline", "online"] = "offline"
    draft_vocab_size: int = Field(256, ge=1)
    draft_num_heads: int = Field(2, ge=0)
    draft_num_kv_heads: int = Field(2, ge=0)
    draft_intermediate_size: int = Field(0, ge=0)
    ttt_steps: int = Field(7, ge=1)
    loss_decay: float = Field(0.8, gt=0, le=1)
    batch_size: int = Field(8, ge=1)
    max_steps: int = Field(20, ge=1)
    lr: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(5, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    aux_noise: float = Field(0.0, ge=0)
    init_head_from_target: bool = True
    checkpoint_every: int = Field(200, ge=1)
    allow_manifest_mismatch: bool = False
    export_layer_ids: Literal["trained", "engine_default"] = "trained"
    bucket_by_length: bool = True
    loader_workers: int = Field(0, ge=0)
    nproc_per_node: int = Field(1, ge=1)
    nnodes: int = Field(1, ge=1)
    node_rank: int = Field(0, ge=0)
    rdzv_endpoint: str = Field("localhost:29500", pattern=r"^[A-Za-z0-9._\[\]:-]+:[0-9]+$")
    fsdp: Literal["auto", "on", "off"] = "auto"
    attention: Literal["eager", "flex"] = "eager"
    # 04_eval_acceptance
    k: int = Field(5, ge=1)
    eval_max_new_tokens: int = Field(32, ge=1)
    max_eval_prompts: int = Field(6, ge=0)
    baselines: bool = True
    allow_template_mismatch: bool = False
    # vLLM (01 generation, 02a extraction, 04 serving); its venv from `bash .ci/setup_engines.sh`
    gen_engine: Literal["hf", "vllm"] = "hf"
    vllm_extract: bool = True
    vllm_eval: bool = True
    vllm_python: Optional[str] = None
    vllm_options: dict = Field(default_factory=dict)
    train_from: Literal["02b", "02a"] = "02b"

    @field_validator("convention")
    @classmethod
    def _known_convention(cls, v):
        from .conventions import CONVENTIONS

        if v not in CONVENTIONS:
            raise ValueError(f"convention={v!r} is unknown; use one of {sorted(CONVENTIONS)}")
        return v

    @field_validator("fsdp", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):  # YAML 1.1 reads a bare on/off as a bool
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("layer_ids")
    @classmethod
    def _ids_sorted(cls, v):
        if v is not None and (len(v) == 0 or any(b <= a for a, b in zip(v, v[1:]))):
            raise ValueError(f"layer_ids={v}: must be non-empty, strictly increasing, no duplicates (e.g. {sorted(set(v or [0]))}); or null for the default")
        return v

    @model_validator(mode="after")
    def _ranks(self):
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank={self.node_rank} must be below nnodes={self.nnodes}; node ranks count 0..nnodes-1")
        return self

    @model_validator(mode="after")
    def _paths(self):
        pf = resolve_path(self.prompts_file)
        if not pf.is_file():
            raise ValueError(f"prompts_file={self.prompts_file!r} does not exist (looked at {pf}); point it at a text file with one prompt per line")
        if self.mode == "completion" and self.chat_template is not None:
            raise ValueError(f"chat_template={self.chat_template!r} is set but mode='completion'; set mode: chat or chat_template: null")
        if self.chat_template is not None and not resolve_path(self.chat_template).is_file():
            raise ValueError(f"chat_template={self.chat_template!r} is not a file; give a jinja template file or null for the tokenizer's own")
        return self


def resolve_path(p: str | os.PathLike) -> Path:
    """Relative paths are relative to the repository root (so notebooks and CLI agree)."""
    p = Path(p).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


_HINTS = {
    "rdzv_endpoint": "host:port of node 0, e.g. 10.0.0.1:29500",
    "run_name": "letters, digits, '.', '_' and '-' only (it names the folder outputs_dir/run_name)",
}


def _format_error(e: ValidationError, source: str) -> str:
    lines = [f"invalid parameters in {source}:"]
    for err in e.errors():
        key = ".".join(str(x) for x in err["loc"]) or "(file)"
        val = err.get("input")
        if err["type"] == "value_error":  # our validators' messages already name key, value and fix
            lines.append(f"  {err['ctx']['error']}")
            continue
        if err["type"] == "extra_forbidden":
            near = difflib.get_close_matches(str(err["loc"][0]), list(RunParams.model_fields), n=1)
            hint = (f"unknown key; did you mean {near[0]!r}?" if near else "unknown key; remove it") + " (all keys with their help: the parameters cells of notebooks/*.ipynb, or eagle3nb/params.py RunParams)"
        else:
            hint = err["msg"]
            field = RunParams.model_fields.get(str(err["loc"][0])) if err["loc"] else None
            if str(err["loc"][0] if err["loc"] else "") in _HINTS:
                hint += "; use " + _HINTS[str(err["loc"][0])]
            elif field is not None and field.default is not None:
                hint += f"; e.g. {key}: {field.default!r} (the default)"
        lines.append(f"  {key}={val!r}: {hint}")
    return "\n".join(lines)


def load_params(path: str | os.PathLike, **overrides) -> RunParams:
    """Read and validate a params YAML file (plus overrides).

    Raises:
        FileNotFoundError: no such file. ValueError: any invalid key or value (all listed).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"params file {path} does not exist; see params/default.yaml")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"params file {path} must hold a mapping of key: value")
    data.update(overrides)
    try:
        return RunParams(**data)
    except ValidationError as e:
        raise ValueError(_format_error(e, str(path))) from None


def collect(namespace: dict) -> RunParams:
    """Validate the parameters a notebook declared (the RunParams fields found in ``namespace``,
    e.g. ``globals()``); fields it does not declare keep their defaults."""
    data = {k: namespace[k] for k in RunParams.model_fields if k in namespace}
    try:
        return RunParams(**data)
    except ValidationError as e:
        raise ValueError(_format_error(e, "the notebook's parameters")) from None


def check_against_model(p: RunParams) -> dict:
    """Upfront checks of ``p`` against the target's ``config.json`` (no weights are loaded), so that
    a run fails before any notebook executes.

    Returns:
        ``{"path", "n_layers", "vocab_size", "layer_ids", "boundaries"}``: the model folder, its
        num_hidden_layers and vocab_size, and the aux ids (in ``p.convention``) and boundaries the
        run will capture.

    Raises:
        FileNotFoundError: the model is not found (the message lists every place looked at).
        ValueError: naming the parameter, its value and the fix, for: an unsupported architecture or
            a folder without tokenizer; ``draft_vocab_size`` > the target's vocab; ``layer_ids`` the
            convention cannot capture for this many layers, or giving non-increasing boundaries;
            ``layer_ids: null`` on a target too small for the default picker; ``draft_num_heads``
            not a multiple of ``draft_num_kv_heads``; vLLM parameters (see
            :func:`eagle3nb.vllm_engine.check_vllm_params`).
        FileNotFoundError: also when a step uses vLLM and ``vllm_python`` does not exist.
    """
    from . import conventions, models

    path = models.resolve_model(p.model)
    cfg = models.check_model_folder(path)
    n, V = cfg.get("num_hidden_layers"), cfg.get("vocab_size")
    for k, v in (("num_hidden_layers", n), ("vocab_size", V)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"model={p.model!r}: {path}/config.json has {k}={v!r}; eagle3nb needs a positive int there (restore the original config.json)")
    if p.draft_vocab_size > V:
        raise ValueError(f"draft_vocab_size={p.draft_vocab_size} exceeds the target vocab_size={V} of model={p.model!r}; set draft_vocab_size to at most {V}")
    try:
        ids, b = conventions.aux_ids_and_boundaries(p.convention, p.layer_ids, n)
    except ValueError as e:
        if p.layer_ids is None:
            raise ValueError(
                f"layer_ids=None: no default aux layers for model={p.model!r} (num_hidden_layers={n}) in convention "
                f"{p.convention!r}: {e}; set layer_ids explicitly or use a target with more layers"
            ) from None
        raise ValueError(
            f"layer_ids={p.layer_ids} (convention {p.convention!r}) do not fit model={p.model!r} with "
            f"num_hidden_layers={n}: {e}"
        ) from None
    if p.engine == "sglang":
        try:
            conventions.get_convention("sglang").boundaries_to_ids(b, n)
        except ValueError as e:
            raise ValueError(f"engine='sglang' cannot capture boundaries {b} (layer_ids={p.layer_ids}, convention {p.convention!r}) on model={p.model!r}: {e}; SGLang never captures boundary N={n} (its hooks take layer inputs only): pick lower boundaries, or set engine: hf") from None
    nh = p.draft_num_heads or cfg.get("num_attention_heads")
    nkv = p.draft_num_kv_heads or (min(nh, cfg.get("num_key_value_heads") or nh) if nh else None)
    if nh and nkv and nh % nkv:
        raise ValueError(
            f"draft_num_heads={p.draft_num_heads} ({nh} heads) is not a multiple of draft_num_kv_heads="
            f"{p.draft_num_kv_heads} ({nkv} kv heads; 0 = from the target); pick divisible head counts, "
            f"e.g. draft_num_kv_heads: {nh}"
        )
    from .vllm_engine import check_vllm_params

    check_vllm_params(p, cfg)  # vLLM venv present, options known, head_dim it accepts
    return {"path": str(path), "n_layers": n, "vocab_size": V, "layer_ids": ids, "boundaries": b}


def resolve_device(p: RunParams) -> str:
    """``device`` as torch understands it: ``auto`` is ``cuda`` when a GPU is visible, else ``cpu``.

    Raises:
        ValueError: ``cuda`` asked for but torch sees no GPU.
    """
    import torch

    if p.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if p.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={p.device!r} but torch sees no GPU (torch {torch.__version__}); use device: cpu or auto")
    return p.device


class RunDir:
    """Paths of one run's artefacts under ``outputs_dir/run_name`` (the only state between notebooks)."""

    def __init__(self, p: RunParams):
        self.root = resolve_path(p.outputs_dir) / p.run_name
        self.generated = self.root / "data" / "generated.jsonl"
        self.generation_manifest = self.root / "data" / "generation_manifest.json"
        self.dataset = self.root / "dataset"
        self.dataset_vllm = self.root / "dataset_vllm"  # 02a: captured by vLLM itself
        self.train = self.root / "train"
        self.drafter = self.root / "drafter"
        self.figures = self.root / "figures"
        self.metrics = self.root / "metrics.json"
        self.notebooks = self.root / "notebooks"

    def make(self) -> "RunDir":
        """Create the run folder and its data/figures subfolders; returns self."""
        for d in (self.root, self.generated.parent, self.figures):
            d.mkdir(parents=True, exist_ok=True)
        return self


def read_metrics(path: str | os.PathLike) -> dict:
    """metrics.json as a dict ({} when the run has none yet)."""
    from .manifest import read_json

    path = Path(path)
    return read_json(path, "metrics") if path.exists() else {}


def update_metrics(path: str | os.PathLike, section: str, values: dict) -> dict:
    """Merge ``values`` into ``metrics.json[section]`` (atomic rewrite). Returns the whole file."""
    from .manifest import atomic_write_json

    m = read_metrics(path)
    m.setdefault(section, {}).update(values)
    atomic_write_json(path, m)
    return m
