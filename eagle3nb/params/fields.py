"""The run parameters every notebook and the data notebooks declare (common, 01, 02a/02b), as
:class:`InputFields`; :class:`eagle3nb.params.schema.RunParams` extends it with 03's, 04's and the
engines' (split for file size only: one model, field order = parameters-cell order)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

# the notebooks, in run order (eagle3nb.run executes them in this order)
NOTEBOOKS = [
    "01_generate",
    "02a_extract_vllm",
    "02b_extract_sglang",
    "03_train",
    "04_eval_acceptance",
    "05_drift",
    "06_audit",  # runs only when audit_drafter names a folder (eagle3nb.run)
]
GENERATE, EXTRACT_VLLM, EXTRACT_SGLANG, TRAIN, EVAL, DRIFT, AUDIT = NOTEBOOKS
ALL = tuple(NOTEBOOKS)
VLLM = (GENERATE, EXTRACT_VLLM, EVAL, DRIFT)  # the notebooks that start vLLM
RUN_LEVEL = "run"  # read by eagle3nb.run (which notebooks to execute), declared by no notebook


def _p(default, help: str, notebooks, notebook_help: dict[str, str] | None = None, **kw):
    """One RunParams field: ``default``, ``help`` (the comment of its line in a parameters cell,
    the help column of docs/parameters.md), the ``notebooks`` whose parameters cell declares it (or
    :data:`RUN_LEVEL`), ``notebook_help`` where a notebook's context changes what it means there,
    and pydantic constraints (``ge``, ``pattern``, ``default_factory`` ...)."""
    extra = {"notebooks": RUN_LEVEL if notebooks == RUN_LEVEL else list(notebooks)}
    if notebook_help:
        extra["notebook_help"] = dict(notebook_help)
    if "default_factory" in kw:
        return Field(description=help, json_schema_extra=extra, **kw)
    return Field(default, description=help, json_schema_extra=extra, **kw)


class InputFields(BaseModel):
    """Fields of :class:`~eagle3nb.params.schema.RunParams` up to extraction (see there)."""

    model_config = ConfigDict(extra="forbid")

    # common: declared by every notebook
    interactive: bool = _p(
        True, "widgets and progress bars (headless runs pass False and write HTML figures)", ALL
    )
    run_name: str = _p(
        "smoke",
        "folder under outputs_dir holding this run's artefacts",
        ALL,
        pattern=r"^[A-Za-z0-9._-]+$",
    )
    outputs_dir: str = _p("outputs", "parent folder of runs (relative to the repo root)", ALL)
    model: str = _p(
        "stories260K-hd32",
        "target model folder name or path (searched in $EAGLE3NB_MODEL_PATH, ../shared/models), "
        "or twin:CONFIG.json for a tiny random-weight twin of that config built here",
        ALL,
    )
    dtype: Literal["float32", "bfloat16"] = _p(
        "float32", "target dtype for generation and capture: float32 or bfloat16", ALL
    )
    device: str = _p(
        "cpu",
        "cpu, cuda, cuda:N, or auto (the GPU when torch sees one)",
        ALL,
        pattern=r"^(cpu|auto|cuda(:[0-9]+)?)$",
    )
    threads: int = _p(
        0,
        "threads of this kernel and of each engine worker: 0 for all cores this process may use "
        "(affinity, cgroup quota; each step and training drop to the cores other processes leave "
        "idle), "
        "-1 to leave torch and engine defaults",
        ALL,
        ge=-1,
    )
    reuse_results: bool = _p(
        True,
        "a re-run on unchanged parameters and inputs reads the result this notebook recorded in the "
        "run folder instead of starting its engines again; False measures again",
        [EXTRACT_VLLM, EXTRACT_SGLANG, EVAL, DRIFT],
    )
    seed: int = _p(0, "seed for the split, sampling, init and shuffling", ALL)
    mode: Literal["completion", "chat"] = _p(
        "completion",
        "completion (base model, loss on the continuation) or chat (loss on assistant tokens)",
        ALL,
    )
    chat_template: Optional[str] = _p(
        None, "jinja template file for chat mode; None for the tokenizer's own", ALL
    )
    chat_template_kwargs: dict = _p(
        {},
        "extra variables for the chat template, e.g. {enable_thinking: false}",
        [GENERATE, EVAL, DRIFT],
        {
            EVAL: "extra variables for the chat template that renders the held-out prompts",
            DRIFT: "extra variables for the chat template that renders the held-out prompts",
        },
        default_factory=dict,
    )
    # 01_generate
    prompts_file: str = _p(
        "eagle3nb/data/prompts_tinystories.txt",
        "one prompt per line; '#' lines ignored (a chat dataset goes in dataset)",
        [GENERATE, AUDIT],
    )
    dataset: Optional[str] = _p(
        None,
        "chat dataset (JSONL, JSON, Parquet or a datasets folder) regenerated turn by turn in chat mode; None uses prompts_file",
        [GENERATE],
    )
    dataset_format: Literal["auto", "openai", "sharegpt", "text"] = _p(
        "auto",
        "format of dataset: auto (from its columns), openai (messages), sharegpt (conversations) or text (preformatted)",
        [GENERATE],
    )
    heldout_fraction: float = _p(
        0.15,
        "share of prompts (or conversations) held out for evaluation (deterministic by text or id hash)",
        [GENERATE, AUDIT],
        gt=0,
        lt=1,
    )
    max_train_prompts: int = _p(24, "cap on train prompts/dialogues (0 for all)", [GENERATE], ge=0)
    max_new_tokens: int = _p(
        32,
        "tokens generated per prompt",
        [GENERATE, EXTRACT_VLLM],
        {EXTRACT_VLLM: "tokens per train prompt in the timed plain generation (as in 01)"},
        ge=1,
    )
    temperature: float = _p(0.0, "0 for greedy, above 0 samples", [GENERATE], ge=0)
    top_p: float = _p(1.0, "nucleus sampling when temperature > 0", [GENERATE], gt=0, le=1)
    sampled_continuations: int = _p(
        0,
        "extra continuations per train prompt, sampled at sample_temperature with top_p (more varied training data; 0 for none)",
        [GENERATE],
        ge=0,
    )
    sample_temperature: float = _p(
        0.8, "temperature of the extra sampled continuations", [GENERATE], gt=0
    )
    sampled_prefix_tokens: int = _p(
        0,
        "sample only the first N tokens of each extra continuation, then continue greedily (greedy-style data from varied contexts; 0 samples it whole)",
        [GENERATE],
        ge=0,
    )
    gen_batch_size: int = _p(64, "prompts or dialogues per batched generate call", [GENERATE], ge=1)
    generate_engine: Literal["hf", "vllm", "sglang"] = _p(
        "hf", "hf (transformers generate), vllm or sglang (each engine in its venv)", [GENERATE]
    )
    generate_speed_engines: list[Literal["hf", "vllm", "sglang"]] = _p(
        None,
        "other engines timed on the same prompts or conversations after 01 (tokens/s, ids equal to the run)",
        [GENERATE],
        default_factory=list,
    )
    generate_workers: int = _p(
        1,
        "with dataset: engine worker processes regenerating shares of the conversations (data parallel, each resumable; one GPU each)",
        [GENERATE],
        ge=1,
    )
    # 02a_extract_vllm and 02b_extract_sglang (convention and layer_ids: also 03_train)
    extract_engine: Literal["sglang", "hf"] = _p(
        "sglang",
        "sglang (SGLang's own model path, in its venv) or hf (HF transformers at SGLang's capture point)",
        [EXTRACT_SGLANG],
    )
    sglang_python: Optional[str] = _p(
        None,
        "python of the SGLang venv (None for the cache made by .ci/setup_engines.sh; empty string to import sglang here on a GPU box)",
        [GENERATE, EXTRACT_SGLANG, TRAIN, EVAL],  # 03: the export's ids by this version's rule
    )
    sglang_options: dict = _p(
        None,
        "for the SGLang backend: max_total_tokens (KV pool, tokens), engine_kwargs for sglang.Engine (e.g. tp_size, ep_size, mem_fraction_static on GPUs; capture settings cannot be overridden), capture_route (auto, engine or runner: SGLang's aux API or its in-process ModelRunner) and native_ops (torch ops, SGLang 0.5.17)",
        [GENERATE, EXTRACT_SGLANG, EVAL],
        default_factory=dict,
    )
    convention: str = _p(
        "sglang",
        "layer-id convention of layer_ids (sglang, vllm, speculators_le_0.4, speculators_ge_0.5, specforge, eagle)",
        [EXTRACT_VLLM, EXTRACT_SGLANG, TRAIN, DRIFT],
        {
            EXTRACT_VLLM: "layer-id convention of layer_ids (they name the run's boundaries; vLLM is asked with its own ids for them)",
            TRAIN: "convention of the dataset's layer ids (checked against its manifest)",
            DRIFT: "convention of layer_ids (names the trained boundaries and the layer-offset row)",
        },
    )
    layer_ids: Optional[list[int]] = _p(
        None,
        "aux layer ids in that convention; None for the default low/mid/high boundaries",
        [EXTRACT_VLLM, EXTRACT_SGLANG, TRAIN, DRIFT],
        {
            TRAIN: "ids the drafter will be served with (None for the default); must name the dataset's boundaries"
        },
    )
    shard_size: int = _p(64, "samples per shard file", [EXTRACT_VLLM, EXTRACT_SGLANG], ge=1)
    capture_batch_size: int = _p(
        32,
        "samples per engine call",
        [EXTRACT_VLLM, EXTRACT_SGLANG],
        {EXTRACT_SGLANG: "samples per engine call (SGLang batches inside a call)"},
        ge=1,
    )
    allow_boundary_mismatch: bool = _p(
        False,
        "write the dataset although measured and declared boundaries differ",
        [EXTRACT_VLLM, EXTRACT_SGLANG],
    )
    twin_check: Literal["enforce", "warn", "off"] = _p(
        "enforce",
        "engine capture of a tiny random twin of the target at the run ids, slots named by HF "
        "boundaries and compared with engine_rules: enforce stops on a disagreement, warn records "
        "it, off skips it. A real engine measurement is cached per engine version, twin and ids "
        "(env EAGLE3NB_TWIN_PROOFS set to off: measured every run)",
        [EXTRACT_VLLM, EXTRACT_SGLANG],
    )
    measure_engine_speed: bool = _p(
        False,
        "also time plain generation and prefill without capture by SGLang (on the running "
        "capture engine, no restart)",
        [EXTRACT_SGLANG],
    )
    drift_samples: int = _p(
        4,
        "samples compared across engines and dtypes in the drift figure (0 for none)",
        [EXTRACT_SGLANG],
        ge=0,
    )
    drift_both_dtypes: bool = _p(
        False,
        "also capture those samples with SGLang in the other dtype (its engine restarts in it once)",
        [EXTRACT_SGLANG],
    )
    compare_run: Optional[str] = _p(
        None, "another run_name whose dataset to overlay in the interactive view", [EXTRACT_SGLANG]
    )
    aux_storage: Literal["dtype", "int8"] = _p(
        "dtype",
        "aux states on disk: dtype (as captured) or int8 (one scale per token and slot; error recorded)",
        [EXTRACT_SGLANG],
    )
    extract_workers: int = _p(
        1,
        "worker processes, each writing a slice of the shards (a lost one is redone on rerun)",
        [EXTRACT_SGLANG],
        ge=1,
    )
