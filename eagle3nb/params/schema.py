"""RunParams: every run parameter once (default, range, help, the notebooks that declare it)."""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import ConfigDict, field_validator, model_validator

from eagle3nb.params.fields import (  # noqa: F401  (re-exported: the notebook groups)
    ALL,
    AUDIT,
    DRIFT,
    EVAL,
    EXTRACT_SGLANG,
    EXTRACT_VLLM,
    GENERATE,
    NOTEBOOKS,
    RUN_LEVEL,
    TRAIN,
    VLLM,
    InputFields,
    _p,
)
from eagle3nb.params.paths import check_paths


class RunParams(InputFields):
    """All parameters of a run (defaults = the seconds-long smoke run of the notebooks).

    Field order is the order of the lines in the notebooks' parameters cells; each field's
    ``description`` is the help comment of its line there and its ``json_schema_extra`` names the
    notebooks that declare it. A new parameter: add a field here, then ``python -m eagle3nb.params sync``.
    """

    model_config = ConfigDict(extra="forbid")

    # 03_train
    training_mode: Literal["offline", "online"] = _p(
        "offline",
        "offline (02's stored dataset) or online (the target captures each batch here; needs only 01's output)",
        [TRAIN],
    )
    online_engine: Literal["hf", "vllm", "sglang"] = _p(
        "hf",
        "online: who captures each batch: vllm or sglang (the serving engine in its worker, 02a/02b's ids, dtype and options) or hf (the target in this process)",
        [TRAIN],
    )
    online_prefetch_mib: int = _p(
        64,
        "online from vllm/sglang: MiB of captured batches held ahead of the trainer (the engine waits when full)",
        [TRAIN],
        ge=1,
    )
    online_cache_gib: float = _p(
        0.0,
        "online from vllm/sglang: GiB of the first epoch's captured states kept in outputs/<run>/online_cache/ (dataset format) and read by later epochs; samples past it are recaptured every epoch; 0 = off, no states on disk",
        [TRAIN],
        ge=0,
    )
    online_recheck_every: int = _p(
        50,
        "online from vllm/sglang: steps between re-checks of a streamed batch against the engine's own capture of it (0 = none)",
        [TRAIN],
        ge=0,
    )
    draft_vocab_size: int = _p(
        256, "draft vocabulary size (most frequent loss-bearing tokens)", [TRAIN, DRIFT], ge=1
    )
    draft_num_heads: int = _p(
        2, "drafter attention heads (0 for the target's count)", [TRAIN, DRIFT], ge=0
    )
    draft_num_kv_heads: int = _p(
        2, "drafter kv heads (0 for min(heads, target's kv heads))", [TRAIN, DRIFT], ge=0
    )
    draft_intermediate_size: int = _p(
        0, "drafter MLP width (0 for the target's)", [TRAIN, DRIFT], ge=0
    )
    norm_before_fc: bool = _p(
        False, "RMSNorm input_norm over the concatenated aux states before fc", [TRAIN]
    )
    norm_output: bool = _p(
        False, "EAGLE-3.1: feed the final-normed state to the next draft step", [TRAIN]
    )
    fc_norm: bool = _p(
        False,
        "one RMSNorm per aux state before fc (EAGLE-3.1 as SGLang/SpecForge mean it, with "
        "norm_output; speculators' 3.1 is norm_before_fc + norm_output)",
        [TRAIN],
    )
    drafter_head: Literal["llama", "mla"] = _p(
        "llama",
        "the drafter's attention: llama (GQA, every target) or mla (DeepSeek-V3/Kimi-K2 targets "
        "only: their multi-latent attention, exported as vLLM's deepseek_eagle3 / SGLang's "
        "kimi_k25_eagle3 class; on CPU vLLM serves it, SGLang 0.5.23 cannot)",
        [TRAIN],
    )
    init_from: Optional[str] = _p(
        None,
        "start from this drafter folder (any format: eagle3nb, SpecForge/SGLang, speculators, vLLM, no ids; read as 06_audit reads it) and fine-tune it; its vocabulary, widths and flags are kept; None: a fresh drafter",
        [TRAIN],
    )
    init_boundaries: Literal["keep", "params"] = _p(
        "keep",
        "with init_from: keep (the boundaries it declares; refused unless this run's aux_boundaries equal them) or params (this run's boundaries: its fc's input side is re-initialised and re-trained)",
        [TRAIN],
    )
    init_from_target: Literal["refuse", "warn"] = _p(
        "refuse",
        "with init_from: a drafter whose manifest.json names another target (sha256 where it has one, else the name) is refused, or with warn fine-tuned with a warning naming both",
        [TRAIN],
    )
    ttt_steps: int = _p(7, "training-time test unroll length k", [TRAIN, DRIFT], ge=1)
    loss_decay: float = _p(0.8, "TTT step j is weighted loss_decay**j", [TRAIN], gt=0, le=1)
    batch_size: int = _p(
        8,
        "samples per optimizer step, summed over all processes (the global batch)",
        [TRAIN, DRIFT],
        ge=1,
    )
    max_steps: int = _p(100, "optimizer steps", [TRAIN], ge=1)
    lr: float = _p(3e-3, "AdamW peak learning rate", [TRAIN, DRIFT], gt=0)
    warmup_steps: int = _p(5, "linear warmup steps before cosine decay", [TRAIN, DRIFT], ge=0)
    weight_decay: float = _p(0.0, "AdamW weight decay", [TRAIN], ge=0)
    aux_noise: float = _p(0.0, "Gaussian noise on aux states, relative to their std", [TRAIN], ge=0)
    init_head_from_target: bool = _p(
        True, "start lm_head and final norm from the target's", [TRAIN]
    )
    checkpoint_every: int = _p(200, "steps between checkpoints (resume on rerun)", [TRAIN], ge=1)
    log_every: int = _p(
        10,
        "steps between progress lines and history entries (a line also at least every 60 s)",
        [TRAIN],
        ge=1,
    )
    tracking: list[Literal["tensorboard", "wandb", "mlflow"]] = _p(
        None,
        "trackers: tensorboard (train/tensorboard), wandb (offline), mlflow (local file store); "
        "[] for none; wandb/mlflow only when importable",
        [TRAIN],
        default_factory=lambda: ["tensorboard"],
    )
    eval_every: int = _p(
        10,
        "steps between held-out evaluations (teacher-forced accuracy and simulator tau; 0 for none)",
        [TRAIN],
        ge=0,
    )
    eval_prompts: int = _p(
        2,
        "01's held-out prompts evaluated during training (the last ones of the split)",
        [TRAIN],
        ge=1,
    )
    keep_last: int = _p(1, "step checkpoints kept (the best one is kept besides)", [TRAIN], ge=1)
    export_from: Literal["best", "last"] = _p(
        "best",
        "checkpoint exported: best (highest held-out tau; last without evaluation) or last",
        [TRAIN],
    )
    allow_manifest_mismatch: bool = _p(
        False, "continue although the dataset's target/convention/boundaries differ", [TRAIN]
    )
    train_on: Literal["sglang", "vllm"] = _p(
        "sglang",
        "dataset to train on: sglang (02b's dataset/, at SGLang's capture point) or vllm (02a's dataset_vllm/, captured by vLLM)",
        [TRAIN],
    )
    export_layer_ids: Literal["trained", "engine_default", "convention"] = _p(
        "trained",
        "ids written for SGLang/vLLM: the trained boundaries by each engine rule for the target class; engine_default (reproduces the layer-id mismatch); convention (generic engine conventions, as hand-written configs: reproduces per-class mismatches)",
        [EXTRACT_VLLM, EXTRACT_SGLANG, TRAIN],
        {
            EXTRACT_VLLM: "the ids 03 will export (as in 03): the alignment figure marks where each engine reads them",
            EXTRACT_SGLANG: "the ids 03 will export (as in 03): the alignment figure marks where each engine reads them",
        },
    )
    bucket_by_length: bool = _p(
        True, "global batches of similar lengths (less padding); False for a plain shuffle", [TRAIN]
    )
    loader_workers: int = _p(
        -1,
        "DataLoader worker processes feeding training (0 loads in this process; -1 auto: 4 on CUDA, 0 on CPU)",
        [TRAIN],
        ge=-1,
    )
    nproc_per_node: int = _p(
        1,
        "training processes on this node (one per GPU); 1 trains in this kernel, more launch torchrun",
        [TRAIN],
        ge=1,
    )
    nnodes: int = _p(
        1, "nodes; above 1 the others run torchrun (docs/training.md#scale-out)", [TRAIN], ge=1
    )
    node_rank: int = _p(0, "index of this node when nnodes is above 1", [TRAIN], ge=0)
    rdzv_endpoint: str = _p(
        "localhost:29500",
        "host:port of node 0 for the rendezvous of several nodes",
        [TRAIN],
        pattern=r"^[A-Za-z0-9._\[\]:-]+:[0-9]+$",
    )
    fsdp: Literal["auto", "on", "off"] = _p(
        "auto",
        "under torchrun: on shards the drafter (FSDP), off replicates it (DDP), auto shards large drafters",
        [TRAIN],
    )
    online_target_shard: Literal["auto", "none", "fsdp"] = _p(
        "auto",
        "online under torchrun: fsdp shards the target over the ranks (each holds 1/world; needs eval_every 0), none keeps it whole on every rank, auto shards targets above 2e10 parameters",
        [TRAIN],
    )
    attention: Literal["auto", "eager", "flex"] = _p(
        "auto",
        "TTT attention: eager (reference), flex (flex attention, compiled on GPU), auto (flex on CUDA, eager on CPU)",
        [TRAIN],
    )
    precision: Literal["auto", "float32", "bf16-mixed"] = _p(
        "auto", "float32 or bf16-mixed (float32 master weights, CUDA); auto: by device", [TRAIN]
    )
    torch_compile: Literal["auto", "on", "off"] = _p(
        "auto", "compile the drafter layer and loss (CUDA): on, off, auto (on for CUDA)", [TRAIN]
    )
    # 04_eval_acceptance
    k: int = _p(
        5,
        "draft tokens per cycle",
        [TRAIN, EVAL, DRIFT, AUDIT],
        {TRAIN: "draft tokens per cycle of the held-out tau measured during training"},
        ge=1,
    )
    eval_max_new_tokens: int = _p(
        32,
        "tokens generated per held-out prompt",
        [TRAIN, EVAL, DRIFT, AUDIT],
        {TRAIN: "tokens generated per held-out prompt in the evaluations during training"},
        ge=1,
    )
    max_eval_prompts: int = _p(6, "cap on held-out prompts (0 for all)", [EVAL, DRIFT, AUDIT], ge=0)
    baselines: bool = _p(True, "also evaluate an untrained drafter and the layer offset", [EVAL])
    allow_template_mismatch: bool = _p(
        False, "evaluate although the drafter was trained under another template or target", [EVAL]
    )
    eval_engines: list[str] = _p(
        None,
        "who measures acceptance: simulator, vllm, sglang; auto: simulator if the target fits, plus each engine that serves it here",
        [EVAL],
        default_factory=lambda: ["auto"],
    )
    eval_dataset: Optional[str] = _p(
        None,
        "benchmark served per category besides the held-out prompts: MT-Bench question.jsonl, GSM8K/HumanEval/MATH JSONL or a chat dataset; builtin:tinystories_mtbench ships; null: none (06_audit measures on it too)",
        [EVAL, AUDIT],
    )
    eval_max_records: int = _p(
        0, "cap on eval_dataset records, stratified by category (0 for all)", [EVAL, AUDIT], ge=0
    )
    eval_batch_sizes: list[int] = _p(
        None,
        "requests each engine serves at once; tokens/s and latency with and without the drafter per size",
        [EVAL],
        default_factory=lambda: [1],
    )
    speed_rounds: int = _p(
        5,
        "rounds the served speed is split into: with and without the drafter timed turn about, call by call on two workers; the median and spread of the rounds (fewer than 3, or a spread wider than the effect: printed as disturbed)",
        [EVAL],
        ge=1,
        le=100,
    )
    speed_prompts: int = _p(
        16,
        "prompts timed with and without the drafter, turn about, per setting (drafter, k, batch size), spread over the set; their plain outputs are the engine's own greedy check (every prompt is also checked against HF's greedy output by the simulator); the rest are served with the drafter only, so 04 costs one plain call per timed prompt, not one per prompt",
        [EVAL],
        ge=1,
        le=100000,
    )
    eval_ks: list[int] = _p(
        None,
        "draft lengths the engines also serve besides k (empty: k only)",
        [EVAL],
        default_factory=list,
    )
    k_sweep: bool = _p(
        True,
        "also draft at every position of the held-out greedy outputs: tau and acceptance rate for every draft length 1..k (exact, one target forward per prompt)",
        [EVAL],
    )
    # 05_drift
    drift_sources: list[str] = _p(
        None,
        "targets compared, engine:dtype[:quant] (engine hf or vllm, quant none, w8a8 or w4a16; hf:float32 is the reference, always first; vLLM on CPU runs w8a8 in bfloat16)",
        [DRIFT],
        default_factory=lambda: ["hf:float32", "hf:float32:w8a8", "hf:float32:w4a16"],
    )
    drift_seeds: list[int] = _p(
        None,
        "one drafter per seed and source (two give the noise bars)",
        [DRIFT],
        default_factory=lambda: [0, 1],
    )
    drift_train_steps: int = _p(40, "optimizer steps per drafter", [DRIFT], ge=1)
    drift_vllm_serve: bool = _p(
        True,
        "vLLM also serves the reference drafter and the source drafter on each vllm source (its own counters)",
        [DRIFT],
    )
    # vLLM (01 generation, 02a extraction, 04 serving); its venv from `bash .ci/setup_engines.sh`
    vllm_python: Optional[str] = _p(
        None,
        'python of the vLLM venv; None for the cached one of .ci/setup_engines.sh, "" to run vLLM in this process (GPU box)',
        (*VLLM, TRAIN),  # 03 starts no vLLM, but exports ids by this version's rule
    )
    vllm_options: dict = _p(
        None,
        "for the vLLM backend: max_model_len, kv_cache_gib, enforce_eager, max_num_seqs, llm_kwargs (e.g. tensor_parallel_size)",
        VLLM,
        default_factory=dict,
    )
    drift_matrix: bool = _p(
        True,
        "run 05_drift (quantized and other-dtype targets, the train x serve acceptance matrix); False skips that notebook (read by eagle3nb.run)",
        RUN_LEVEL,
    )
    # 06_audit
    audit_drafter: Optional[str] = _p(
        None,
        "drafter folder to audit (any format: eagle3nb, SpecForge/SGLang, speculators, vLLM, no ids); None skips 06_audit in eagle3nb.run, and the notebook then audits this run's own drafter",
        [AUDIT],
    )
    audit_engine: Optional[Literal["sglang", "vllm"]] = _p(
        None, "the engine you serve with (None: both are reported)", [AUDIT]
    )
    audit_radius: int = _p(
        1,
        "candidate boundary sets: each boundary within this many layers of the declared one (all sets when there are at most 64)",
        [AUDIT],
        ge=0,
    )
    vllm_extract: bool = _p(
        True,
        "run 02a_extract_vllm (vLLM captures its own dataset); False skips that notebook (read by eagle3nb.run, declared by no notebook)",
        RUN_LEVEL,
    )

    @field_validator("convention")
    @classmethod
    def _known_convention(cls, v):
        from eagle3nb.boundaries.conventions import CONVENTIONS

        if v not in CONVENTIONS:
            raise ValueError(f"convention={v!r} is unknown; use one of {sorted(CONVENTIONS)}")
        return v

    @field_validator("drift_sources")
    @classmethod
    def _drift_sources(cls, v):
        from eagle3nb.target.quantize import FORMATS

        q = "|".join(["none", *sorted(FORMATS)])
        bad = [s for s in v if not re.fullmatch(rf"(hf|vllm):(float32|bfloat16)(:({q}))?", s)]
        if bad or len(set(v)) != len(v):
            raise ValueError(
                f"drift_sources={v}: each entry engine:dtype[:quant], engine hf or vllm, dtype "
                f"float32 or bfloat16, quant {q.replace('|', ', ')}, each once (bad: {bad})"
            )
        return v

    @field_validator("eval_engines")
    @classmethod
    def _eval_engines(cls, v):
        known = ("auto", "simulator", "vllm", "sglang")
        bad = [e for e in v if e not in known]
        if not v or bad or len(set(v)) != len(v) or ("auto" in v and len(v) > 1):
            raise ValueError(
                f"eval_engines={v}: list who measures acceptance, each once, from {list(known[1:])}"
                " (e.g. [simulator, sglang]), or [auto] alone for the simulator where the target "
                "fits plus every engine that serves it here"
            )
        return v

    @field_validator("eval_batch_sizes", "eval_ks")
    @classmethod
    def _positive_distinct(cls, v, info):
        if (
            any(x < 1 for x in v)
            or len(set(v)) != len(v)
            or (info.field_name == "eval_batch_sizes" and not v)
        ):
            raise ValueError(
                f"{info.field_name}={v}: give distinct integers >= 1, e.g. [1, 4]"
                + (" (at least one)" if info.field_name == "eval_batch_sizes" else " (or [])")
            )
        return v

    @field_validator("drift_seeds")
    @classmethod
    def _drift_seeds(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError(f"drift_seeds={v}: give one or more distinct seeds, e.g. [0, 1]")
        return v

    @field_validator("fsdp", "torch_compile", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):  # YAML 1.1 reads a bare on/off as a bool
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("layer_ids")
    @classmethod
    def _ids_sorted(cls, v):
        if v is not None and (len(v) == 0 or any(b <= a for a, b in zip(v, v[1:]))):
            raise ValueError(
                f"layer_ids={v}: must be non-empty, strictly increasing, no duplicates (e.g. {sorted(set(v or [0]))}); or null for the default"
            )
        return v

    @model_validator(mode="after")
    def _ranks(self):
        if self.node_rank >= self.nnodes:
            raise ValueError(
                f"node_rank={self.node_rank} must be below nnodes={self.nnodes}; node ranks count 0..nnodes-1"
            )
        return self

    @model_validator(mode="after")
    def _online_engine_one_trainer(self):
        world = self.nproc_per_node * self.nnodes
        if self.training_mode == "online" and self.online_engine != "hf" and world > 1:
            raise ValueError(
                f"online_engine={self.online_engine!r} with {world} training processes "
                f"(nproc_per_node={self.nproc_per_node}, nnodes={self.nnodes}): one engine worker "
                "feeds one trainer here; use nproc_per_node: 1 and nnodes: 1, or online_engine: hf"
            )
        return self

    @model_validator(mode="after")
    def _target_shard(self):
        if self.online_target_shard == "fsdp":  # auto is resolved with the target's size in 03
            from eagle3nb.training.shard_target import resolve_target_shard

            world = self.nproc_per_node * self.nnodes
            resolve_target_shard("fsdp", world, self.training_mode, eval_every=self.eval_every)
        return self

    @model_validator(mode="after")
    def _sampling(self):
        if self.sampled_continuations and self.dataset is not None:
            raise ValueError(
                f"sampled_continuations={self.sampled_continuations} applies to prompts_file runs; with dataset set use 0 (conversations are regenerated turn by turn)"
            )
        if self.sampled_prefix_tokens and not self.sampled_continuations:
            raise ValueError(
                f"sampled_prefix_tokens={self.sampled_prefix_tokens} shapes the extra continuations, and sampled_continuations=0 asks for none; set sampled_continuations >= 1 or sampled_prefix_tokens: 0"
            )
        return self

    @model_validator(mode="after")
    def _paths(self):
        check_paths(self)
        return self


# keys renamed when engine choice got one spelling per notebook: old key -> what to write instead
RENAMED = {
    "gen_engine": "generate_engine (hf or vllm)",
    "engine": "extract_engine (sglang or hf; 02b's capture engine)",
    "train_from": "train_on (sglang for 02b's dataset, vllm for 02a's; was 02b / 02a)",
    "vllm_eval": "eval_engines (e.g. [simulator, vllm]; [simulator] for vllm_eval: false)",
}
