"""Find and load target models from local folders (never from a hub).

Resolution order for :func:`resolve_model`: an explicit existing path, then each folder listed in
``$EAGLE3NB_MODEL_PATH`` (os.pathsep-separated), then ``../shared/models`` next to the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from eagle3nb.repo_paths import REPO_ROOT

__all__ = [
    "as_stop_list",
    "stop_token_ids",
    "resolve_model",
    "model_search_dirs",
    "load_target",
    "load_tokenizer",
    "model_hash",
    "read_model_config",
    "check_model_folder",
    "DTYPES",
    "SUPPORTED_ARCHS",
    "ARCH_MODULES",
    "REFUSED_ARCHS",
    "text_config",
    "target_arch",
    "ARCH_ALIASES",
]

ENV_VAR = "EAGLE3NB_MODEL_PATH"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# architecture class (config.json ``architectures``) -> the transformers module that defines it.
# Every one is captured by eagle3nb.target.capture (boundary b = HF ``hidden_states[b]`` for b < N,
# boundary N = the final norm's input), proven on tiny random-weight models in
# tests/target/test_archs.py. Wrappers (``...ForConditionalGeneration``) are captured through their
# text decoder at ``model.language_model``.
ARCH_MODULES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",  # also Kimi-K2 (model_type kimi_k2, see load_target)
    "Kimi_K25ForConditionalGeneration": "kimi_k25",  # DeepSeek-V3 text model + vision tower
    "GptOssForCausalLM": "gpt_oss",
    "Glm4MoeForCausalLM": "glm4_moe",
    "Llama4ForCausalLM": "llama4",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "MiniMaxM2ForCausalLM": "minimax_m2",
    "MixtralForCausalLM": "mixtral",  # Llama attention + MoE MLP (eagle3nb.target.moe_copy)
}
SUPPORTED_ARCHS = set(ARCH_MODULES)
# classes refused by name, with the reason and the fix
REFUSED_ARCHS = {
    "Llama4ForConditionalGeneration": (
        "its forward fails in transformers 5.24 even without hidden states (AttributeError "
        "'MoeCausalLMOutputWithPast' object has no attribute 'image_outputs', "
        "models/llama4/modeling_llama4.py:1318)",
        "save its text model as Llama4ForCausalLM (model.language_model, with config.text_config) "
        "and point model at that folder",
    ),
}
# class names the engines register for a class transformers spells otherwise (SGLang
# models/kimi_k25.py:988, vLLM models/kimi_k25.py:291) -> transformers' class
ARCH_ALIASES = {"KimiK25ForConditionalGeneration": "Kimi_K25ForConditionalGeneration"}
# model_type values transformers does not register, read as the class they are (as transformers'
# own Kimi-K2.5 config does for its text model, configuration_kimi_k25.py __post_init__)
MODEL_TYPE_ALIASES = {"kimi_k2": "deepseek_v3"}


def model_search_dirs() -> list[Path]:
    """Folders searched for a model given by name, in order."""
    dirs = [Path(p) for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p]
    dirs.append(REPO_ROOT.parent / "shared" / "models")
    return dirs


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """Resolve a model name or path to a local HF folder holding ``config.json``.

    Args:
        name_or_path: an existing folder, or a folder name looked up in :func:`model_search_dirs`,
            or ``twin:<config.json>``: a tiny random-weight twin of that config (no download),
            built once into ``$EAGLE3NB_TWINS`` (default ``~/.cache/eagle3nb/twins``) with the
            default target's tokenizer (:func:`eagle3nb.target.twin.build_twin`);
            or a name of :data:`eagle3nb.target.moe_copy.DERIVED` (written on first use into
            ``moe_copy.cache_dir()`` from its source model, found the same way), or of
            :data:`eagle3nb.target.pad_mlp.DERIVED` (the MLP-padded copy, the same way).

    Returns:
        Absolute path of the model folder.

    Raises:
        FileNotFoundError: nothing found; the message lists every place looked at and how to add one.
    """
    if str(name_or_path).startswith(TWIN_PREFIX):
        return _twin_model(str(name_or_path)[len(TWIN_PREFIX) :])
    looked = []
    p = Path(name_or_path).expanduser()
    candidates = [p] if p.is_absolute() or p.exists() else []
    candidates += [d / str(name_or_path) for d in model_search_dirs()]
    for c in candidates:
        looked.append(str(c))
        if (c / "config.json").is_file():
            return c.resolve()
    from eagle3nb.target import moe_copy, pad_mlp

    if str(name_or_path) in pad_mlp.DERIVED:  # the MLP-padded copy (SGLang's CUDA kernels)
        src, multiple = pad_mlp.DERIVED[str(name_or_path)]
        dst = moe_copy.cache_dir() / str(name_or_path)
        return pad_mlp.write_padded_copy(resolve_model(src), dst, multiple).resolve()
    if str(name_or_path) in moe_copy.DERIVED:  # made by eagle3nb from a model found here
        src, experts, top_k, seed = moe_copy.DERIVED[str(name_or_path)]
        dst = moe_copy.cache_dir() / str(name_or_path)
        return moe_copy.write_moe_copy(resolve_model(src), dst, experts, top_k, seed).resolve()
    raise FileNotFoundError(
        f"model={str(name_or_path)!r} not found; looked in: {looked}. Pass an existing folder with "
        f"config.json, or add its parent folder to ${ENV_VAR} (no downloads are made)."
    )


TWIN_PREFIX = "twin:"


def _twin_model(config_file: str) -> Path:
    """The folder of a tiny twin of ``config_file`` (relative paths: the working directory, then
    the repository root), built on first use; its layers: the config's up to 12."""
    from eagle3nb.target.twin import build_twin, twin_layers

    f = Path(config_file).expanduser()
    if not f.is_file():
        f = Path(__file__).resolve().parents[2] / config_file
    if not f.is_file():
        raise FileNotFoundError(
            f"model='{TWIN_PREFIX}{config_file}': no such config file; give a config.json path "
            "(relative to the working directory or the repository root)"
        )
    cfg = json.loads(f.read_text())
    text = text_config(cfg)

    tag = hashlib.sha256(f.read_bytes()).hexdigest()[:12]
    home = Path(os.environ.get("EAGLE3NB_TWINS", "~/.cache/eagle3nb/twins")).expanduser()
    stem = f.name.split(".")[0]
    src = home / "configs" / f"{stem}-{tag}"
    src.mkdir(parents=True, exist_ok=True)
    (src / "config.json").write_text(f.read_text())
    out = home / f"{stem}-{tag}"
    n = twin_layers(int(text["num_hidden_layers"]))
    tok = resolve_model("stories260K-hd32")
    return build_twin(src, out, n, 0, target_arch(cfg), MODEL_TYPE_ALIASES, tok).resolve()


_HASH_MEMO: dict = {}  # (folder, stat signature) -> sha256, for this process


def _model_files(path: Path) -> list[Path]:
    return sorted([path / "config.json", *path.glob("*.safetensors"), *path.glob("*.bin")])


def _stat_signature(files: list[Path]) -> list[list]:
    """Per file: name, size, mtime_ns, ctime_ns. Any write changes ctime (which, unlike mtime,
    cannot be set back by a user), and a replaced file changes it too."""
    out = []
    for f in files:
        st = f.stat()
        out.append([f.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return out


def _sha256_files(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def model_hash(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """sha256 (hex) over the model folder's config.json and weight files, in name order.

    Reading every weight of an 8B-1T target takes minutes, so the result is cached: in memory for
    this process, and in ``cache_dir/model_sha256.json`` (a run folder) for the other notebooks'
    kernels. Both are keyed by the folder and each file's name, size, mtime and ctime, so a
    changed, added, removed or replaced file is hashed again.

    Raises:
        FileNotFoundError: the folder has no config.json.
    """
    path = Path(path).resolve()
    files = _model_files(path)
    sig = _stat_signature(files)
    key = (str(path), json.dumps(sig))
    if key in _HASH_MEMO:
        return _HASH_MEMO[key]
    cache = Path(cache_dir) / "model_sha256.json" if cache_dir is not None else None
    if cache is not None and cache.is_file():
        try:
            rec = json.loads(cache.read_text())
            if rec.get("path") == str(path) and rec.get("files") == sig:
                _HASH_MEMO[key] = rec["sha256"]
                return rec["sha256"]
        except (json.JSONDecodeError, KeyError, AttributeError):
            pass  # unreadable cache: hash again and rewrite it
    digest = _sha256_files(files)
    _HASH_MEMO[key] = digest
    if cache is not None:
        from eagle3nb.manifest import atomic_write_json

        atomic_write_json(cache, {"path": str(path), "files": sig, "sha256": digest})
    return digest


def read_model_config(path: str | os.PathLike) -> dict:
    """The model folder's ``config.json`` as a dict (no weights are read).

    Raises:
        FileNotFoundError: no config.json. ValueError: config.json is not a JSON object.
    """
    f = Path(path) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(
            f"model folder {str(path)!r} has no config.json; point model at a Hugging Face model folder"
        )
    try:
        cfg = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{f} is not valid JSON ({e}); restore the model's original config.json"
        ) from None
    if not isinstance(cfg, dict):
        raise ValueError(
            f"{f} must hold a JSON object, got {type(cfg).__name__}; restore the model's original config.json"
        )
    return cfg


def text_config(cfg: dict) -> dict:
    """The text model's fields of a config.json dict: ``cfg["text_config"]`` for multimodal wrappers
    (Gemma-3, Kimi-K2.5, Llama-4 keep ``num_hidden_layers``, ``vocab_size``, ``hidden_size`` there),
    else ``cfg`` itself; ``architectures`` is the top level's in both cases."""
    tc = cfg.get("text_config")
    if isinstance(tc, dict) and "num_hidden_layers" in tc and "num_hidden_layers" not in cfg:
        return {**tc, "architectures": cfg.get("architectures") or []}
    return cfg


def _transformers_has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(f"transformers.models.{module}") is not None
    except ModuleNotFoundError:
        return False


def target_arch(cfg: dict, model: str = "model") -> str:
    """The architecture class eagle3nb captures for a config.json dict: the first supported entry of
    ``architectures``, as transformers names the class (:data:`ARCH_ALIASES`).

    Raises:
        ValueError: naming ``model``, the architectures, why they are refused and what to do: a
            class refused by name (:data:`REFUSED_ARCHS`), one the installed transformers lacks, or
            one eagle3nb does not know.
    """
    archs = cfg.get("architectures") or []
    for a in archs:
        a = ARCH_ALIASES.get(a, a)
        if a in REFUSED_ARCHS:
            why, fix = REFUSED_ARCHS[a]
            raise ValueError(
                f"model={model!r} has architectures={archs}: {a} is refused: {why}; {fix}"
            )
    known = [ARCH_ALIASES.get(a, a) for a in archs if ARCH_ALIASES.get(a, a) in SUPPORTED_ARCHS]
    if not known:
        raise ValueError(
            f"model={model!r} has architectures={archs}; eagle3nb captures decoder-only models of "
            f"{sorted(SUPPORTED_ARCHS)}; use one of those (a new class: see "
            "docs/development.md#where-to-change-what)"
        )
    if not _transformers_has(ARCH_MODULES[known[0]]):
        import transformers

        raise ValueError(
            f"model={model!r} has architectures={archs}, but the installed transformers "
            f"{transformers.__version__} has no transformers.models.{ARCH_MODULES[known[0]]}; "
            "install a transformers release that defines it (5.24 does)"
        )
    return known[0]


def check_model_folder(path: str | os.PathLike) -> dict:
    """Check, from config.json and file names only, that eagle3nb can use the model folder.

    Returns:
        The parsed config.json.

    Raises:
        ValueError: unsupported or refused architecture (:func:`target_arch`), or no
            tokenizer.json / tokenizer.model in the folder.
    """
    path = Path(path)
    cfg = read_model_config(path)
    target_arch(cfg, str(path))
    if not ((path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()):
        raise ValueError(
            f"model={str(path)!r} has no tokenizer.json or tokenizer.model; copy the tokenizer files into it"
        )
    return cfg


def as_stop_list(eos_token_id: int | list[int] | None) -> list[int]:
    """An eos argument (one id, a list, or None) as a list of stop ids."""
    return [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])


def stop_token_ids(model, tokenizer) -> list[int]:
    """Ids that end a generation: the tokenizer's eos plus the model's ``generation_config``
    eos ids (chat models list their end-of-turn token there, e.g. ChatML's ``<|im_end|>``)."""
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for e in [gen] if isinstance(gen, int) else (gen or []):
        if int(e) not in ids:
            ids.append(int(e))
    return ids


def load_tokenizer(path: str | os.PathLike):
    """Load the target's tokenizer from its folder (local files only)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_target(name_or_path: str | os.PathLike, dtype: str = "float32", device: str = "cpu"):
    """Load a target model and tokenizer for inference (eval mode, grads off).

    Args:
        name_or_path: see :func:`resolve_model`.
        dtype: one of ``float32``, ``bfloat16``, ``float16``.

    Returns:
        ``(model, tokenizer, path)``.

    Raises:
        ValueError: unknown dtype, unsupported architecture, or a folder without tokenizer.
        FileNotFoundError: model not found.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(DTYPES)}")
    path = resolve_model(name_or_path)
    check_model_folder(path)  # before any weight is read
    cfg = read_model_config(path)
    kw = {}
    if cfg.get("model_type") in MODEL_TYPE_ALIASES:  # e.g. Kimi-K2: a DeepSeek-V3 config
        from transformers import AutoConfig

        fields = {k: v for k, v in cfg.items() if k not in ("model_type", "auto_map")}
        kw["config"] = AutoConfig.for_model(MODEL_TYPE_ALIASES[cfg["model_type"]], **fields)
    import transformers

    cls = getattr(transformers, target_arch(cfg, str(name_or_path)))  # the class config.json names
    if str(device).startswith("cpu"):  # MoE experts: torch's CPU grouped_mm refuses strides that
        kw["experts_implementation"] = "eager"  # are not 16-byte multiples (bf16 width 172)
    model = cls.from_pretrained(
        str(path), dtype=DTYPES[dtype], local_files_only=True, attn_implementation="eager", **kw
    ).to(device)
    model.eval().requires_grad_(False)
    return model, load_tokenizer(path), path
