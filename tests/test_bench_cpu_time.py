"""bench/cpu_time.py: the machine's busy/total CPU seconds, and a command's CPU seconds counted over
its whole process tree (the other-load share of bench/eval_time.py rests on both)."""

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import cpu_time  # noqa: E402

BUSY = 0.6  # CPU seconds the grandchild burns

# the grandchild: burns BUSY CPU seconds, then writes its own CPU time as the kernel counts it
GRANDCHILD = f"""
import os, resource, sys, time
t = time.process_time()
while time.process_time() - t < {BUSY}:
    pass
r = resource.getrusage(resource.RUSAGE_SELF)
open(sys.argv[1] + ".tmp", "w").write(str(r.ru_utime + r.ru_stime))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""

# the child: starts the grandchild in a session of its own (as 04's engine client starts a
# worker) and exits at once without waiting for it, so nobody above waits for the grandchild
CHILD = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], start_new_session=True)
"""


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not path.is_file():
        assert time.monotonic() < end, f"{path} not written within {timeout} s"
        time.sleep(0.05)


def test_run_tree_counts_a_grandchild_nobody_waits_for(tmp_path):
    out = tmp_path / "grandchild_cpu"
    got = cpu_time.run_tree([sys.executable, "-c", CHILD, GRANDCHILD, str(out)], grace=60)
    assert got.returncode == 0 and got.killed == ()
    assert out.is_file()  # run_tree returned only after the grandchild had exited
    own = float(out.read_text())  # the grandchild's own count, a second method
    assert own >= BUSY
    # its time, plus the child's start (a python start is well under 2 CPU s)
    assert own <= got.cpu_seconds <= own + 2.0, (own, got.cpu_seconds)


def test_rusage_children_alone_misses_that_grandchild(tmp_path):
    """The old counting (RUSAGE_CHILDREN around subprocess.run): the grandchild's time is lost,
    which is why the other-load share overstated the machine's other load."""
    out = tmp_path / "grandchild_cpu"
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", CHILD, GRANDCHILD, str(out)], check=True)
    _wait_for(out)
    time.sleep(0.2)  # its exit, after the write
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    old = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    assert old < float(out.read_text()) / 2, old


def test_run_tree_passes_the_exit_code_and_times_the_command_not_its_descendants(tmp_path):
    # exits 3 at once; its grandchild sleeps 3 s: the wall time is the command's
    sleeper = "import time; time.sleep(3)"
    child = (
        "import subprocess, sys; "
        f"subprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True); "
        "sys.exit(3)"
    )
    t0 = time.perf_counter()
    got = cpu_time.run_tree([sys.executable, "-c", child], capture_output=True, text=True)
    assert got.returncode == 3 and got.killed == ()
    assert time.perf_counter() - t0 >= 3  # the sleeper was waited for
    assert got.seconds < 2.5, got.seconds


def test_run_tree_kills_a_descendant_that_outlives_the_grace(tmp_path):
    pidfile = tmp_path / "pid"
    # the grandchild writes its pid (temp file, then rename) and sleeps for an hour
    forever = (
        f"import os, time; p = {str(pidfile)!r}; open(p + '.tmp', 'w').write(str(os.getpid())); "
        "os.replace(p + '.tmp', p); time.sleep(3600)"
    )
    # the child starts it in a session of its own, waits until it runs, and exits
    child = f"""
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {forever!r}], start_new_session=True)
while not os.path.exists({str(pidfile)!r}):
    time.sleep(0.05)
"""
    t0 = time.perf_counter()
    got = cpu_time.run_tree([sys.executable, "-c", child], grace=1.0)
    assert time.perf_counter() - t0 < 30
    pid = int(pidfile.read_text())
    assert got.killed == (pid,)
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped


def test_machine_cpu_seconds_reads_busy_and_total_from_the_cpu_line(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 20 30 800 50 0 0 0 0 0\ncpu0 50 10 15 400 25 0 0 0 0 0\n")
    hz = os.sysconf("SC_CLK_TCK")
    assert cpu_time.machine_cpu_seconds(stat) == (150 / hz, 1000 / hz)
    busy0, total0 = cpu_time.machine_cpu_seconds()
    busy1, total1 = cpu_time.machine_cpu_seconds()
    assert 0 < busy0 <= total0 and busy1 >= busy0 and total1 >= total0
