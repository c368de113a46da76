"""SGLang's scheduler and detokenizer forked from a preloaded server process instead of spawned.

SGLang 0.5.23 sets the start method to ``spawn`` (``srt/entrypoints/engine.py``,
``_set_envs_and_config``: ``mp.set_start_method("spawn", force=True)``) and starts its scheduler
and detokenizer with ``mp.Process`` (``_launch_scheduler_processes``, ``_launch_detokenizer``).
Each spawned child imports SGLang from scratch: ~12-14 s per child on 2 cores (``python -c
"import sglang.srt.managers.scheduler"``: 14.0 s, ``...detokenizer_manager``: 12.1 s, measured
2026-12-02), paid again by every engine a worker builds (the run's dtype, the drift's other dtype,
each twin of the twin proof).

:func:`start` (at the backend's creation) starts one ``forkserver`` process that imports those
two modules (:data:`PRELOAD`) while the worker imports SGLang itself; with :func:`install`, every
child of every engine is forked from it with SGLang already imported:

- the environment: each child runs with the worker's environment as of the child's start
  (:class:`_EnvProcess`), as a spawned child would (a forked one would keep the server's);
- the transport patch: the children still run multiprocessing's preparation, which imports the
  worker module as ``__mp_main__``, so :mod:`eagle3nb.engines.sglang_transport` still patches them;
- shutdown: ``Engine.shutdown`` kills every process under the worker
  (``kill_process_tree(os.getpid(), include_parent=False)``, ``engine.py``); the installed
  stand-in kills the same processes but spares the forkserver and multiprocessing's resource
  tracker (the engine's processes under the server are still killed), so the next engine finds
  the server running.

CPU only (the engines this project starts there), and only where SGLang is installed;
``EAGLE3NB_SGLANG_FORKSERVER=0`` keeps SGLang's own spawn. Imports only the standard library.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os

from eagle3nb.engines import child_watch

__all__ = ["ENV", "PRELOAD", "enabled", "start", "install"]

ENV = "EAGLE3NB_SGLANG_FORKSERVER"
PRELOAD = ("sglang.srt.managers.scheduler", "sglang.srt.managers.detokenizer_manager")


class _EnvProcess(multiprocessing.Process):
    """A process that runs with the environment its parent had at ``start()`` (a forked child
    would otherwise keep the forkserver's, from the server's own start)."""

    def start(self):
        self._parent_env = dict(os.environ)
        name = getattr(self._target, "__name__", None) or self.name  # start() drops _target
        super().start()
        # the worker watches it, and the server: a scheduler that fails signals its parent, this
        # server (SIGQUIT, scheduler.py:6373), which dies and stays defunct under the worker
        child_watch.register(self.pid, name, self)
        for pid in _servers() - {_resource_tracker_pid()}:
            child_watch.register(pid, "SGLang's forkserver (a failing scheduler signals it)")

    def run(self):
        for k in set(os.environ) - set(self._parent_env):
            del os.environ[k]
        for k, v in self._parent_env.items():  # only what differs: SGLang sets its title in
            if os.environ.get(k) != v:  # the memory of the original environment
                os.environ[k] = v
        super().run()


class _ForkserverStart:
    """Stands in for ``multiprocessing`` as SGLang's engine module names it (``mp``): its
    ``set_start_method("spawn")`` picks ``forkserver``; everything else is multiprocessing's."""

    Process = _EnvProcess

    def __getattr__(self, name):
        return getattr(multiprocessing, name)

    def set_start_method(self, method, force=False):
        method = "forkserver" if method == "spawn" else method
        multiprocessing.set_start_method(method, force=force)


def _servers() -> set[int]:
    """Pids of this process's forkserver and resource tracker (multiprocessing's own records)."""
    from multiprocessing import forkserver, resource_tracker

    pids = (forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid)
    return {p for p in pids if p}


def _resource_tracker_pid():
    from multiprocessing import resource_tracker

    return resource_tracker._resource_tracker._pid


def _sparing_servers(kill_process_tree):
    """SGLang's ``kill_process_tree`` that, for this process's own tree, spares :func:`_servers`."""

    def kill(parent_pid=None, include_parent=True, skip_pid=None, wait_timeout=60):
        keep = _servers()
        # SGLang's own meaning: parent_pid None is this process, without itself
        own_tree = parent_pid is None or (parent_pid == os.getpid() and not include_parent)
        if not own_tree or not keep:
            return kill_process_tree(parent_pid, include_parent, skip_pid, wait_timeout)
        import psutil

        for child in psutil.Process().children():
            if child.pid == skip_pid:
                continue
            # a server: only what runs under it (the engine's scheduler and detokenizer)
            kill_process_tree(child.pid, child.pid not in keep, skip_pid, wait_timeout)

    kill.spares_servers = True
    return kill


def _sglang_installed() -> bool:
    """SGLang's package is importable here (its spec, without importing it): not a stand-in."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):  # a module object without a spec, as tests put in place
        return False
    return spec is not None and spec.submodule_search_locations is not None


def enabled(device: str) -> bool:
    """Whether engines on ``device`` start their children from the forkserver: on CPU, with
    SGLang installed, unless :data:`ENV` is ``0``."""
    return device == "cpu" and os.environ.get(ENV, "1") != "0" and _sglang_installed()


def start() -> None:
    """Start this process's forkserver now, preloading :data:`PRELOAD` (it imports them in the
    background; a child asked for before that is done waits for it). Idempotent."""
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload(list(PRELOAD))
    forkserver.ensure_running()


def install(engine_module) -> None:
    """Make ``engine_module`` (``sglang.srt.entrypoints.engine``) start its children from the
    forkserver of :func:`start` (started here if it is not running). Idempotent."""
    if isinstance(engine_module.mp, _ForkserverStart):
        return
    start()
    engine_module.mp = _ForkserverStart()
    engine_module.kill_process_tree = _sparing_servers(engine_module.kill_process_tree)
