"""Real-browser test: the four notebooks run as stored in JupyterLab, in headless Chromium.

Starts ``jupyter lab`` (from the venv running pytest) on 127.0.0.1 with a random token and throwaway
config/data/runtime/settings dirs, then ``node tests/browser/run_notebooks.mjs`` opens each notebook,
runs all cells from the Run menu, and checks: no error output, every code cell executed, and (02b,
03, 04) a rendered plotly figure with SVG content. Screenshots go to ``outputs/screenshots/``.
The notebooks resume the session's headless run of ``outputs/smoke`` (``smoke_run``, made first):
what they draw comes from its files and its steps' recorded results, as after a kernel restart.

Needs Debian's chromium (/usr/bin/chromium) and ``tests/browser/node_modules`` (playwright-core);
``.ci/setup_browser.sh`` installs both, and ``.ci/run`` calls it, so CI runs this test for real.
The stored notebooks must not change: JupyterLab autosave is off, notebooks are closed without
saving, and the server refuses (and records) any save; a clean ``git diff notebooks/`` must stay clean.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from testkit import requires_engine

REPO = Path(__file__).resolve().parents[1]
BROWSER_DIR = REPO / "tests" / "browser"
SCRIPT = BROWSER_DIR / "run_notebooks.mjs"
CHROMIUM = os.environ.get("EAGLE3NB_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / "outputs" / "screenshots"
SERVER_START_TIMEOUT_S = 90
SERVER_CONFIG = """\
from tornado.web import HTTPError


def _refuse_save(model, path, contents_manager, **kwargs):
    with open({saves!r}, "a") as f:
        f.write(str(path) + "\\n")
    raise HTTPError(403, "eagle3nb browser test: saving is disabled (stored notebooks stay stripped)")


c.ContentsManager.pre_save_hook = _refuse_save
c.FileCheckpoints.checkpoint_dir = {checkpoints!r}
"""
BROWSER_RUN_TIMEOUT_S = (
    1800  # hard cap for the node script (it has per-notebook timeouts of its own)
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listen_addresses(port: int) -> list[str]:
    """Local addresses of LISTEN sockets on ``port`` from /proc/net/tcp{,6} (Linux), as hex strings."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, p = fields[1].split(":")
            if int(p, 16) == port and fields[3] == "0A":  # 0A = TCP_LISTEN
                found.append(addr)
    return found


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".ipynb_checkpoints" not in p.parts
    }


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@pytest.fixture
def jupyter_lab(tmp_path):
    """A JupyterLab server on 127.0.0.1:<free port> rooted at the repo; yields (base_url, token)."""
    jupyter = Path(sys.executable).parent / "jupyter"
    if not jupyter.exists():
        pytest.skip(f"no jupyter next to {sys.executable}")
    token = secrets.token_hex(24)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    home = tmp_path / "jupyter"
    env = dict(os.environ)
    for k in ("JUPYTER_TOKEN", "JUPYTER_PASSWORD", "JUPYTER_PREFER_ENV_PATH"):
        env.pop(k, None)
    env.update(
        TQDM_DISABLE="1",
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "lab-workspaces"),
        IPYTHONDIR=str(home / "ipython"),
        JUPYTER_PLATFORM_DIRS="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    cmd = [
        str(jupyter),
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={REPO}",
        "--ServerApp.open_browser=False",
        "--ServerApp.allow_remote_access=False",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    # No news feed, update check or extension manager (no internet needed).
    _write_json(
        home / "config" / "jupyter_lab_config.json",
        {
            "LabApp": {
                "news_url": None,
                "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                "extension_manager": "readonly",
            }
        },
    )
    # The server refuses every save (and records the attempt): the stored notebooks cannot be written,
    # whatever the browser does. Checkpoints go to the temporary dir, not notebooks/.ipynb_checkpoints.
    saves = tmp_path / "save_attempts.log"
    (home / "config" / "jupyter_server_config.py").write_text(
        SERVER_CONFIG.format(saves=str(saves), checkpoints=str(home / "checkpoints"))
    )
    # JupyterLab user settings: no autosave; no "receive news?" toast over the screenshots.
    settings = home / "lab-settings" / "@jupyterlab"
    _write_json(
        settings / "docmanager-extension" / "plugin.jupyterlab-settings", {"autosave": False}
    )
    _write_json(
        settings / "apputils-extension" / "notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )
    log = tmp_path / "jupyter-lab.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{_tail(log)}")
            try:
                req = urllib.request.Request(
                    f"{base}/api/status", headers={"Authorization": f"token {token}"}
                )
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - t0 > SERVER_START_TIMEOUT_S:
                pytest.fail(
                    f"jupyter lab did not answer /api/status within {SERVER_START_TIMEOUT_S}s:\n{_tail(log)}"
                )
            time.sleep(0.25)
        print(f"\n[browser] jupyter lab up at {base} in {time.monotonic() - t0:.1f}s (log: {log})")
        yield base, token, proc, port, log, saves
    finally:
        if proc.poll() is None:
            os.killpg(
                proc.pid, signal.SIGTERM
            )  # its own session: the server and the kernels it started
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def _git_notebooks_clean() -> bool | None:
    """Whether `git diff --quiet -- notebooks/` holds (None without git)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return None
    return subprocess.run(["git", "diff", "--quiet", "--", "notebooks/"], cwd=REPO).returncode == 0


def test_notebooks_run_in_jupyterlab_chromium(smoke_run, jupyter_lab):
    # smoke_run first: the stored notebooks resume the headless run of outputs/smoke (their
    # parameters are its parameters), and read the engine steps' recorded results back
    base, token, proc, port, log, saves = jupyter_lab

    # The server must listen on the loopback interface only.
    addrs = _listen_addresses(port)
    if addrs:  # Linux: the listening sockets themselves
        assert all(a == "0100007F" for a in addrs), (
            f"jupyter lab listens on {addrs} (hex), not 127.0.0.1 only"
        )
    assert _connects("127.0.0.1", port)
    if sys.platform.startswith("linux"):
        assert not _connects("127.0.0.2", port), (
            "jupyter lab accepts connections on 127.0.0.2: bound to a wildcard address"
        )

    nb_dir = REPO / "notebooks"
    before, clean_before = _snapshot(nb_dir), _git_notebooks_clean()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            ["node", str(SCRIPT), base, token, str(SCREENSHOTS)],
            cwd=REPO,
            timeout=BROWSER_RUN_TIMEOUT_S,
            text=True,
            capture_output=True,
            env={**os.environ, "EAGLE3NB_CHROMIUM": CHROMIUM},
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(
            f"browser run exceeded {BROWSER_RUN_TIMEOUT_S}s:\n{out[-6000:]}\n--- jupyter lab log ---\n{_tail(log)}"
        )
    print(r.stdout)
    (SCREENSHOTS / "run_notebooks.log").write_text(
        r.stdout + ("\n--- stderr ---\n" + r.stderr if r.stderr else "")
    )
    if r.stderr.strip():
        print("[browser] node stderr:\n" + r.stderr[-4000:])
    print(
        f"[browser] node script: {time.monotonic() - t0:.1f}s, exit {r.returncode}; screenshots in {SCREENSHOTS}"
    )
    assert r.returncode == 0, (
        f"browser run failed (exit {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-4000:]}\n--- jupyter lab log ---\n{_tail(log)}"
    )

    # The stored notebooks stay as they were: nothing tried to save them through the server, and a
    # clean `git diff notebooks/` stays clean. (A change while git was already dirty can only come from
    # outside the server, e.g. someone editing the notebooks meanwhile: reported, not failed.)
    assert not saves.exists(), f"JupyterLab tried to save (refused): {saves.read_text()}"
    if clean_before:
        assert _git_notebooks_clean(), "notebooks/ differs from git after the browser run"
    after = _snapshot(nb_dir)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if clean_before is None:
        assert not changed, f"notebooks changed during the browser run: {changed}"
    elif changed:
        print(
            f"[browser] note: {changed} changed during the run, not through JupyterLab (no save attempt)"
        )


def _skip_reason() -> str | None:
    """Why the browser test cannot run here (None: it can)."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} missing (run: bash .ci/setup_browser.sh)"
    if not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir():
        return "tests/browser/node_modules missing (run: bash .ci/setup_browser.sh)"
    if shutil.which("node") is None:
        return "node missing (run: bash .ci/setup_browser.sh)"
    return None


_reason = _skip_reason()
# the notebooks resume the smoke run, whose steps start both engines
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(_reason is not None, reason=_reason or ""),
    requires_engine("vllm"),
    requires_engine("sglang"),
]
