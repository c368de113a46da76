"""A disk cache of the twin proof's engine measurement (:mod:`eagle3nb.engines.twin_check`).

The measurement (which twin boundary each captured slot equals, with the error matrix) is a
deterministic function of the engine (name, version, torch version, the twin's engine options),
the twin (its config.json and the sha256 of its weights, which the seed fixes), the probe
samples, the requested ids, the dtype and the tolerance, plus the transformers version of the HF
reference. :func:`key_fields` collects exactly these; a file ``<sha256 of the key>.json`` under
:func:`cache_dir` holds one measurement with the key it was made under, when (UTC) and at which
eagle3nb git commit. A proof with the same key reads it instead of starting the engine on the twin;
any other key (another version, class config, seed, ids, dtype) measures afresh. The verdict
against engine_rules is not cached: it is recomputed from the measurement on every run.

Location: ``$EAGLE3NB_TWIN_PROOFS`` when set (``off``, ``0`` or an empty value: no cache, every run
measures), else ``$EAGLE3NB_CACHE/twin_proofs`` (default ``~/.cache/eagle3nb/twin_proofs``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

__all__ = ["CACHE_FORMAT", "cache_dir", "key_fields", "key_digest", "load", "store"]

# bump when the cached measurement's meaning changes (name_slots, alignment, probe samples)
CACHE_FORMAT = 1
_OFF = ("", "0", "off", "false", "no")


def cache_dir() -> Path | None:
    """The folder of cached twin proofs, or None when ``$EAGLE3NB_TWIN_PROOFS`` turns the cache
    off (see the module docstring)."""
    env = os.environ.get("EAGLE3NB_TWIN_PROOFS")
    if env is not None:
        return None if env.strip().lower() in _OFF else Path(env).expanduser()
    return Path(os.environ.get("EAGLE3NB_CACHE", "~/.cache/eagle3nb")).expanduser() / "twin_proofs"


def _weights_sha256(twin_dir: Path) -> dict:
    from eagle3nb.manifest import sha256_file

    files = sorted(twin_dir.glob("*.safetensors")) or sorted(twin_dir.glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"twin folder {twin_dir} has no weights (*.safetensors, *.bin)")
    return {f.name: sha256_file(f) for f in files}


# eagle3nb's own code on the measurement's path (engine worker and backends, HF reference capture,
# twin builder): a change to any of them measures afresh instead of trusting an older proof
_CODE = (
    "engines/worker.py",
    "engines/adapter.py",
    "engines/sglang_backend.py",
    "engines/sglang_transport.py",  # how the states leave SGLang's scheduler
    "engines/vllm_backend.py",
    "engines/vllm_connector.py",
    "engines/twin_check.py",
    "target/capture.py",
    "target/twin.py",
)


def _code_sha256() -> str:
    import hashlib

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for rel in _CODE:
        f = root / rel
        h.update(rel.encode() + b"\0" + (f.read_bytes() if f.exists() else b"") + b"\0")
    return h.hexdigest()


def key_fields(
    engine: str,
    version: str,
    arch: str,
    twin_dir: str | os.PathLike,
    twin_ids: Sequence[int],
    engine_ids: Sequence[int],
    samples: Sequence[Sequence[int]],
    dtype: str,
    tolerance: float,
    seed: int,
    extra: dict | None = None,
) -> dict:
    """What the twin measurement depends on, as a JSON-able dict (the cache key), including the
    sha256 of eagle3nb's capture-path sources (``_CODE``), so a code change re-measures.

    Args:
        twin_dir: the built twin folder; its config.json (parsed) and weight files' sha256 enter
            the key.
        twin_ids, engine_ids: ids captured on the twin and the run's ids they come from.
        samples: the probe token ids.
        tolerance: relative error under which a slot is named (float).
        extra: the engine's own further facts (e.g. ``torch_version``, twin engine options).

    Raises:
        FileNotFoundError: the twin folder has no config.json or no weights.
    """
    import transformers

    tdir = Path(twin_dir)
    return {
        "format": CACHE_FORMAT,
        "engine": engine,
        "version": version,
        "arch": arch,
        "twin_config": json.loads((tdir / "config.json").read_text()),
        "twin_weights_sha256": _weights_sha256(tdir),
        "seed": int(seed),
        "twin_ids": [int(i) for i in twin_ids],
        "ids": [int(i) for i in engine_ids],
        "samples": [[int(t) for t in s] for s in samples],
        "dtype": dtype,
        "tolerance": float(tolerance),
        "transformers_version": transformers.__version__,
        "eagle3nb_capture_code_sha256": _code_sha256(),
        "extra": extra or {},
    }


def key_digest(fields: dict) -> str:
    """sha256 hex digest of ``fields`` as canonical JSON (sorted keys)."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def load(folder: str | os.PathLike, fields: dict) -> dict | None:
    """The cached entry for ``fields`` (``{"key", "sha256", "measured_at", "eagle3nb_commit",
    "eagle3nb_version", "measurement", "path"}``), or None when there is none, it cannot be read,
    or its stored key differs from ``fields`` (a miss, never an error)."""
    digest = key_digest(fields)
    path = Path(folder) / f"{digest}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != json.loads(json.dumps(fields)):
        return None
    if not isinstance(entry.get("measurement"), dict):
        return None
    return dict(entry, path=str(path))


def store(folder: str | os.PathLike, fields: dict, measurement: dict) -> dict:
    """Write ``measurement`` under ``fields``' digest (temp file then rename) with the time (UTC,
    ISO 8601) and the eagle3nb git commit; returns the entry as :func:`load` would.

    Raises:
        OSError: the folder cannot be written.
    """
    from eagle3nb import __version__
    from eagle3nb.manifest import atomic_write_json, git_commit

    digest = key_digest(fields)
    path = Path(folder) / f"{digest}.json"
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    entry = {
        "key": fields,
        "sha256": digest,
        "measured_at": now,
        "eagle3nb_commit": git_commit(),
        "eagle3nb_version": __version__,
        "measurement": measurement,
    }
    atomic_write_json(path, entry)
    return dict(entry, path=str(path))
