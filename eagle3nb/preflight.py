"""Checks made before any notebook runs: the run's parameters against the target's config.json
(architecture, tokenizer, vocab, layer ids, drafter heads) and the engines a run will start.

``python -m eagle3nb.run`` calls :func:`check_against_model` after validating the params file, so a
bad run fails in seconds, naming the parameter, the value and the fix, before any long work.
"""

from __future__ import annotations

from eagle3nb.params import RunParams


def check_against_model(p: RunParams) -> dict:
    """Upfront checks of ``p`` against the target's ``config.json`` (no weights are loaded), so that
    a run fails before any notebook executes.

    Returns:
        ``{"path", "n_layers", "vocab_size", "layer_ids", "boundaries", "engines"}``: the model
        folder, its num_hidden_layers and vocab_size, the aux ids (in ``p.convention``) and
        boundaries the run will capture, and per engine used its version and ids
        (:func:`check_engine_rules`).

    Raises:
        FileNotFoundError: the model is not found (the message lists every place looked at).
        ValueError: naming the parameter, its value and the fix, for: an unsupported or refused
            architecture (:func:`eagle3nb.target.models.target_arch`) or a folder without tokenizer; ``draft_vocab_size`` > the target's vocab; ``layer_ids`` the
            convention cannot capture for this many layers, or giving non-increasing boundaries;
            ``layer_ids: null`` on a target too small for the default picker; ``draft_num_heads``
            not a multiple of ``draft_num_kv_heads``; ``threads`` above the cores this process may
            use (:func:`eagle3nb.threads.plan`); vLLM parameters (see
            :func:`eagle3nb.engines.vllm_helpers.check_vllm_params`), ``sglang_options``
            (:func:`eagle3nb.engines.sglang_helpers.check_sglang_options`); an engine whose layer-id rule
            for the target's class refuses the run (:func:`check_engine_rules`); ``init_from`` for
            another target or other boundaries (:func:`eagle3nb.steps.train.step.adoption_for`).
        FileNotFoundError: also when a step uses vLLM and ``vllm_python`` does not exist.
    """
    from eagle3nb.boundaries import conventions
    from eagle3nb.target import models

    path = models.resolve_model(p.model)
    cfg = models.text_config(models.check_model_folder(path))  # wrappers: their text model's
    n, V = cfg.get("num_hidden_layers"), cfg.get("vocab_size")
    for k, v in (("num_hidden_layers", n), ("vocab_size", V)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(
                f"model={p.model!r}: {path}/config.json has {k}={v!r}; eagle3nb needs a positive int there (restore the original config.json)"
            )
    if p.draft_vocab_size > V:
        raise ValueError(
            f"draft_vocab_size={p.draft_vocab_size} exceeds the target vocab_size={V} of model={p.model!r}; set draft_vocab_size to at most {V}"
        )
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
    if p.extract_engine == "sglang" or _online_from(p, "sglang"):
        try:
            conventions.get_convention("sglang").boundaries_to_ids(b, n)
        except ValueError as e:
            raise ValueError(
                f"extract_engine='sglang' cannot capture boundaries {b} (layer_ids={p.layer_ids}, convention {p.convention!r}) on model={p.model!r}: {e}; SGLang never captures boundary N={n} (its hooks take layer inputs only): pick lower boundaries, or set extract_engine: hf"
            ) from None
    nh = p.draft_num_heads or cfg.get("num_attention_heads")
    nkv = p.draft_num_kv_heads or (min(nh, cfg.get("num_key_value_heads") or nh) if nh else None)
    if p.drafter_head == "mla" and not cfg.get("kv_lora_rank"):
        raise ValueError(
            f"drafter_head='mla' on model={p.model!r} ({models.target_arch(cfg, p.model)}): the MLA "
            "head is for MLA targets (kv_lora_rank in the config: DeepSeek-V2/V3, Kimi-K2), which "
            "this is not, and no engine here serves it beside another; set drafter_head: llama"
        )
    if nh and nkv and nh % nkv and p.drafter_head != "mla":  # MLA: a k and v per head
        raise ValueError(
            f"draft_num_heads={p.draft_num_heads} ({nh} heads) is not a multiple of draft_num_kv_heads="
            f"{p.draft_num_kv_heads} ({nkv} kv heads; 0 = from the target); pick divisible head counts, "
            f"e.g. draft_num_kv_heads: {nh}"
        )
    if p.threads >= 0:  # more threads than this process may use: refused before any notebook
        from eagle3nb.threads import plan

        plan(p.threads)
    from eagle3nb.engines.vllm_helpers import check_vllm_params

    check_vllm_params(p, cfg)  # vLLM venv present, options known, head_dim it accepts
    from eagle3nb.engines.sglang_helpers import check_sglang_options

    check_sglang_options(p.sglang_options)
    engines = check_engine_rules(p, models.target_arch(cfg, p.model), n, b, cfg)
    if p.init_from:  # 03's starting drafter: another target's, or other boundaries, refused now
        from eagle3nb.steps.train.step import adoption_for

        adoption_for(p)
    return {
        "path": str(path),
        "n_layers": n,
        "vocab_size": V,
        "layer_ids": ids,
        "boundaries": b,
        "engines": engines,
    }


def _online_from(p: RunParams, engine: str) -> bool:
    """Whether 03 trains online on states ``engine`` captures (``online_engine``)."""
    return p.training_mode == "online" and getattr(p, "online_engine", "hf") == engine


def _uses_vllm(p: RunParams, key: str) -> bool:
    """Whether ``key`` (vllm_extract, or eval_engines naming vllm explicitly) starts vLLM."""
    return bool(p.vllm_extract) if key == "vllm_extract" else "vllm" in p.eval_engines


def check_engine_rules(
    p: RunParams, arch: str, n: int, boundaries: list[int], cfg: dict | None = None
) -> dict:
    """Each engine the run captures with or serves a drafter through, checked against its layer-id
    rule for the target's class (:func:`eagle3nb.boundaries.rules.engine_rule`): SGLang when
    ``extract_engine: sglang`` (02b), vLLM when ``vllm_extract`` (02a) or ``eval_engines`` names it (04; ``[auto]`` skips an engine
    that cannot serve, it never refuses). The
    engine's version is read from its installed package, never assumed.

    Returns:
        ``{engine: {"version", "ids", "rule", "source"}}``: the ids eagle3nb gives that engine for
        ``boundaries`` (its name convention, as 02a/02b and the export write them) and the rule.

    Raises:
        ValueError: naming the parameter, the class, engine and version: a combination the table
            refuses (Gemma-3 on SGLang 0.5.23; GLM-4.5 and Gemma-3 on vLLM 0.32), a version or class
            no version file holds, with ``twin_check: off`` (else it is measured on the installed
            engine, :func:`_rule_or_measure`) or whose measurement is refused, boundaries the rule cannot capture (vLLM
            DeepSeek boundary 0, SGLang boundary N), or ids that the engine's rule for this class
            maps to other boundaries (SGLang 0.5.23 DeepSeek/Kimi with a first boundary other
            than 2).
            Also, on ``device: cpu``, a class the engine is measured not to run there
            (:data:`eagle3nb.boundaries.rules.CPU_LIMITS`: e.g. SGLang's DeepSeek MLA, silently
            wrong), or a config it is measured not to run there (``cfg``, the text config:
            :data:`~eagle3nb.boundaries.rules.CPU_CONFIG_LIMITS`, e.g. vLLM MLA without a
            576-wide latent head or YaRN).
        RuntimeError: the engine is not installed for its python.
    """
    from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
    from eagle3nb.engines.versions import installed_engine_version
    from eagle3nb.engines.vllm_helpers import vllm_python
    from eagle3nb.boundaries.conventions import get_convention
    from eagle3nb.boundaries.rules import cpu_config_limit

    uses = []
    if p.extract_engine == "sglang":
        py = DEFAULT_ENGINE_PYTHONS["sglang"] if p.sglang_python is None else p.sglang_python
        uses.append(
            ("sglang", "extract_engine='sglang'", py, "set extract_engine: hf", ["capture"])
        )
    if _online_from(p, "sglang"):  # 03 captures through SGLang while training
        py = DEFAULT_ENGINE_PYTHONS["sglang"] if p.sglang_python is None else p.sglang_python
        fix = "set online_engine: hf, or training_mode: offline"
        uses.append(("sglang", "online_engine='sglang'", py, fix, ["capture"]))
    if _online_from(p, "vllm"):
        fix = "set online_engine: hf, or training_mode: offline"
        uses.append(("vllm", "online_engine='vllm'", vllm_python(p), fix, ["capture"]))
    if "sglang" in p.eval_engines and p.extract_engine != "sglang":  # [auto] skips, never refuses
        py = DEFAULT_ENGINE_PYTHONS["sglang"] if p.sglang_python is None else p.sglang_python
        fix = "leave sglang out of eval_engines"
        uses.append(("sglang", f"eval_engines={p.eval_engines}", py, fix, ["serve"]))
    on = [k for k in ("vllm_extract", "eval_engines") if _uses_vllm(p, k)]
    if on:
        param = " and ".join(f"{k}={getattr(p, k)}" for k in on)
        fixes = {
            "vllm_extract": "set vllm_extract: false",
            "eval_engines": "leave vllm out of eval_engines",
        }
        fix = " and ".join(fixes[k] for k in on)
        kinds = [{"vllm_extract": "capture", "eval_engines": "serve"}[k] for k in on]
        uses.append(("vllm", param, vllm_python(p), fix, kinds))
    import torch

    on_cpu = p.device == "cpu" or (p.device == "auto" and not torch.cuda.is_available())
    out = {}
    for engine, param, python, fix, kinds in uses:
        version = installed_engine_version(engine, python)
        head = f"{param} on model={p.model!r} ({arch}, {n} layers, boundaries {boundaries})"
        try:
            ids = get_convention(engine).boundaries_to_ids(boundaries, n)
            rule = _rule_or_measure(p, engine, version, arch, python, ids, on_cpu)
            got = rule.ids_to_boundaries(ids, n)
        except ValueError as e:
            raise ValueError(f"{head}: {e}; or {fix}") from None
        if got != list(boundaries):
            raise ValueError(
                f"{head}: eagle3nb gives {engine} the ids {ids} (its '{engine}' convention), which "
                f"{engine} {version} maps to boundaries {got} for this class (rule {rule.kind!r}, "
                f"{rule.source}); pick boundaries whose ids it reads as meant (for SGLang "
                f"DeepSeek/Kimi: a first boundary of 2, as the default [2, N//2, N-3]), or {fix}"
            )
        for use in kinds if on_cpu else []:
            if use == "serve" and getattr(p, "drafter_head", "llama") == "mla":
                use = "serve_mla"  # an MLA drafter: its own CPU limits (boundaries/cpu_limits.py)
            why = cpu_config_limit(engine, version, arch, cfg or {}, use)
            if why:
                raise ValueError(
                    f"{head}: {engine} {version} cannot {use} {arch} on CPU: {why}; {fix}, or "
                    "run on a GPU (device: cuda)"
                )
        out[engine] = {
            "version": version,
            "ids": ids,
            "rule": rule.kind,
            "source": rule.source,
            "known_by": rule.known_by,
        }
    return out


def _rule_or_measure(p: RunParams, engine, version, arch, python, ids, on_cpu):
    """The engine's rule for ``arch``: its version file's row or a kept measurement
    (:func:`eagle3nb.boundaries.rules.engine_rule`); for a key neither holds, measured now on the
    installed engine (twin_check not off: :func:`eagle3nb.engines.twin_measure.measure_in_preflight`,
    kept per user so 02-05 read it back).

    Raises:
        ValueError: the lookup's refusal with ``twin_check: off``; a measurement's refusal.
    """
    import tempfile

    from eagle3nb.boundaries.rules import engine_rule
    from eagle3nb.target import models

    try:
        return engine_rule(engine, version, arch)
    except ValueError:
        if p.twin_check == "off":
            raise
    from eagle3nb.engines.twin_measure import measure_in_preflight

    device = "cpu" if on_cpu else "cuda"
    with tempfile.TemporaryDirectory(prefix="eagle3nb-measure-") as work:
        path = models.resolve_model(p.model)
        opts = {"options": p.sglang_options} if engine == "sglang" else {}  # its capture_route
        got = measure_in_preflight(engine, python, path, ids, p.dtype, device, work, p.seed, **opts)
    print(f"preflight: {engine} {version} on {arch}: rule measured ({got['rule'].summary()})")
    return got["rule"]


def check_inputs(p: RunParams) -> dict:
    """01's input read as 01 reads it, before any notebook: the prompts file, or with ``dataset``
    set the chat dataset (an empty file, records all refused), and the train / held-out split of
    what it holds (:func:`split_checked`); and 04's ``eval_dataset`` as 04 reads it (an empty
    file, no valid record). Reads no model.

    Returns:
        ``{"source", "n", "n_train", "n_heldout", "refused"}``: the parameter read, its prompts or
        kept records, the split's sizes (before ``max_train_prompts``), the records refused; with
        ``eval_dataset``, ``"eval_dataset": {"format", "n", "refused"}``.

    Raises:
        FileNotFoundError: no such prompts file or dataset. ValueError: naming the parameter, the
            value and the fix: ``the file is empty``, no prompt or duplicates in the prompts file,
            every record refused, a split with no train or no held-out item.
    """
    from eagle3nb.repo_paths import resolve_path
    from eagle3nb.text import conversations
    from eagle3nb.text.prompts import load_prompts

    refused: list[dict] = []
    if p.dataset is None:
        source, unit = f"prompts_file={p.prompts_file!r}", "prompts"
        items = load_prompts(resolve_path(p.prompts_file))
    else:
        source, unit = f"dataset={p.dataset!r}", "conversations"
        path = resolve_path(p.dataset)
        conversations.check_not_empty(path, p.dataset)
        _, recs, refused = conversations.load_records(path, p.dataset_format)
        check_records_left(p, recs, refused)
        items = [r["id"] for r in recs]
    train, held = split_checked(items, p, source, unit)
    out = {
        "source": source,
        "n": len(items),
        "n_train": len(train),
        "n_heldout": len(held),
        "refused": len(refused),
    }
    if p.eval_dataset is not None:  # 04's benchmark, read as 04 reads it, before any notebook
        from eagle3nb.params.paths import eval_dataset_path
        from eagle3nb.text.benchmarks import load_benchmark

        got = load_benchmark(eval_dataset_path(p.eval_dataset))
        out["eval_dataset"] = {"format": got.format, "n": len(got.records), "refused": got.refused}
    return out


def check_records_left(p: RunParams, records: list, refused: list[dict]) -> None:
    """Refuse a chat dataset whose records were all refused.

    Raises:
        ValueError: naming ``dataset``, the count and the first refusal.
    """
    if not records:
        raise ValueError(
            f"dataset={p.dataset!r}: all {len(refused)} records were refused (first: "
            f"{refused[0] if refused else None}); fix the records or the dataset_format"
        )


def split_checked(items: list[str], p: RunParams, source: str, unit: str) -> tuple[list, list]:
    """:func:`eagle3nb.text.prompts.split_prompts` of ``items`` (prompts or conversation ids) at
    ``p.heldout_fraction`` and ``p.seed``, refused unless both sides hold one: 03 trains on the
    train side and evaluates on the held-out one, and 04 measures acceptance on the held-out one.

    Returns:
        ``(train, heldout)``.

    Raises:
        ValueError: ``heldout_fraction=F holds out H of the N <unit> of <source> (T left to
            train on)`` with the fix: a fraction that gives both sides one at this seed (found by
            splitting again), or more items; fewer than 2 items: how many a run needs.
    """
    from eagle3nb.text.prompts import split_prompts

    f, n = p.heldout_fraction, len(items)
    train, held = split_prompts(items, f, p.seed)
    if train and held:
        return train, held
    if n < 2:
        raise ValueError(
            f"{source} holds {n} {unit}; a run needs at least 2 (one to train on, one held out "
            f"for evaluation at heldout_fraction={f}): add {unit}"
        )
    fix = f"add {unit}"
    grid = sorted((round(0.05 * i, 2) for i in range(1, 20)), key=lambda g: abs(g - f))
    for g in grid:  # the nearest fraction that splits these items at this seed
        t, h = split_prompts(items, g, p.seed)
        if t and h:
            fix = (
                f"set heldout_fraction: {g} (holds out {len(h)} of {n} at seed={p.seed}), or {fix}"
            )
            break
    raise ValueError(
        f"heldout_fraction={f} holds out {len(held)} of the {n} {unit} of {source} ({len(train)} "
        f"left to train on); 03 needs one to train on and one held out, 04 one held out: {fix}"
    )
