"""Manifests: what produced an artefact, so a later step can refuse a mismatch.

Every artefact folder (dataset, checkpoint, exported drafter) carries a ``manifest.json`` with the
target (name, path, sha256), engine and version, layer-id convention, ids, boundaries, dtype,
template mode and hash with the chat-template kwargs it rendered with, seeds, eagle3nb version and git commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable

from eagle3nb import __version__
from eagle3nb.repo_paths import REPO_ROOT

__all__ = [
    "publish_permissions",
    "sha256_file",
    "git_commit",
    "atomic_write_json",
    "read_json",
    "provenance",
    "check_compatible",
    "ManifestMismatch",
    "rendered_kwargs",
    "template_kwargs_of",
    "with_template_kwargs",
    "template_fields",
]


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_commit() -> str:
    """The repository's HEAD commit (with ``-dirty`` when the tree has changes), or ``unknown``."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def publish_permissions(path: str | os.PathLike, directory: bool = False) -> None:
    """Give a temp file/folder (created 0600/0700 by tempfile) the permissions a normal write
    would have under the current umask, so a server running as another user can read it."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON to a temp file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        publish_permissions(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path: str | os.PathLike, what: str = "file") -> dict:
    """Read a JSON file; FileNotFoundError names the file and what it should be."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} is missing; run the step that writes it first")
    return json.loads(path.read_text(encoding="utf-8"))


def provenance(seed: int | None = None, **extra) -> dict:
    """Common manifest fields: eagle3nb version, git commit, seed, plus ``extra``."""
    out = {"eagle3nb_version": __version__, "git_commit": git_commit()}
    if seed is not None:
        out["seed"] = int(seed)
    out.update(extra)
    return out


class ManifestMismatch(ValueError):
    """An artefact was produced under different settings than the step using it expects."""


def check_compatible(
    have: dict, want: dict, keys: Iterable[str], what: str, override_param: str
) -> None:
    """Refuse when ``have[k] != want[k]`` for any of ``keys`` (dotted keys reach into dicts).

    Raises:
        ManifestMismatch: listing every differing key with both values and the parameter that
            overrides the check.
    """

    def get(d, k):
        for part in k.split("."):
            d = d.get(part) if isinstance(d, dict) else None
        return d

    diffs = [
        f"{k}: artefact has {get(have, k)!r}, expected {get(want, k)!r}"
        for k in keys
        if get(have, k) != get(want, k)
    ]
    if diffs:
        raise ManifestMismatch(
            f"{what} does not match this run: "
            + "; ".join(diffs)
            + f". Fix the inputs, or set {override_param}=True to continue anyway."
        )


def rendered_kwargs(mode: str | None, kwargs: dict | None) -> dict:
    """The chat-template kwargs (``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``)
    that reach a template in ``mode``: a copy of ``kwargs`` in chat mode, {} in completion mode
    (no template renders there, so a difference in them changes no token)."""
    return dict(kwargs or {}) if mode == "chat" else {}


def template_kwargs_of(man: dict) -> dict:
    """The chat-template kwargs an artefact's ids were rendered with (``man["template_kwargs"]``,
    recorded next to ``man["template"]``), as :func:`rendered_kwargs` counts them; {} where a
    manifest written before they were recorded (issue 32) lacks them: 01 passed none then."""
    return rendered_kwargs((man.get("template") or {}).get("mode"), man.get("template_kwargs"))


def with_template_kwargs(man: dict) -> dict:
    """A copy of ``man`` whose ``template_kwargs`` is :func:`template_kwargs_of` (for
    :func:`check_compatible` against a run's :func:`rendered_kwargs`)."""
    return dict(man, template_kwargs=template_kwargs_of(man))


def template_fields(man: dict) -> dict:
    """``{"template", "template_kwargs"}`` of an input's manifest, to record in the manifest of an
    artefact made from it (so they describe its data); kwargs {} where an older manifest lacks them.

    Raises:
        KeyError: ``man`` has no ``template`` block.
    """
    return {"template": man["template"], "template_kwargs": dict(man.get("template_kwargs") or {})}
