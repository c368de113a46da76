"""A finished step's result, recorded in the run folder, read back when the step runs again on the
same inputs (``reuse_results``), instead of starting its engines again.

Why: resume already skips a step's long writes (shards, checkpoints), but a notebook re-run
(a kernel restart in JupyterLab, nbval after a run) still started SGLang or vLLM to re-measure the
probes, speeds and drift its figures show: 20-30 s per notebook on the smoke run, more on a real
target. The result is read back only when nothing it depends on changed:

- the run parameters (every field but ``interactive``, which only picks widgets or HTML, and
  ``reuse_results`` itself), and the
  source of the eagle3nb package that produced it (:func:`source_hash`; a git commit would miss
  uncommitted edits), the target's weights (:func:`eagle3nb.target.models.model_hash`), its
  tokenizer files and the ``chat_template`` file, if one;
- the step's input folders in the run folder (``inputs``): every file's relative path and
  content hash (files up to 4 MiB, i.e. manifests, generated text) or size and modification time
  (shards, weights), taken after the step wrote its own outputs.

A changed input, parameter, package source or target runs the step again and records the new
result; so does ``reuse_results: False``. Not covered: an engine upgraded in place in its venv
(same ``sglang_python`` / ``vllm_python`` path): set ``reuse_results: False`` after one. The record is
``<run>/recorded/<step>.pt``, written with :func:`torch.save` (temp file, then rename) and read with
``torch.load(weights_only=True)``: plain dicts, lists, numbers, strings and tensors only, so a run
folder from elsewhere cannot run code through it. A result that holds anything else is not recorded.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import torch

SMALL_FILE_BYTES = 4 << 20  # hashed by content; larger files by size and mtime
FORMAT = 1


def fingerprint(root: Path, inputs: tuple[str, ...]) -> str:
    """sha256 over the files under ``root/<input>`` for each input (folders or files; glob
    patterns allowed, e.g. ``dataset*``): relative path, then content hash (files up to
    ``SMALL_FILE_BYTES``) or size and mtime in ns. Missing inputs count as absent."""
    h = hashlib.sha256()
    paths = set()
    for pattern in inputs:
        for top in root.glob(pattern):
            paths.update([top] if top.is_file() else (f for f in top.rglob("*") if f.is_file()))
    for f in sorted(paths):
        st = f.stat()
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        if st.st_size <= SMALL_FILE_BYTES:
            h.update(hashlib.sha256(f.read_bytes()).digest())
        else:
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 of every ``.py`` file of the installed ``eagle3nb`` package (path and content): an
    edited step, committed or not, never reads back a result its old code recorded."""
    import eagle3nb

    pkg = Path(eagle3nb.__file__).parent
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(f.relative_to(pkg).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _params_key(p, root: Path) -> str:
    from eagle3nb.target import models

    from eagle3nb.repo_paths import resolve_path

    d = p.model_dump(mode="json", exclude={"interactive", "reuse_results"})
    d["outputs_dir"] = str(resolve_path(p.outputs_dir))  # "outputs" = /repo/outputs
    path = models.resolve_model(p.model)
    target = models.model_hash(path, root)  # weights and config.json; cached in the run folder
    tokenizer = fingerprint(path, ("*.json", "*.jinja"))  # tokenizer files, its chat template
    template = resolve_path(p.chat_template) if p.chat_template else None
    template = fingerprint(template.parent, (template.name,)) if template else None
    d["_eagle3nb"] = [source_hash(), target, tokenizer, template, FORMAT]
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def run_or_read(
    p,
    root: Path,
    step: str,
    inputs: tuple[str, ...],
    run: Callable[[], dict],
    live: dict[str, Callable[[dict], object]] | None = None,
) -> dict:
    """The step's result: read from ``root/recorded/<step>.pt`` when ``p.reuse_results`` is on and
    the parameters and ``inputs`` fingerprint equal the recorded ones; else ``run()``, then
    recorded (when its result is plain data, see the module docstring).

    Args:
        p: the run's :class:`~eagle3nb.params.RunParams`.
        root: the run folder.
        step: the notebook's name (``"02b_extract_sglang"``), the record's file name.
        inputs: the run-folder paths (glob patterns) whose files the result depends on.
        run: the step itself; called with no arguments.
        live: result entries left out of the record and rebuilt on read-back by their callable,
            given the read-back result: objects that are not data (a tokenizer), and files the
            step writes that a later step may remove (04's model card, which 03's re-export drops).

    Returns:
        The result dict; a read-back one carries ``"recorded": {"read_back": True, ...}``.
    """
    path = root / "recorded" / f"{step}.pt"
    key = _params_key(p, root)
    if getattr(p, "reuse_results", False) and path.is_file():
        try:
            rec = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # an older or damaged record: measure again
            rec = None
        if rec and rec.get("params") == key and rec.get("inputs") == fingerprint(root, inputs):
            out = rec["result"]
            out.update({k: make(out) for k, make in (live or {}).items()})
            out["recorded"] = {"read_back": True, "file": str(path)}
            return out
    out = run()
    kept = {k: v for k, v in out.items() if k not in (live or {})}
    rec = {"params": key, "inputs": fingerprint(root, inputs), "result": kept}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        torch.save(rec, tmp)
        torch.load(tmp, map_location="cpu", weights_only=True)  # plain data only, or no record
        os.replace(tmp, path)
    except Exception:
        Path(tmp).unlink(missing_ok=True)
    return out
