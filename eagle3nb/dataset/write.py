"""Writing the offline aux hidden-state dataset: safetensors shards plus ``manifest.json``.

The shard format is :mod:`eagle3nb.dataset.layout`'s. Shards are written to a temp file and
renamed; the manifest (provenance, per-shard sha256) is rewritten after every shard, so an
interrupted extraction loses nothing finished and a rerun skips finished shards. A shard is written
(:mod:`eagle3nb.dataset.shard_file`) on a writer thread while the engine captures the next: up to
``layout.WRITER_SHARDS_IN_MEMORY`` shards' worth is in memory at a time.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import torch

from eagle3nb.manifest import (
    ManifestMismatch,
    atomic_write_json,
    publish_permissions,
    read_json,
    sha256_file,
)
from eagle3nb.dataset.read import DATASET_KIND, FORMAT_VERSION
from eagle3nb.dataset.shard_file import all_finite, write_safetensors
from eagle3nb.dataset.layout import (
    AUX_STORAGE,
    METADATA,
    quantization_error,
    quantize_aux,
    shard_layout,
)


# settings that must match for a rerun to resume instead of starting over
_RESUME_KEYS = tuple(
    "target engine convention layer_ids aux_boundaries dtype template shard_size n_input_samples"
    " generation_sha256 aux_storage".split()
)


WORKERS_DIR = "workers"  # progress files of a sharded extraction's workers (removed once merged)


class DiskFullError(OSError):
    """No space left while writing a shard; earlier shards and the manifest are intact."""


def _save_atomic(tensors: dict, path: Path, metadata: dict) -> str:
    """Write the shard to a temp file in the same folder (fsynced), then rename; returns its
    sha256. A reader never sees a half-written shard (a crash leaves only ``*.tmp``, removed by
    the next run)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        sha = write_safetensors(tensors, tmp, metadata)
        publish_permissions(tmp)
        os.replace(tmp, path)
        return sha
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if e.errno == errno.ENOSPC:
            raise DiskFullError(
                errno.ENOSPC,
                f"disk full while writing {path.name}; earlier shards and manifest.json are intact: free space in {path.parent} and rerun to resume",
            ) from e
        raise
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def shard_plan(samples: Sequence, shard_size: int) -> list[tuple[str, Sequence]]:
    """``[(shard file name, its samples)]``: consecutive chunks of ``shard_size`` samples. Names
    depend only on the sample order and ``shard_size``, not on how many workers write them, so a
    rerun with another worker count reuses every finished shard."""
    return [
        (f"shard-{i // shard_size:05d}.safetensors", samples[i : i + shard_size])
        for i in range(0, len(samples), shard_size)
    ]


def _settings_key(man: dict) -> str:
    import hashlib
    import json

    return hashlib.sha256(
        json.dumps({k: man.get(k) for k in _RESUME_KEYS}, sort_keys=True, default=str).encode()
    ).hexdigest()


def _finished(out: Path, man: dict, names: set[str]) -> dict[str, dict]:
    """Shards among ``names`` already written with these settings and intact on disk: listed in
    manifest.json or in a worker's progress file, and matching their recorded sha256."""
    key, cand = _settings_key(man), {}
    mpath = out / "manifest.json"
    if mpath.exists():
        for s in read_json(mpath).get("shards", []):
            cand[s["file"]] = s
    for w in (
        sorted((out / WORKERS_DIR).glob("worker-*.json")) if (out / WORKERS_DIR).is_dir() else []
    ):
        rec = read_json(w)
        if rec.get("settings") == key:
            for s in rec.get("shards", []):
                cand[s["file"]] = s
    return {
        n: s
        for n, s in cand.items()
        if n in names and (out / n).exists() and sha256_file(out / n) == s["sha256"]
    }


def _dataset_manifest(manifest: dict, samples: Sequence, shard_size: int, aux_storage: str) -> dict:
    """``manifest`` plus the dataset's own fields: what a rerun or a worker must find unchanged."""
    return dict(
        manifest,
        kind=DATASET_KIND,
        format_version=FORMAT_VERSION,
        shard_size=shard_size,
        n_input_samples=len(samples),
        aux_storage=aux_storage,
    )


def prepare_dataset(
    out_dir: str | os.PathLike,
    samples: Sequence,
    manifest: dict,
    shard_size: int = 64,
    aux_storage: str = "dtype",
) -> dict:
    """Create ``out_dir`` and its incomplete ``manifest.json`` (settings only), refusing a folder
    holding a dataset made with other settings. Returns the manifest base.

    Raises:
        ManifestMismatch: other settings in ``out_dir`` (delete it or pick another run name).
        ValueError: ``shard_size`` < 1, no samples, or an unknown ``aux_storage``.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size={shard_size}: must be >= 1")
    if not samples:
        raise ValueError("samples is empty: 01_generate produced no sample to extract")
    if aux_storage not in AUX_STORAGE:
        raise ValueError(f"aux_storage={aux_storage!r}: use one of {list(AUX_STORAGE)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    man = _dataset_manifest(manifest, samples, shard_size, aux_storage)
    mpath = out / "manifest.json"
    if mpath.exists():
        old = read_json(mpath)
        diff = [k for k in _RESUME_KEYS if old.get(k) != man.get(k)]
        if diff:
            raise ManifestMismatch(
                f"{out} holds a dataset made with other settings ({', '.join(diff)} differ); delete the folder or use another run_name"
            )
        if old.get("complete"):
            return man
        shards = old.get("shards", [])
    else:
        shards = []
    atomic_write_json(mpath, dict(man, shards=shards, complete=False))
    return man


def write_dataset(
    out_dir: str | os.PathLike,
    samples: Sequence[tuple[int, list[int], list[int]]],
    capture: Callable,
    manifest: dict,
    shard_size: int = 64,
    dtype: torch.dtype = torch.float32,
    progress=None,
    aux_storage: str = "dtype",
    worker: tuple[int, int] | None = None,
) -> dict:
    """Capture and store aux states for ``samples``, resuming a compatible partial run.

    Args:
        samples: ``(sample_id, input_ids, loss_mask)`` triples.
        capture: ``list[list[int]] -> list[Captured]`` (an engine's bound ``capture`` method).
        manifest: provenance fields (target, engine, convention, layer_ids, aux_boundaries, dtype,
            template, seed, ...), stored in ``manifest.json``.
        shard_size: samples per shard.
        dtype: storage dtype of boundary N (and of the aux states unless int8).
        aux_storage: ``"dtype"``, or ``"int8"`` (per token and aux slot scales, see
            :mod:`eagle3nb.dataset.layout`; the relative error vs the unquantised states is recorded).
        worker: ``(w, W)``: write only the shards ``i % W == w`` and record them in
            ``workers/worker-w.json`` (see :mod:`eagle3nb.steps.extract.sharded`); :func:`merge_workers` then
            writes the complete manifest. ``None``: one process, manifest after every shard.

    Returns:
        The final manifest (``complete: True``); in worker mode this worker's progress record.

    Raises:
        ManifestMismatch: ``out_dir`` holds a dataset made with other settings (delete it or pick
            another run name). ValueError: ``shard_size`` < 1 or no samples. DiskFullError: no
            space left (finished shards stay valid; rerun resumes). RuntimeError: the engine
            returned a row count different from the sample's token count.
    """
    out = Path(out_dir)
    if worker is None:
        man = prepare_dataset(out, samples, manifest, shard_size, aux_storage)
    else:  # the launcher ran prepare_dataset; a worker only checks it writes into the same dataset
        man = _dataset_manifest(manifest, samples, shard_size, aux_storage)
        old = read_json(
            out / "manifest.json", "dataset manifest (written by the extraction launcher)"
        )
        diff = [k for k in _RESUME_KEYS if old.get(k) != man.get(k)]
        if diff:
            raise ManifestMismatch(
                f"worker {worker}: {out} holds a dataset made with other settings ({', '.join(diff)} differ)"
            )
    mpath = out / "manifest.json"
    plan = shard_plan(samples, shard_size)
    mine = [(n, c) for i, (n, c) in enumerate(plan) if worker is None or i % worker[1] == worker[0]]
    done = _finished(out, man, {n for n, _ in mine})
    if worker is None:
        for stale in out.glob("*.tmp"):  # left by a killed run; never listed in the manifest
            stale.unlink()
    wpath = out / WORKERS_DIR / f"worker-{worker[0]:05d}.json" if worker else None
    shards: list[dict] = []

    def record(entry: dict) -> None:  # in plan order, once the shard's file is in place
        shards.append(entry)
        if worker is None:
            atomic_write_json(mpath, dict(man, shards=shards, complete=False))
        else:
            atomic_write_json(wpath, _progress(worker, man, shards))

    # One shard is written (serialised, fsynced, hashed) on a writer thread while the engine
    # captures the next: on an H200 the capture alone ran 3.3x faster than capture + write in turn.
    pending: list = []  # [(future of the sha256, entry)]: the shard being written

    def settle() -> None:
        if pending:
            fut, entry = pending.pop()
            entry["sha256"] = fut.result()  # re-raises the writer's error (DiskFullError)
            record(entry)

    it = progress(mine) if progress else mine
    with ThreadPoolExecutor(1, thread_name_prefix="eagle3nb-shard-writer") as pool:
        try:
            for name, chunk in it:
                if name in done:
                    settle()
                    shards.append(done[name])
                    continue
                t, entry = _build_shard(name, chunk, capture, man, dtype, aux_storage)
                settle()
                pending.append((pool.submit(_save_atomic, t, out / name, METADATA), entry))
            settle()
        except BaseException:
            if pending:  # keep the shard already on its way to disk; the first error wins
                try:
                    settle()
                except Exception:
                    pass
            raise
    if worker is not None:
        rec = _progress(worker, man, shards)
        atomic_write_json(wpath, rec)
        return rec
    return _complete(out, man, shards)


def _build_shard(
    name: str, chunk: Sequence, capture: Callable, man: dict, dtype, aux_storage: str
) -> tuple[dict, dict]:
    """Capture ``chunk``'s samples and lay them out as shard ``name``: ``(tensors, entry)``, the
    tensors in :func:`eagle3nb.dataset.layout.shard_layout`'s layout and the shard's manifest
    entry (its ``sha256`` filled in once written). Samples with an empty loss mask are not
    captured, samples with non-finite states not stored; both are listed in ``skipped``."""
    n_aux = len(man["aux_boundaries"])
    keep = [s for s in chunk if any(s[2])]
    skipped = {"nonfinite": [], "empty_loss_mask": [int(s[0]) for s in chunk if not any(s[2])]}
    caps = capture([s[1] for s in keep]) if keep else []
    if len(caps) != len(keep):
        raise RuntimeError(f"engine returned {len(caps)} captures for {len(keep)} samples")
    rows = []
    for s, c in zip(keep, caps):
        if len(s[1]) != c.aux.shape[0]:
            raise RuntimeError(
                f"engine returned {c.aux.shape[0]} rows for sample {s[0]} of {len(s[1])} tokens"
            )
        if c.aux.shape[1] != n_aux * c.final.shape[1]:
            raise RuntimeError(
                f"engine returned aux states {c.aux.shape[1]} wide for {n_aux} aux boundaries x H={c.final.shape[1]}"
            )
        if not (all_finite(c.aux) and all_finite(c.final)):
            skipped["nonfinite"].append(int(s[0]))
            continue
        rows.append((s, c))
    lens = [len(s[1]) for s, _ in rows]
    H = rows[0][1].final.shape[1] if rows else int(man.get("target", {}).get("hidden_size") or 0)
    layout = shard_layout(lens, n_aux, H, dtype, aux_storage)
    aux = torch.cat([c.aux for _, c in rows]) if rows else torch.zeros(layout["aux"][1])
    t = {
        "input_ids": torch.tensor([x for s, _ in rows for x in s[1]], dtype=torch.long),
        "loss_mask": torch.tensor([x for s, _ in rows for x in s[2]], dtype=torch.uint8),
        "aux": aux.to(dtype),
        "final": torch.cat([c.final for _, c in rows]).to(dtype)
        if rows
        else torch.zeros(layout["final"][1], dtype=dtype),
        "offsets": torch.tensor(
            [0] + list(torch.tensor(lens).cumsum(0).tolist() if lens else []), dtype=torch.long
        ),
        "sample_ids": torch.tensor([int(s[0]) for s, _ in rows], dtype=torch.long),
    }
    entry: dict = {"file": name}
    if aux_storage == "int8":
        ref = t["aux"].float()  # the unquantised states as they would be stored
        t["aux"], t["aux_scale"] = quantize_aux(ref, n_aux)
        entry["aux_sq_error"], entry["aux_sq_norm"] = quantization_error(
            ref, t["aux"], t["aux_scale"]
        )
    got = {k: (v.dtype, tuple(v.shape)) for k, v in t.items()}
    if got != layout:  # the disk estimate counts exactly this layout
        raise RuntimeError(f"shard {name}: tensors {got} differ from the planned layout {layout}")
    entry.update(n_samples=len(rows), n_tokens=int(sum(lens)), sha256=None, skipped=skipped)
    return {k: v.contiguous() for k, v in t.items()}, entry


def _progress(worker: tuple[int, int], man: dict, shards: list[dict]) -> dict:
    """A sharded extraction worker's progress record (``workers/worker-w.json``)."""
    return {
        "worker": worker[0],
        "workers": worker[1],
        "settings": _settings_key(man),
        "shards": shards,
    }


def _complete(out: Path, man: dict, shards: list[dict]) -> dict:
    skipped = {
        k: sorted(x for s in shards for x in s.get("skipped", {}).get(k, []))
        for k in ("nonfinite", "empty_loss_mask")
    }
    man = dict(man, shards=shards, skipped=skipped, complete=True)
    man["n_samples"] = sum(s["n_samples"] for s in shards)
    man["n_tokens"] = sum(s["n_tokens"] for s in shards)
    if man.get("aux_storage") == "int8":
        e2 = [sum(s["aux_sq_error"][i] for s in shards) for i in range(len(man["aux_boundaries"]))]
        r2 = [sum(s["aux_sq_norm"][i] for s in shards) for i in range(len(man["aux_boundaries"]))]
        man["aux_quantization"] = {
            "storage": "int8, symmetric, one float32 scale per token and aux slot (absmax / 127)",
            "relative_error": (sum(e2) / sum(r2)) ** 0.5 if sum(r2) > 0 else 0.0,
            "relative_error_per_boundary": {
                str(b): ((e / r) ** 0.5 if r > 0 else 0.0)
                for b, e, r in zip(man["aux_boundaries"], e2, r2)
            },
            "relative_error_is": "||aux - dequantized|| / ||aux|| (Frobenius, over all stored tokens)",
        }
    atomic_write_json(out / "manifest.json", man)
    if (out / WORKERS_DIR).is_dir():  # merged into the manifest above
        shutil.rmtree(out / WORKERS_DIR)
    return man


def merge_workers(
    out_dir: str | os.PathLike,
    samples: Sequence,
    manifest: dict,
    shard_size: int = 64,
    aux_storage: str = "dtype",
    workers: int = 1,
) -> dict:
    """After the workers of a sharded extraction ended: check every planned shard is written and
    intact, write the complete ``manifest.json`` (shards in sample order) and remove the workers'
    progress files.

    Raises:
        RuntimeError: shards missing (a worker was lost); the message names them and their worker,
            and ``manifest.json`` lists those present, so a rerun redoes only the missing ones.
    """
    out = Path(out_dir)
    man = _dataset_manifest(manifest, samples, shard_size, aux_storage)
    plan = shard_plan(samples, shard_size)
    done = _finished(out, man, {n for n, _ in plan})
    missing = [(i, n) for i, (n, _) in enumerate(plan) if n not in done]
    if missing:
        atomic_write_json(
            out / "manifest.json",
            dict(man, shards=[done[n] for n, _ in plan if n in done], complete=False),
        )
        lost = sorted({i % workers for i, _ in missing})
        raise RuntimeError(
            f"{len(missing)} of {len(plan)} shards missing ({', '.join(n for _, n in missing[:5])}{' ...' if len(missing) > 5 else ''}) from worker(s) {lost} of {workers}: a worker was lost; rerun the extraction with the same params to redo only those"
        )
    m = _complete(out, man, [done[n] for n, _ in plan])
    for stale in out.glob("*.tmp"):  # left by a lost worker; never listed
        stale.unlink()
    return m
