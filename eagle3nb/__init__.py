"""eagle3nb: train EAGLE-3 drafters on exactly the hidden states the serving engine will feed them.

Package map (one line per subpackage and module; tests/test_layout.py checks it is complete):

boundaries/         the ground floor: boundary b and each engine's layer ids (imports no other folder)
    conventions     each engine's and trainer's layer ids <-> physical boundaries
    rules           the id rule per (engine, engine version, architecture class), refusals; the lookup
    version_file    the shape of one engine version's file: id rules, CPU limits, flags read, sources
    versions/       one file per engine version read from source (adding a version is adding a file)
        sglang_0_5_17  SGLang 0.5.17 (the GPU host's): id rule per class, source lines (its wheel)
        sglang_0_5_23  SGLang 0.5.23: id rule per class, CPU limits, variant flags, source lines
        vllm_0_32_0  vLLM 0.32.0 (CPU build): id rule per class, CPU limits, variant flags, source lines
        vllm_0_26_0  vLLM 0.26.0 (the GPU host's engine): id rule per class, variant flags, source lines
        vllm_0_31_0  vLLM 0.31.0 (CPU build, bench venv): id rule per class, variant flags, source lines
        sglang_0_5_22  SGLang 0.5.22 (bench venv; no capture-only mode): id rule per class, variant flags
    cpu_limits      classes and configs each engine version is measured not to run on CPU (gathered)
    cpu_checks      config-dependent CPU limits (MLA latent width, YaRN factor, chunk size)
    config_ids      where each engine reads and writes its layer ids in a drafter config.json
    measured        a rule derived from a twin's id -> boundary matrix (no version file for the key)
    measured_store  measured rules kept per user, one JSON file per (engine, version, class)
    export_ids      the ids written per engine: its rule for the target class, or its convention
    refusal         an engine refused in a drafter config: the mark it stops on, why, the set to retrain at
    engine_read     read an exported config as each serving engine does; what it ignores
    flavours        which engine version reads which variant flag (EAGLE-3.1 flavours)
    alignment       which boundary an engine really captured, measured against HF
target/             the target model: model folders, HF capture, twins, quantized copies
    models          find (explicit path, $EAGLE3NB_MODEL_PATH, ../shared/models), load, hash
    twin            a tiny random-weight twin of a target, from its config.json; slots named on it
    moe_copy        a dense Llama re-expressed as a Mixtral MoE of the same function (no download)
    derived         a model folder derived from a local one, written once and atomically
    pad_mlp         a copy with the MLP zero-padded to a wider width, the same function (SGLang CUDA)
    capture         residual stream at boundaries behind one CaptureEngine interface (HF);
                    the HF reference at every boundary
    head            the target's embedding, final norm and lm_head alone, read by tensor name
    quantize        quantized variants (compressed-tensors w8a8, w4a16) written from the local model
text/               the text side: prompts, chat samples and loss masks, the target's continuations
    prompts         prompt files and the deterministic train / held-out split
    chat            (input_ids, loss_mask) training samples, chat template or plain text
    generation      the target regenerates continuations, written as JSONL
    conversations   users' chat datasets (OpenAI, ShareGPT, text) via datasets; bad records refused
    jsonlines       JSON-lines files read line by line: a line that is not a JSON object refused by number
    regenerate      chat datasets regenerated turn by turn, resumable; rows from served ids
    benchmarks      benchmark sets (MT-Bench, GSM8K, HumanEval, MATH, chat) per record; bad ones refused
dataset/            the offline aux-state dataset: safetensors shards plus a manifest
    layout          shard layout, exact byte counts, optional int8 storage of aux states
    write           write shards from a capture engine (atomic, resumable, per-shard sha256),
                    one shard written on a thread while the next is captured
    shard_file      one safetensors file written from tensor memory and hashed on the way
    read            AuxDataset: open and verify a dataset, in memory or memory-mapped
training/           training the drafter with training-time test (TTT)
    batches         deterministic global batch plan over the shards, rank slices
    objective       the TTT loss and per-step accuracy
    loop            the training loop: one process, or DDP/FSDP under torchrun, CPU or GPU
    init_from       03 from a drafter someone else trained: any peer format, its boundaries kept or moved
    fastpath        how training runs on its device: bf16-mixed precision, compiled layer, fused AdamW
    distributed     process group, DDP/FSDP wrapping, per-rank checkpoints, torchrun launch
    online          online training: the target captures each batch's aux states in the loop
    engine_online   online training fed by the serving engine: batches captured ahead, re-checked
    transport       captured batches handed to the trainer: put / get / close, bounded in bytes
    online_cache    opt-in first-epoch cache of engine captures, bounded in bytes, dataset format
    shard_target    online training with the target sharded over the ranks (FSDP2)
    progress        progress lines (stdout, train.log), bar postfix, tensorboard/wandb/mlflow
    monitor         after each step: history entry, progress line, held-out evaluation, best
    heldout         held-out teacher-forced accuracy and simulator tau on a drafter copy
drafter/            the EAGLE-3 draft model and what is done with it
    model           the drafter (mirrors SGLang llama_eagle3 and vLLM's EAGLE-3 head)
    flex_attention  the TTT attention through flex attention (fast path; eager is the reference)
    mla             the drafter with MLA attention for DeepSeek/Kimi targets (vLLM deepseek_eagle3,
                    SGLang kimi_k25_eagle3)
    vocab           draft vocabulary: d2t offsets and the t2d mask from token counts
    export          export for SGLang and vLLM, load back (refusing broken folders)
    acceptance      greedy chain speculative decoding with the real target (the simulator)
    ksweep          tau and acceptance for every k' <= k from drafts at every position (exact)
    shared_eval     04's simulator: one target forward per prompt shared by every drafter
    card            serving commands for SGLang and vLLM, the Hub-ready model card
    hub             upload an exported drafter through huggingface_hub (dry run by default)
engines/            real engines (vLLM, SGLang) behind one interface, across a process boundary
    worker          engine side: JSON-line worker in the engine's venv; the backend contract
    child_watch     engine side: the worker's watch over its engine processes (one that exits fails the call)
    vllm_backend    engine side: vLLM generation, capture (extract_hidden_states), EAGLE-3 serving
    vllm_connector  engine side: synchronous hidden-states connector that vLLM loads
    vllm_eager      engine side: vLLM on CUDA with graphs off captures boundary N at id 0
    sglang_backend  engine side: SGLang generation and aux capture through sglang.Engine
    sglang_runner   engine side: SGLang capture through its in-process ModelRunner (no aux API)
    sglang_capture_ids  engine side: a loaded SGLang model's captured layers reset and set between forwards
    sglang_ops      engine side: SGLang's CUDA kernel limits (MLP width) and the torch-ops patch
    sglang_netns    engine side: the SGLang worker's loopback-only network namespace
    sglang_transport  engine side: SGLang's scheduler hands captured states over as tensors
    sglang_forkserver  engine side: SGLang's scheduler and detokenizer forked from one preloaded server
    sglang_spec_cpu  engine side: SGLang's missing CPU speculative ops registered; the gated install
    sglang_spec_ops  engine side: the torch stand-ins for those ops, one function per op
    sglang_spec_versions  engine side: per SGLang version (0.5.22, 0.5.23): each op's schema and callers
    sglang_spec_attn  engine side: SGLang's torch_native attention for the multi-step draft and the verify pass
    sglang_serve    engine side: SGLang serves an exported drafter (serve_acceptance), its own counters summed
    client          notebook side: EngineClient starts, talks to and stops the worker
    in_process      notebook side: an engine imported here leaves torch.compile's threads as they were
    pool            notebook side: workers kept running for reuse in one process ($EAGLE3NB_KEEP_ENGINES)
    versions        the version of an engine installed for a python, read without starting it
    adapter         notebook side: an EngineClient as a CaptureEngine for the dataset writer
    twin_check      notebook side: an engine's id rule measured on a twin, against engine_rules
    twin_measure    notebook side: an engine version's id rule measured on a twin (preflight, 02)
    twin_cache      notebook side: the twin proof's measurement cached on disk, keyed by all it depends on
    vllm_helpers    notebook side: vLLM parameters and start
    speed           notebook side: an engine's extraction, prefill and generation speed (vLLM, SGLang)
    sglang_helpers  notebook side: 02b's SGLang path, boundary N from HF checked against SGLang
viz/                figures and interactive views
    plots           Plotly figures, standalone HTML that opens offline
    drift_plots     05's figures: drift per source and boundary, the train x serve matrix
    audit_plots     06's figure: tau per candidate boundary set, declared and measured best marked
    served          04's served results: tau per category and engine, speedup per batch size
    views           JupyterLab views (ipywidgets + plotly FigureWidget)
audit/              a drafter trained elsewhere: its boundaries, each engine's reading, corrected ids
    formats         drafter folders as engines and peers write them; refusals for another target
    flavour         the drafter's EAGLE-3.1 flavour, and tau of its weights read as the other
    measure         engine readings, candidate boundary sets, their tau by the simulator
    patch           the corrected copy (each engine's ids for the measured best), serving commands
    servable        what each engine does with a folder: captured states, load refusals, CPU limits
    core            run_audit: read, refuse, measure, write; the summary lines
    __main__        python -m eagle3nb.audit DRAFTER --model TARGET [--engine] [--out]
offline/            an engine for a GPU host with no package index: a bundle of parts built here
    sets            engine version per torch pin, the wheels beyond the host image, prune rules
    bundle          download (cached), stage, prune, tar | xz in parts, manifest.json
    installer       install.sh: check sha256, reassemble, unpack, print the export line
    check           on the host: versions, an engine on a local target vs HF greedy tokens
    __main__        python -m eagle3nb.offline build --python-version --torch | check
steps/              one folder per notebook, called from its cells and from eagle3nb.run
    shared/         what the steps share
        checks      run-folder inputs, checks written once (generation, boundaries), metrics helpers
        recorded    02a/02b/04/05's results recorded in the run folder, read back on a re-run
    generate/       01_generate
        step        01's step: the target's continuations of the train prompts
        chat        01 on a chat dataset: refusals, split by conversation, regeneration
        workers     01's regeneration through one engine here, or data parallel over workers
    extract/        02a_extract_vllm and 02b_extract_sglang
        sharded     02's shared plumbing: samples, disk plan, engine speed, sharded extraction
        from_vllm   02a's step: aux states through vLLM's own forward
        from_sglang  02b's step: aux states through SGLang (or HF at SGLang's capture point)
        twin_gate   02a/02b: the twin proof before extraction (twin_check: enforce, warn, off)
        engine_drift  02b's drift figure data: the same probe tokens from other engines and dtypes
    train/          03_train
        step        03's step, also from the command line and on every torchrun rank
        heldout_slice  03's held-out slice (01's held-out prompts) for evaluation during training
        online_engine  03 online from vLLM or SGLang: the engine started and proven as in 02a/02b
    evaluate/       04_eval_acceptance
        step        04's step: who measures (eval_engines), then the simulator and engines
        simulator   04's simulator over an HF copy of the target; 04's result and metrics assembled
        served      04's serving engines: each serves the drafter (and its layer offset) per
                    category, k and batch size, with and without the drafter
        serve_loop  04's serving loop: drafter and plain workers timed turn about, rounds
        progress    04's progress and notices (refused, left out) on the terminal and in eval.log
        bench       04's prompt set (held-out, a benchmark turn by turn) and the engine loop
        chat        04's held-out prompts rendered with its template; acceptance per turn index
        publish     04's serving files: serve_commands.md and the drafter's model card
    drift/          05_drift
        step        05's step: one drafter per source and seed, the train x serve acceptance matrix
        sources     05's sources (engine, dtype, quantization): capture, drift against float32 HF
        report      05's reading of the matrix: noise bars, the diagonal, the recommendation
    audit/          06_audit (the audit itself: audit/ above)
        prompts     06's prompts: held-out prompts and eval_dataset's turns as 04 renders them
data/               package data: prompts_tinystories.txt (default prompts), chat_stories.*.jsonl
                    (chat dataset, two forms), chat_template_stories.jinja,
                    bench_tinystories_mtbench.jsonl (04's benchmark set, MT-Bench form)
params/             run parameters: one validated model for params/*.yaml and the parameters cells
    fields          the common, 01 and 02 fields of RunParams (InputFields), the notebook groups
    schema          RunParams: every parameter's default, range, help and notebooks, once
    paths           checks of the prompts file, chat dataset and chat template paths
    load            params YAML files and a notebook's globals, validated; errors that name the fix
    sync            parameters cells and docs/parameters.md rendered from RunParams
    __main__        python -m eagle3nb.params sync [--check]
padding             pad_right: variable-length samples -> right-padded batch and mask
timing              speed figures as measurements: rounds, median, spread, bound, verdict (a leaf)
threads             thread budget per process (affinity, cgroup quota): kernel and engine workers
repo_paths          REPO_ROOT and paths resolved against it (a leaf: standard library only)
rundir              one run's folder outputs/<run_name>/: artefact paths, metrics.json
preflight           checks before any notebook runs: parameters vs the target's config, engines
manifest            what produced an artefact, so a later step can refuse a mismatch
run                 papermill driver: python -m eagle3nb.run PARAMS.yaml
rules               python -m eagle3nb.rules: the support matrix of the engines installed (class x version)
report              run browser: runs with their metrics and figures, two runs compared
results_page        docs/results.md generated from bench/reference_*.json (python -m eagle3nb.report results)
"""

__version__ = "0.1.0"
