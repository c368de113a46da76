"""Build an offline bundle: download the wheels (cached), install them into a staging folder, prune
what the host does not use, and write ``tar | xz`` split into parts, ``manifest.json`` and
``install.sh``.

Nothing here runs on the host: the host only runs ``install.sh`` (``cat``, ``sha256sum``,
``xz -dc | tar -x``) and ``python -m eagle3nb.offline check``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Optional

from eagle3nb.manifest import sha256_file
from eagle3nb.offline.installer import render_install_sh
from eagle3nb.offline.sets import (
    EAGLE3NB_HEADLESS,
    PRUNE_RULES,
    WHEEL_SETS,
    beside_names,
    check_python,
    normalize,
    pick_engine,
)

__all__ = [
    "CACHE",
    "PART_BYTES",
    "platform_tags",
    "wanted_wheels",
    "cached_wheel",
    "download",
    "wheel_torch_pin",
    "prune",
    "pack",
    "write_manifest",
    "build",
]

CACHE = Path(os.environ.get("EAGLE3NB_OFFLINE_CACHE", Path.home() / ".cache/eagle3nb/offline"))
PART_BYTES = 45_000_000  # the device tool carries < 64 MiB a call, with the ~4 MB repository
MAX_PARTS = 4
Log = Callable[[str], None]


def platform_tags(glibc_minor: int = 39) -> list[str]:
    """pip ``--platform`` tags a manylinux x86_64 host with glibc 2.``glibc_minor`` accepts."""
    return [f"manylinux_2_{i}_x86_64" for i in range(glibc_minor, 16, -1)] + [
        "manylinux2014_x86_64",
        "manylinux1_x86_64",
        "any",
    ]


def _pip_target_args(python: str) -> list[str]:
    plat = [a for t in platform_tags() for a in ("--platform", t)]
    abi = "cp" + python.replace(".", "")
    return ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"] + [
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
        *plat,
    ]


def wanted_wheels(
    engine_req: str,
    extras: Iterable[str],
    have: frozenset[str],
    headless: bool = True,
    ahead: Iterable[str] = (),
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """``[(name, version, role)]`` to download (engine first, each name once) and the names skipped
    because the host has them (``have``: the image's, and those of a set installed beside). Names
    in ``ahead`` are kept even so (versions that must shadow the host's). ``role``: ``engine``,
    ``engine-extra`` or ``eagle3nb``."""
    ahead = {normalize(a) for a in ahead}
    out, skipped, seen = [], [], set()
    groups = [("engine", [engine_req]), ("engine-extra", list(extras))]
    groups += [("eagle3nb", list(EAGLE3NB_HEADLESS))] if headless else []
    for role, reqs in groups:
        for req in reqs:
            name, _, ver = req.partition("==")
            key = normalize(name)
            if key in seen:
                continue
            seen.add(key)
            if key in have and role != "engine" and key not in ahead:
                skipped.append(key)
            else:
                out.append((key, ver, role))
    return out, sorted(skipped)


def _wheel_key(filename: str) -> tuple[str, str]:
    name, ver = filename.split("-")[:2]
    return normalize(name), ver


def cached_wheel(wheels: Path, name: str, version: str) -> Optional[Path]:
    """The wheel of ``name==version`` in the cache folder, or None."""
    for p in sorted(wheels.glob("*.whl")):
        if _wheel_key(p.name) == (normalize(name), version):
            return p
    return None


def download(wanted: list[tuple[str, str, str]], python: str, wheels: Path, log: Log) -> list[Path]:
    """Each wanted wheel from the cache, else ``pip download --no-deps --only-binary=:all:`` for the
    host's Python and platform into the cache.

    Raises:
        RuntimeError: pip failed (its last lines quoted) or left no matching wheel.
    """
    wheels.mkdir(parents=True, exist_ok=True)
    out = []
    for name, ver, _ in wanted:
        hit = cached_wheel(wheels, name, ver)
        if hit is None:
            log(f"downloading {name}=={ver}")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels)]
            r = subprocess.run(cmd + _pip_target_args(python) + [f"{name}=={ver}"], text=True,
                               capture_output=True)  # fmt: skip
            hit = cached_wheel(wheels, name, ver)
            if r.returncode or hit is None:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                raise RuntimeError(f"pip download {name}=={ver} failed: {' | '.join(tail)}")
        out.append(hit)
    return out


def wheel_torch_pin(wheel: Path) -> tuple[Optional[str], Optional[str]]:
    """``(torch pin, Requires-Python)`` from a wheel's ``*.dist-info/METADATA``."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    pin = re.search(r"^Requires-Dist: torch==([\w.]+)\s*$", text, re.M)
    rp = re.search(r"^Requires-Python: (.+)$", text, re.M)
    return (pin.group(1) if pin else None), (rp.group(1).strip() if rp else None)


sha256 = sha256_file  # a wheel's hash in the manifest: the project's one file hash


def _size(p: Path) -> int:
    if p.is_file() or p.is_symlink():
        return p.lstat().st_size
    return sum(f.lstat().st_size for f in p.rglob("*") if f.is_file())


def prune(site: Path, python: str, dense_only: bool = False) -> list[dict]:
    """Delete from the staging ``site`` folder what :data:`PRUNE_RULES` names for this host.

    Returns:
        ``[{"path", "bytes", "why"}]`` per removed file or folder (paths relative to ``site``).
    """
    keep_tag = "cpython-" + python.replace(".", "")
    removed = []
    for pattern, why, when in PRUNE_RULES:
        if when == "dense_only" and not dense_only:
            continue
        for p in sorted(site.glob(pattern)):
            rel = p.relative_to(site).as_posix()
            if when == "other_pythons" and keep_tag in p.name:
                continue
            removed.append({"path": rel, "bytes": _size(p), "why": why})
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return removed


def pack(
    root: Path,
    member: str,
    out_dir: Path,
    stem: str,
    preset: str,
    log: Log,
    part_bytes: int = PART_BYTES,
) -> list[dict]:
    """``tar`` of ``root/member`` (sorted, owner 0, mtime 0) through ``xz``, split into parts of at
    most ``part_bytes`` (:data:`PART_BYTES`) named ``{stem}.tar.xz.partNN``.

    Returns:
        ``[{"name", "bytes", "sha256"}]`` per part, in order.

    Raises:
        RuntimeError: tar or xz failed, or more than :data:`MAX_PARTS` parts (use a higher preset).
    """
    tar = ["tar", "-C", str(root), "--sort=name", "--owner=0", "--group=0", "--numeric-owner"]
    tar += ["--mtime=@0", "-cf", "-", member]
    xz = ["nice", "-n", "10", "xz", "-T2", f"-{preset}", "-c"]
    for old in out_dir.glob(f"{stem}.tar.xz.part*"):
        old.unlink()
    t = subprocess.Popen(tar, stdout=subprocess.PIPE)
    x = subprocess.Popen(xz, stdin=t.stdout, stdout=subprocess.PIPE)
    t.stdout.close()
    parts, n, f, h = [], 0, None, None
    while chunk := x.stdout.read(1 << 20):  # b"" only at the end of xz's output
        while chunk:
            if f is None or n == part_bytes:
                if f:
                    f.close()
                    parts[-1].update(bytes=n, sha256=h.hexdigest())
                name = f"{stem}.tar.xz.part{len(parts) + 1:02d}"
                parts.append({"name": name})
                f, n, h = open(out_dir / name, "wb"), 0, hashlib.sha256()
            take = chunk[: part_bytes - n]
            f.write(take)
            h.update(take)
            n += len(take)
            chunk = chunk[len(take) :]
    if f:
        f.close()
        parts[-1].update(bytes=n, sha256=h.hexdigest())
    if t.wait() or x.wait():
        raise RuntimeError(f"tar ({t.returncode}) or xz ({x.returncode}) failed packing {member}")
    log(f"packed {member}: {len(parts)} parts, {sum(p['bytes'] for p in parts)} bytes")
    if len(parts) > MAX_PARTS:
        raise RuntimeError(
            f"--preset {preset}: {len(parts)} parts of {part_bytes} bytes, more than {MAX_PARTS}; "
            "use a stronger preset (9e) or --dense-only"
        )
    return parts


def write_manifest(out_dir: Path, manifest: dict) -> Path:
    """``manifest.json`` beside the parts and ``install.sh`` rendered from it."""
    path = out_dir / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    sh = out_dir / "install.sh"
    sh.write_text(render_install_sh(manifest))
    sh.chmod(0o755)
    return path


def build(
    python: str,
    torch: str,
    out: Optional[Path] = None,
    have: frozenset[str] = frozenset(),
    have_source: str = "",
    dense_only: bool = False,
    preset: str = "9e",
    engine: str = "vllm",
    log: Log = print,
) -> Path:
    """The whole build (see the module docstring); returns the bundle folder.

    Raises:
        ValueError: a torch no engine pins, a Python the wheel set lacks, a preset xz does not
            take, all before any download; or a downloaded engine wheel whose torch pin or
            Requires-Python disagrees with the table.
    """
    pin, ws = pick_engine(torch, engine)
    py = check_python(python, ws)
    if not re.fullmatch(r"[0-9]e?", preset):
        raise ValueError(f"--preset {preset}: xz presets are 0-9, optionally with e (e.g. 9e)")
    stem = f"{ws.engine}-{ws.version}-py{py}-torch{torch.split('+')[0]}"
    stem += "-dense" if dense_only else ""
    out = Path(out or Path.cwd() / ".offline") / stem
    out.mkdir(parents=True, exist_ok=True)
    beside = None
    if ws.beside:  # e.g. SGLang beside vLLM's site: its wheels (and eagle3nb's) are not repeated
        b = WHEEL_SETS[ws.beside]
        beside = {"engine": b.engine, "version": b.version,
                  "stem": f"{b.engine}-{b.version}-py{py}-torch{torch.split('+')[0]}"}  # fmt: skip
    wanted, skipped = wanted_wheels(f"{ws.engine}=={ws.version}", ws.extras,
                                    have | beside_names(ws), ws.beside is None, ws.ahead)  # fmt: skip
    files = download(wanted, py, CACHE / "wheels", log)
    got_pin, req_py = wheel_torch_pin(files[0])
    if got_pin != pin.torch:
        raise ValueError(
            f"{files[0].name} pins torch {got_pin}, the table says {pin.torch} ({pin.source}); "
            "correct ENGINE_PINS in eagle3nb/offline/sets.py"
        )
    stage = CACHE / "stage" / stem
    shutil.rmtree(stage, ignore_errors=True)
    site = stage / "site-packages"
    log(f"installing {len(files)} wheels into {site}")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--target", str(site)] + _pip_target_args(py) + [str(f) for f in files]
    subprocess.run(cmd, check=True)
    staged = _size(site)
    pruned = prune(site, py, dense_only)
    t0 = time.time()
    parts = pack(stage, "site-packages", out, stem, preset, log)
    wheel_rows = [
        {"name": n, "version": v, "role": r, "file": f.name, "bytes": f.stat().st_size,
         "sha256": sha256(f)}
        for (n, v, r), f in zip(wanted, files)
    ]  # fmt: skip
    manifest = {
        "bundle": stem,
        "engine": ws.engine,
        "version": ws.version,
        "torch_pin": pin.torch,
        "torch_pin_source": pin.source,
        "engine_requires_python": req_py,
        "python": py,
        "platform_tags": platform_tags(),
        "wheel_set_source": ws.source,
        "have": have_source,
        "skipped_as_present": skipped,
        "wheels": wheel_rows,
        "pruned": pruned,
        "dense_only": dense_only,
        "env": ws.env,
        "beside": beside,
        "ahead_of_host": list(ws.ahead),
        "staged_bytes": staged,
        "installed_bytes": staged - sum(p["bytes"] for p in pruned),
        "xz_preset": preset,
        "pack_seconds": round(time.time() - t0, 1),
        "parts": parts,
        "total_part_bytes": sum(p["bytes"] for p in parts),
        "member": "site-packages",
        "built": time.strftime("%Y-%m-%d"),
    }
    write_manifest(out, manifest)
    return out
