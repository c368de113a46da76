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
]

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_VAR = "EAGLE3NB_MODEL_PATH"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SUPPORTED_ARCHS = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


def model_search_dirs() -> list[Path]:
    """Folders searched for a model given by name, in order."""
    dirs = [Path(p) for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p]
    dirs.append(REPO_ROOT.parent / "shared" / "models")
    return dirs


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """Resolve a model name or path to a local HF folder holding ``config.json``.

    Args:
        name_or_path: an existing folder, or a folder name looked up in :func:`model_search_dirs`.

    Returns:
        Absolute path of the model folder.

    Raises:
        FileNotFoundError: nothing found; the message lists every place looked at and how to add one.
    """
    looked = []
    p = Path(name_or_path).expanduser()
    candidates = [p] if p.is_absolute() or p.exists() else []
    candidates += [d / str(name_or_path) for d in model_search_dirs()]
    for c in candidates:
        looked.append(str(c))
        if (c / "config.json").is_file():
            return c.resolve()
    raise FileNotFoundError(
        f"model={str(name_or_path)!r} not found; looked in: {looked}. Pass an existing folder with "
        f"config.json, or add its parent folder to ${ENV_VAR} (no downloads are made)."
    )


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


def check_model_folder(path: str | os.PathLike) -> dict:
    """Check, from config.json and file names only, that eagle3nb can use the model folder.

    Returns:
        The parsed config.json.

    Raises:
        ValueError: unsupported architecture, or no tokenizer.json / tokenizer.model in the folder.
    """
    path = Path(path)
    cfg = read_model_config(path)
    archs = cfg.get("architectures") or []
    if not set(archs) & SUPPORTED_ARCHS:
        raise ValueError(
            f"model={str(path)!r} has architectures={archs}; eagle3nb captures decoder-only models of "
            f"{sorted(SUPPORTED_ARCHS)}; use one of those"
        )
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
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(DTYPES)}")
    path = resolve_model(name_or_path)
    check_model_folder(path)  # before any weight is read
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=DTYPES[dtype], local_files_only=True, attn_implementation="eager"
    ).to(device)
    model.eval().requires_grad_(False)
    return model, load_tokenizer(path), path
