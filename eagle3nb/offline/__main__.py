"""Offline install of a GPU engine for a host with no package index.

Here (with a package index):
  python -m eagle3nb.offline build --python-version 3.12 --torch 2.11.0 [--out DIR]
         [--have FILE | --have-image h200] [--dense-only] [--preset 9e]
On the host, in the folder holding every part: bash install.sh [TARGET], then the printed export
line, then: python -m eagle3nb.offline check [--model PATH]
SGLang (its own site, beside vLLM's): build --engine sglang; on the host install the vLLM bundle,
then the SGLang one (BESIDE_SITE=vllm's site-packages bash install.sh TARGET), then
TARGET/python -m eagle3nb.offline check --engine sglang
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, help=__doc__)


def _fail(msg: str) -> None:
    typer.echo(f"eagle3nb.offline: {msg}", err=True)
    raise typer.Exit(2)


@app.command()
def build(
    python_version: str = typer.Option(..., "--python-version", help="the host's Python, X.Y"),
    torch: str = typer.Option(..., "--torch", help="the host's torch version, e.g. 2.11.0"),
    out: Optional[Path] = typer.Option(None, help="folder for the bundle (default ./.offline)"),
    have: Optional[Path] = typer.Option(None, help="file: the host's packages, one a line"),
    have_image: str = typer.Option("h200", help="a built-in host package list (h200)"),
    dense_only: bool = typer.Option(False, help="drop vLLM's fused-MoE kernels (_moe_C)"),
    preset: str = typer.Option("9e", help="xz preset (0-9, e for extreme)"),
    engine: str = typer.Option("vllm", help="the engine (vllm, or sglang: built beside vllm's)"),
) -> None:
    """Download (cached in ~/.cache/eagle3nb/offline), stage, prune and pack the bundle."""
    from eagle3nb.offline.bundle import build as build_bundle
    from eagle3nb.offline.sets import HAVE_IMAGES, check_python, have_names, pick_engine

    try:  # every refusal before any download
        check_python(python_version, pick_engine(torch, engine)[1])
        if have is not None:
            if not have.is_file():
                _fail(f"--have {have}: no such file; write the host's `pip list` into it")
            names, source = have_names(have.read_text()), str(have)
        elif have_image in HAVE_IMAGES:
            names, source = HAVE_IMAGES[have_image], f"built-in image list {have_image!r}"
        else:
            _fail(f"--have-image {have_image}: unknown (known: {sorted(HAVE_IMAGES)}); or --have")
        folder = build_bundle(python_version, torch, out, names, source, dense_only, preset, engine)
    except ValueError as e:
        _fail(str(e))
    man = json.loads((folder / "manifest.json").read_text())
    for p in man["parts"]:
        typer.echo(f"{folder / p['name']}  {p['bytes']}  {p['sha256']}")
    typer.echo(f"{folder / 'install.sh'}\n{folder / 'manifest.json'}")
    mb = man["installed_bytes"] / 1e6
    typer.echo(
        f"{len(man['wheels'])} wheels, {mb:.1f} MB installed, {man['total_part_bytes']} B xz"
    )


@app.command()
def check(
    model: str = typer.Option("stories260K-hd32", help="local target folder or name"),
    max_new_tokens: int = typer.Option(8, min=1, help="tokens to generate"),
    dtype: str = typer.Option("", help="float32 or bfloat16 (default: vllm float32, sglang bf16)"),
    engine: str = typer.Option("vllm", help="vllm, or sglang (run with the bundle's python)"),
) -> None:
    """On the host: versions, then an engine on MODEL generating a few tokens (vs HF greedy)."""
    from eagle3nb.offline.check import check_engine, check_sglang, versions

    if engine not in ("vllm", "sglang"):
        _fail(f"--engine {engine}: give vllm or sglang")
    v = versions(engine)
    for k, val in v.items():
        typer.echo(f"{k:12s} {val}")
    if v[engine].startswith("absent"):
        _fail(f"{engine} does not import: run the export line install.sh printed (source env.sh)"
              " or, for sglang, the bundle's TARGET/python")  # fmt: skip
    try:
        if engine == "sglang":
            if model == "stories260K-hd32":  # width 172: SGLang's CUDA SiluAndMul faults on it
                model = "stories260K-hd32-mlp176"
            res = check_sglang(model, max_new_tokens, dtype or "bfloat16")
        else:
            res = check_engine(model, max_new_tokens, dtype or "float32")
    except (RuntimeError, FileNotFoundError, ValueError) as e:
        _fail(str(e))
    typer.echo(json.dumps(res))
    sys.exit(0)


if __name__ == "__main__":
    app()
