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

from eagle3nb.rundir import resolve_path


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
    extract_engine: Literal["sglang", "hf"] = "sglang"
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
    generate_engine: Literal["hf", "vllm"] = "hf"
    vllm_extract: bool = True
    vllm_eval: bool = True
    vllm_python: Optional[str] = None
    vllm_options: dict = Field(default_factory=dict)
    train_on: Literal["sglang", "vllm"] = "sglang"

    @field_validator("convention")
    @classmethod
    def _known_convention(cls, v):
        from eagle3nb.target.conventions import CONVENTIONS

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


# keys renamed when engine choice got one spelling per notebook: old key -> what to write instead
RENAMED = {
    "gen_engine": "generate_engine (hf or vllm)",
    "engine": "extract_engine (sglang or hf; 02b's capture engine)",
    "train_from": "train_on (sglang for 02b's dataset, vllm for 02a's; was 02b / 02a)",
}

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
        if err["type"] == "extra_forbidden" and str(err["loc"][0]) in RENAMED:
            lines.append(f"  {key}={val!r}: renamed; write {RENAMED[str(err['loc'][0])]}")
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
