"""The thread budget (eagle3nb/threads.py): cores from a fake affinity set and fake cgroup v1/v2
files (hand-computed budgets), the share-out over processes, the refusal of more threads than cores,
the variables an engine worker gets (a user's own setting kept), and the kernel's torch pools."""

import subprocess
import sys
import time

import pytest
import torch

from eagle3nb import threads
from eagle3nb.params import RunParams
from eagle3nb.steps.shared.checks import use_thread_budget


def _tree(tmp_path, proc_lines: str, files: dict[str, str]):
    """A fake /proc/self/cgroup and cgroup mount under tmp_path; returns (proc file, root)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(proc_lines)
    root = tmp_path / "cgroup"
    root.mkdir()
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return proc, root


def test_cgroup_v2_quota_caps_the_affinity(tmp_path):
    # 150000 / 100000 = 1.5 CPUs -> 1 thread (rounded down), though 4 CPUs are in the mask
    proc, root = _tree(
        tmp_path,
        "0::/pod/app\n",
        {
            "cgroup.controllers": "cpu memory",
            "pod/app/cpu.max": "150000 100000\n",
            "pod/cpu.max": "max 100000\n",
        },
    )
    assert threads.cgroup_cpu_quota(proc, root) == 1.5
    cores = threads.available_cores({0, 1, 2, 3}, proc, root)
    assert (cores.available, cores.source, cores.cpus, cores.quota) == (
        1,
        "cgroup",
        (0, 1, 2, 3),
        1.5,
    )


def test_cgroup_v2_parent_quota_is_the_tighter_one(tmp_path):
    # the child allows 3 CPUs, its parent 2: 2 apply
    proc, root = _tree(
        tmp_path,
        "0::/a/b\n",
        {
            "cgroup.controllers": "cpu",
            "a/b/cpu.max": "300000 100000",
            "a/cpu.max": "200000 100000",
        },
    )
    assert threads.cgroup_cpu_quota(proc, root) == 2.0
    assert threads.available_cores(set(range(8)), proc, root).available == 2


def test_cgroup_v1_cfs_quota_on_a_hybrid_host(tmp_path):
    # v1 cpu controller mounted as cpu,cpuacct; 250000 / 100000 = 2.5 -> 2 threads of 8 CPUs
    proc, root = _tree(
        tmp_path,
        "4:memory:/x\n3:cpu,cpuacct:/docker/c1\n0::/\n",
        {
            "cpu,cpuacct/docker/c1/cpu.cfs_quota_us": "250000",
            "cpu,cpuacct/docker/c1/cpu.cfs_period_us": "100000",
            "unified/cgroup.procs": "",
        },
    )
    assert threads.cgroup_cpu_quota(proc, root) == 2.5
    cores = threads.available_cores(set(range(8)), proc, root)
    assert (cores.available, cores.source) == (2, "cgroup")


def test_cgroup_v2_under_unified_on_a_hybrid_host(tmp_path):
    # v1 controllers at the root (no quota there), the v2 tree mounted at unified/: 50000 / 100000
    # = 0.5 CPUs -> 1 thread (at least one)
    proc, root = _tree(
        tmp_path,
        "1:cpu:/\n0::/job\n",
        {
            "cpu/cpu.cfs_quota_us": "-1",
            "cpu/cpu.cfs_period_us": "100000",
            "unified/cgroup.controllers": "",
            "unified/job/cpu.max": "50000 100000",
        },
    )
    assert threads.cgroup_cpu_quota(proc, root) == 0.5
    cores = threads.available_cores({0, 1}, proc, root)
    assert (cores.available, cores.source) == (1, "cgroup")


def test_no_quota_leaves_the_affinity(tmp_path):
    # v1 quota -1 (unlimited) and a v2 "max": the 3 CPUs of the mask
    proc, root = _tree(
        tmp_path,
        "1:cpu:/\n0::/\n",
        {
            "cpu/cpu.cfs_quota_us": "-1",
            "cpu/cpu.cfs_period_us": "100000",
            "cgroup.controllers": "cpu",
            "cpu.max": "max 100000",
        },
    )
    assert threads.cgroup_cpu_quota(proc, root) is None
    cores = threads.available_cores({2, 5, 7}, proc, root)
    assert (cores.available, cores.source, cores.quota) == (3, "affinity", None)
    # a quota above the mask (4 CPUs of quota, 2 CPUs in the mask): the mask decides
    proc, root = _tree(
        tmp_path / "b", "0::/\n", {"cgroup.controllers": "cpu", "cpu.max": "400000 100000"}
    )
    assert threads.available_cores({0, 1}, proc, root).source == "affinity"
    # no cgroup files at all
    missing = tmp_path / "none"
    assert threads.available_cores({0}, missing / "c", missing).available == 1


def test_plan_shares_the_budget_and_refuses_too_many():
    cores = threads.Cores(4, (0, 1, 2, 3), None, "affinity")
    b = threads.plan(0, cores)
    assert (b.total, b.threads, b.worker, b.processes) == (4, 4, 4, 1)
    b = threads.plan(3, cores, processes=2)  # 3 // 2 = 1 each
    assert (b.total, b.threads, b.worker) == (3, 1, 1)
    assert threads.plan(2, cores, processes=4).threads == 1  # at least 1
    with pytest.raises(ValueError, match=r"threads=5: this process may use 4 cores .*set threads"):
        threads.plan(5, cores)
    quota = threads.Cores(1, (0, 1, 2, 3), 1.5, "cgroup")
    with pytest.raises(ValueError, match=r"threads=2: .* 1 cores \(cgroup CPU quota 1.5\)"):
        threads.plan(2, quota)


def test_worker_env_per_engine_keeps_the_users_setting():
    assert threads.worker_env(3, "sglang", {}) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    assert threads.worker_env(2, "vllm", {"OMP_NUM_THREADS": "7"}) == {
        "MKL_NUM_THREADS": "2",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }


def test_apply_sizes_the_kernel_and_is_recorded(tmp_path):
    before = torch.get_num_threads()
    try:
        b = threads.apply(threads.plan(1, threads.Cores(2, (0, 1), None, "affinity")))
        assert torch.get_num_threads() == 1 and b.kernel["torch_threads"] == 1
        assert threads.current() is b
        assert b.as_metrics()["budget"] == 1 and b.as_metrics()["available"] == 2
        # threads: -1 applies nothing and forgets the budget (engine workers get no setting)
        assert use_thread_budget(RunParams(threads=-1)) is None and threads.current() is None
        with pytest.raises(ValueError, match=r"threads=\d+: this process may use"):
            use_thread_budget(RunParams(threads=threads.available_cores().available + 1))
    finally:
        threads.clear()
        torch.set_num_threads(before)


def test_others_running_reads_procs_running_minus_the_reader(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nprocs_running 4\nprocs_blocked 0\n")
    assert threads.others_running(samples=3, interval=0, stat=stat) == 3
    stat.write_text("cpu  1 2 3\n")  # not Linux's format: no answer rather than a guess
    assert threads.others_running(samples=1, stat=stat) is None


def test_others_running_sees_real_busy_processes():
    # two spinning processes are two runnable threads besides the reader, whatever else runs
    spin = "import time\nt = time.time()\nwhile time.time() - t < 20: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        time.sleep(0.5)
        assert threads.others_running(samples=9, interval=0.02) >= 2
    finally:
        for pr in procs:
            pr.kill()
            pr.wait()


def test_idle_share_by_hand():
    assert threads.idle_share(2, 2, 0) == 2  # idle machine: the whole budget
    assert threads.idle_share(2, 2, 1) == 1
    assert threads.idle_share(2, 2, 5) == 1  # never below one thread
    assert threads.idle_share(4, 8, 2) == 4  # never above the budget


def test_rebalancer_resizes_on_load_and_records_each_change(monkeypatch):
    cores = threads.Cores(4, (0, 1, 2, 3), None, "affinity")
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    old = torch.get_num_threads()
    threads.apply(threads.plan(0, cores))
    now, loads = [0.0], iter([0, 3, 3, 1])
    try:
        r = threads.Rebalancer(every_s=10, clock=lambda: now[0], sampler=lambda: next(loads))
        r.tick(0)  # idle: 4 threads (recorded: the first check)
        r.tick(5)  # under 10 s: no new check
        now[0] = 11
        r.tick(7)  # 3 busy threads: 1 left
        assert torch.get_num_threads() == 1
        now[0] = 22
        r.tick(9)  # same share: nothing recorded
        now[0] = 33
        r.tick(12)  # one busy: 3
        assert r.changes == [
            {"step": 0, "threads": 4, "others": 0},
            {"step": 7, "threads": 1, "others": 3},
            {"step": 12, "threads": 3, "others": 1},
        ]
        assert torch.get_num_threads() == 3
        # a pinned budget is never re-sized
        threads.apply(threads.plan(2, cores))
        pinned = threads.Rebalancer(sampler=lambda: 3)
        pinned.tick(0)
        assert pinned.changes == [] and torch.get_num_threads() == 2
    finally:
        threads.clear()
        torch.set_num_threads(old)


def test_a_step_started_beside_busy_work_takes_the_idle_cores(tmp_path, monkeypatch):
    """use_thread_budget (every step's start) with threads 0: the kernel and the engine workers
    the step starts get the idle share, and metrics.json records how many threads were busy."""
    cores = threads.Cores(2, (0, 1), None, "affinity")
    monkeypatch.setattr(threads, "available_cores", lambda: cores)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "others_running", lambda: 5)
    before = torch.get_num_threads()
    try:
        b = use_thread_budget(RunParams(threads=0))
        assert torch.get_num_threads() == 1 and b.worker == 1 and b.total == 2
        monkeypatch.setattr(threads, "others_running", lambda: 0)
        b = use_thread_budget(RunParams(threads=0))
        assert torch.get_num_threads() == 2 and b.worker == 2
    finally:
        threads.clear()
        torch.set_num_threads(before)


def test_rebalancer_leaves_gpu_training_alone(monkeypatch):
    cores = threads.Cores(2, (0, 1), None, "affinity")
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    old = torch.get_num_threads()
    try:
        threads.apply(threads.plan(0, cores))
        r = threads.Rebalancer(cpu=False, sampler=lambda: 3)
        r.tick(0)
        assert r.changes == [] and torch.get_num_threads() == 2
    finally:
        threads.clear()
        torch.set_num_threads(old)
