"""Engine workers kept running for reuse within one process: one start per engine and target.

Why: starting an engine worker costs tens of seconds on CPU (SGLang 40-50 s, vLLM 15-25 s: the
engine's import and its first engine build), while a running worker already switches what it
captures and serves per call (vLLM's plain / capture / EAGLE-3 engines, SGLang's capture ids and
dtype: :mod:`eagle3nb.engines.vllm_backend`, :mod:`eagle3nb.engines.sglang_backend`). A process that
runs several steps on the same target (a sweep script, the test suite) then pays each start once.

How (:func:`open_engine`, called by :func:`eagle3nb.engines.vllm_helpers.start_vllm` and
:func:`eagle3nb.engines.sglang_helpers.start_sglang`): with ``EAGLE3NB_KEEP_ENGINES=N`` (N >= 1) a
client closed by its holder is not stopped but kept idle, and the next :func:`open_engine` with the
same key gets the same running worker back. The key is everything the worker was started with:
engine, resolved model folder and its files' names, sizes and mtimes, dtype, options, python,
environment, prefix and thread count; a worker that died is dropped. A worker started with no thread count gets this process's budget
(:func:`eagle3nb.threads.current`), or all its cores when none is applied, so a test's or script's
own start and a step's share one key. At most N idle workers are kept (the one reused least, then
the least recently used, is stopped first: a one-off target does not push out the one every step
uses), so idle memory stays bounded; all are stopped at exit (and a worker whose client process
dies ends on its closed stdin). Holders may overlap (a test module's client and a step's): calls
are sequential in one process, and each call sets the engine's mode itself.

Default ``0``: every :func:`open_engine` starts its own worker and ``close`` stops it, as before;
a notebook kernel then holds no engine (and no GPU memory) between steps. Kept workers write their
temp files and ``engine.log`` in the system temp folder, not in the first run's folder, which a
later holder may outlive.
"""

from __future__ import annotations

import atexit
import json
import os
from collections import OrderedDict
from pathlib import Path

from eagle3nb import threads as thread_budget
from eagle3nb.engines.client import EngineClient
from eagle3nb.engines.worker import folder_stamp

__all__ = ["KEEP_ENV", "kept_capacity", "open_engine", "running", "stop", "stop_all"]

KEEP_ENV = "EAGLE3NB_KEEP_ENGINES"

# key -> [client, holders, reuses]; order = least recently released first
_POOL: OrderedDict[str, list] = OrderedDict()


def kept_capacity() -> int:
    """How many idle engine workers this process keeps (``$EAGLE3NB_KEEP_ENGINES``, default 0).

    Raises:
        ValueError: the variable is not an int >= 0 (names it, the value and the fix).
    """
    raw = os.environ.get(KEEP_ENV, "0").strip() or "0"
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(
            f"{KEEP_ENV}={raw!r} is not an int >= 0; set it to the number of idle engine workers to keep (0: stop each when closed)"
        )
    return n


def _key(engine, model_path, dtype, options, python, env, prefix, threads) -> str:
    path = Path(str(model_path)).resolve()
    stamp = folder_stamp(path) if path.is_dir() else None  # a model written again: a new worker
    return json.dumps(
        [engine, str(path), dtype, options, python, env, prefix, threads, stamp],
        sort_keys=True,
        default=str,
    )


def _alive(c: EngineClient) -> bool:
    if c._backend is not None:  # in-process backend
        return True
    return c._proc is not None and c._proc.poll() is None


def open_engine(
    engine: str,
    model_path,
    dtype: str = "float32",
    options: dict | None = None,
    python: str | None = None,
    workdir_parent=None,
    env: dict | None = None,
    prefix: list[str] | None = None,
    threads: int | None = None,
    **kw,
) -> EngineClient:
    """An :class:`EngineClient` for these arguments (same meaning as its constructor's; ``kw``:
    its other keywords, e.g. ``param``, timeouts): a kept running one with the same key, or a new
    one (kept for reuse when closed, if the pool keeps any; its temp folder then in the system's).

    Raises:
        ValueError: a bad ``$EAGLE3NB_KEEP_ENGINES``; and whatever :class:`EngineClient` raises.
    """

    def start(parent) -> EngineClient:
        return EngineClient(
            engine, model_path, dtype, options, python, workdir_parent=parent,
            env=env, prefix=prefix, threads=threads, **kw,
        )  # fmt: skip

    if kept_capacity() == 0:
        return start(workdir_parent)
    if threads is None:  # this process's budget, else all its cores: one key for both
        budget = thread_budget.current() or thread_budget.plan(0)
        threads = budget.worker
    key = _key(engine, model_path, dtype, dict(options or {}), python, env, prefix, threads)
    entry = _POOL.pop(key, None)
    if entry is not None and not _alive(entry[0]):
        entry[0]._release = None
        entry[0].close()  # a dead worker: clean up its temp folder, start again
        entry = None
    if entry is None:
        client = start(None)  # a later holder may outlive the first run's folder
        entry = [client, 0, 0]
        client._release = lambda c, k=key: _release(k)
    else:
        entry[2] += 1  # reuses: the idle worker reused least is stopped first
    entry[1] += 1
    _POOL[key] = entry
    return entry[0]


def _release(key: str) -> bool:
    """A holder closed the client: keep it (True) or let it stop (False)."""
    entry = _POOL.get(key)
    if entry is None:
        return False
    entry[1] = max(0, entry[1] - 1)
    _POOL.move_to_end(key)
    _trim(kept_capacity())
    return key in _POOL


def _trim(cap: int) -> None:
    # fewest reuses first, then least recently released (_POOL's order; sorted() is stable)
    idle = sorted((k for k, e in _POOL.items() if e[1] == 0), key=lambda k: _POOL[k][2])
    for k in idle[: max(0, len(idle) - cap)]:
        client = _POOL.pop(k)[0]
        client._release = None
        client.close()


def running() -> list[dict]:
    """The workers the pool holds: ``{"engine", "model_path", "dtype", "holders", "pid"}`` each."""
    out = []
    for k, (c, n, _) in _POOL.items():
        engine, model_path, dtype = json.loads(k)[:3]
        out.append(
            {"engine": engine, "model_path": model_path, "dtype": dtype, "holders": n, "pid": c.pid}
        )
    return out


def stop(client: EngineClient) -> None:
    """Stop ``client``'s worker now, kept or held, and drop it from the pool (a worker on a one-off
    target, e.g. a test's: its memory back at once instead of when the pool trims it). Other
    holders of the same worker are left with a stopped client; a client the pool does not hold
    is closed as usual."""
    for k, entry in list(_POOL.items()):
        if entry[0] is client:
            del _POOL[k]
    client._release = None
    client.close()


def stop_all() -> None:
    """Stop every worker the pool holds (held ones too); registered to run at exit."""
    while _POOL:
        client = _POOL.popitem(last=False)[1][0]
        client._release = None
        client.close()


atexit.register(stop_all)
