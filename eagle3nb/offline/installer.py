"""``install.sh``: what the host runs, one command, next to the parts (bash, coreutils, tar and xz,
or python3's lzma where xz is absent; no package index, no network).

It checks every part's sha256 against the manifest's, reassembles them with ``cat``, unpacks with
``xz -dc | tar -x`` into a temporary folder beside the target (a failed unpack leaves the previous
install as it was), moves ``site-packages`` into place, writes ``env.sh`` and prints the
``export PYTHONPATH=... VLLM_USE_FLASHINFER_SAMPLER=0`` line. A bundle used beside another
(SGLang beside vLLM's site: ``manifest["beside"]``) also gets ``TARGET/python``, a wrapper running
the host's ``python3`` with this site and then the other on ``PYTHONPATH`` (after what the caller
put there, e.g. the repository): given as ``sglang_python``, the SGLang worker, and only it, sees
transformers 5.12.1 ahead of the host's. ``BESIDE_SITE`` names the other site (default: the other
bundle's default folder next to ``TARGET``).
"""

from __future__ import annotations

import shlex

__all__ = ["render_install_sh", "env_line", "wrapper_block"]


def env_line(target: str, env: dict[str, str]) -> str:
    """The ``export`` line that puts ``target/site-packages`` first on ``PYTHONPATH`` with the
    bundle's switches (``target`` may hold shell variables: it is double-quoted, not escaped)."""
    extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    path = f'PYTHONPATH="{target}/site-packages${{PYTHONPATH:+:$PYTHONPATH}}"'
    return f"export {path} {extra}".rstrip()


def wrapper_block(manifest: dict) -> str:
    """The part of ``install.sh`` that writes ``TARGET/python`` for a bundle with ``beside``
    (empty otherwise)."""
    b = manifest.get("beside")
    if not b:
        return ""
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(manifest.get("env", {}).items()))
    member = manifest.get("member", "site-packages")
    lines = [
        f'BESIDE_SITE=${{BESIDE_SITE:-$(dirname "$TARGET")/{b["stem"]}/site-packages}}',
        'if [ ! -d "$BESIDE_SITE" ]; then',
        f'  echo "install.sh: $BESIDE_SITE ({b["engine"]} {b["version"]} bundle site) is missing: '
        'install that bundle first, or set BESIDE_SITE" >&2; exit 1',
        "fi",
        "{",
        "  echo '#!/usr/bin/env bash'",
        f"  echo '# {manifest['bundle']}: the host python3, this site, then {b['engine']}s site'",
        f'  echo "export PYTHONPATH=\\"\\${{PYTHONPATH:+\\$PYTHONPATH:}}$TARGET/{member}:'
        f'$BESIDE_SITE\\" {envs}"',
        "  echo 'exec python3 \"$@\"'",
        '} > "$TARGET/python"',
        'chmod +x "$TARGET/python"',
        'echo "wrote $TARGET/python: give it as sglang_python ($BESIDE_SITE after this site)"',
        'echo "check it (from the eagle3nb repository): $TARGET/python -m eagle3nb.offline check'
        ' --engine sglang"',
    ]
    return "\n".join(lines) + "\n"


def render_install_sh(manifest: dict) -> str:
    """The script for ``manifest`` (its ``bundle``, ``parts`` with ``name``/``sha256``, ``env``,
    ``member``)."""
    names = " ".join(shlex.quote(p["name"]) for p in manifest["parts"])
    sums = " ".join(p["sha256"] for p in manifest["parts"])
    stem = manifest["bundle"]
    member = manifest.get("member", "site-packages")
    line = env_line("@TARGET@", manifest.get("env", {}))
    return f"""#!/usr/bin/env bash
# eagle3nb offline bundle {stem} (see manifest.json). Put every part in this script's folder, then:
#   bash install.sh [TARGET]      (default $HOME/eagle3nb-offline/{stem})
set -euo pipefail
HERE=$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)
TARGET=${{1:-$HOME/eagle3nb-offline/{stem}}}
PARTS=({names})
SUMS=({sums})
files=()
for i in "${{!PARTS[@]}}"; do
  f="$HERE/${{PARTS[$i]}}"
  if [ ! -f "$f" ]; then
    echo "install.sh: missing part $f: copy all ${{#PARTS[@]}} parts into $HERE" >&2; exit 1
  fi
  got=$(sha256sum "$f" | cut -d' ' -f1)
  if [ "$got" != "${{SUMS[$i]}}" ]; then
    echo "install.sh: $f has sha256 $got, the manifest says ${{SUMS[$i]}}: copy it again" >&2
    exit 1
  fi
  files+=("$f")
done
unxz() {{
  if command -v xz >/dev/null; then xz -dc
  else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'
  fi
}}
mkdir -p "$TARGET"
TARGET=$(cd "$TARGET" && pwd)
tmp="$TARGET/.unpack.$$"
rm -rf "$tmp"; mkdir "$tmp"
trap 'rm -rf "$tmp"' EXIT
cat "${{files[@]}}" | unxz | tar -x -C "$tmp"
rm -rf "$TARGET/{member}"
mv "$tmp/{member}" "$TARGET/{member}"
printf '%s\\n' {shlex.quote(line)} | sed "s|@TARGET@|$TARGET|g" > "$TARGET/env.sh"
echo "installed {stem} into $TARGET/{member} ($(du -sh "$TARGET/{member}" | cut -f1))"
{wrapper_block(manifest)}echo "now run (or: source $TARGET/env.sh):"
cat "$TARGET/env.sh"
{"" if manifest.get("beside") else 'echo "then check it: python3 -m eagle3nb.offline check   (from the eagle3nb repository)"'}
"""
