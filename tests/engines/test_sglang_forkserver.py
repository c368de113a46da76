"""SGLang's scheduler and detokenizer forked from one preloaded server per worker
(eagle3nb.engines.sglang_forkserver), read from /proc: every engine a worker builds (other dtype,
back again) forks from the same server, SGLang's shutdown kills the old engine's processes but not
the server, and the states are the same numbers after a rebuild."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from testkit import requires_engine, sglang_ctx
from eagle3nb.engines import sglang_forkserver
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
from eagle3nb.target import models

PY = DEFAULT_ENGINE_PYTHONS["sglang"]
IDS = [0, 1, 3]
SAMPLES = [[1, 20, 30, 40, 50, 60, 70], [1, 7, 8], [1] + list(range(100, 160))]


def _tree(root: int) -> dict[int, tuple[int, str]]:
    """{pid: (ppid, command line)} of ``root``'s descendants, from /proc."""
    procs = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        procs[int(d.name)] = (ppid, cmd)
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        for c, (pp, cmd) in procs.items():
            if pp == p and c not in out:
                out[c] = (pp, cmd)
                todo.append(c)
    return out


def _server_and_schedulers(tree) -> tuple[int, set[int]]:
    servers = [p for p, (_, cmd) in tree.items() if "multiprocessing.forkserver" in cmd]
    assert len(servers) == 1, tree
    assert all(m in tree[servers[0]][1] for m in sglang_forkserver.PRELOAD)  # preloaded
    sched = {p for p, (_, cmd) in tree.items() if cmd.startswith("sglang::scheduler")}
    assert sched and all(tree[p][0] == servers[0] for p in sched), tree  # forked from it
    return servers[0], sched


def test_switch_reads_the_environment_and_needs_sglang(monkeypatch):
    import types

    monkeypatch.delenv(sglang_forkserver.ENV, raising=False)
    monkeypatch.setattr(sglang_forkserver, "_sglang_installed", lambda: True)
    assert sglang_forkserver.enabled("cpu") and not sglang_forkserver.enabled("cuda")
    monkeypatch.setenv(sglang_forkserver.ENV, "0")
    assert not sglang_forkserver.enabled("cpu")
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace())  # a stand-in, no spec
    assert not sglang_forkserver._sglang_installed()


_ENV_SCRIPT = """
import multiprocessing as mp, os, sys
from multiprocessing import forkserver
from eagle3nb.engines import sglang_forkserver as f

def child(path):
    open(path, "w").write(os.environ.get("EAGLE3NB_T", "unset"))

if __name__ == "__main__":
    mp.set_start_method("forkserver")
    os.environ["EAGLE3NB_T"] = "at the server's start"
    forkserver.ensure_running()
    os.environ["EAGLE3NB_T"] = "at the child's start"
    for cls, out in ((mp.Process, sys.argv[1]), (f._EnvProcess, sys.argv[2])):
        p = cls(target=child, args=(out,))
        p.start()
        p.join()
"""


def test_forked_child_runs_with_the_environment_of_its_start(tmp_path):
    """A plain forkserver child keeps the server's environment; _EnvProcess gets its parent's at
    start, as a spawned child does."""
    script = tmp_path / "env_child.py"
    script.write_text(_ENV_SCRIPT)
    plain, ours = tmp_path / "plain.txt", tmp_path / "ours.txt"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    subprocess.run([sys.executable, str(script), str(plain), str(ours)], env=env, check=True)
    assert plain.read_text() == "at the server's start"
    assert ours.read_text() == "at the child's start"


@requires_engine("sglang")
def test_every_engine_of_a_worker_forks_from_one_preloaded_server(tmp_path):
    from eagle3nb.engines.sglang_helpers import start_sglang

    path = models.resolve_model("stories260K-hd32")
    client = start_sglang(path, "float32", "cpu", 0, None, tmp_path, sglang_ctx(path))
    with client:
        first = client.capture(SAMPLES, IDS)
        server, sched = _server_and_schedulers(_tree(client.pid))
        client.capture(SAMPLES, IDS, dtype="bfloat16")  # a new engine in the same worker
        tree = _tree(client.pid)
        server2, sched2 = _server_and_schedulers(tree)
        assert server2 == server and not sched & sched2 and not sched & set(tree)
        again = client.capture(SAMPLES, IDS)  # and back to float32: a third engine
        assert _server_and_schedulers(_tree(client.pid))[0] == server
        assert client.info(live=True)["hidden_states_transport"] == "tensor"  # still patched
    for a, b in zip(first, again):
        assert torch.equal(a["aux"], b["aux"])
