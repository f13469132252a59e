"""Sandbox limits per box: IPC namespace, cgroup v2 (or the rlimit fallback and its warning),
the pids limit, per-test time limits, stderr floods cut at the source, the non-x86_64 warning.
The adversarial suite (tests/rewards/code/test_code_adversarial.py) runs the same attacks among many others;
these tests look at each mechanism on its own."""

from __future__ import annotations

import logging
import os
import resource
import time
import tracemalloc
from pathlib import Path

import pytest

from rlvr.rewards.code import sandbox
from rlvr.rewards.code.runner import TestStatus, run_tests
from rlvr.rewards.code.sandbox import Box, SandboxLimits, run_processes
from rlvr.rewards.code.task import task_from_meta

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")

IO1 = task_from_meta({"tests": {"io": [{"stdin": "", "stdout": "3\n"}]}, "time_limit_s": 1.0})
LOGGER = "rlvr.rewards.code.sandbox"


def _sysv_ipc() -> dict[str, set[str]]:
    out = {}
    for kind in ("shm", "sem", "msg"):
        try:
            out[kind] = {line.split()[1] for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]}
        except OSError:
            out[kind] = set()
    return out


def test_sysv_ipc_objects_do_not_outlive_the_box():
    # A hook-free interpreter (ctypes with the audit hook off) creates a SysV shared-memory
    # segment, a semaphore set and a message queue, and keeps them (no IPC_RMID). In the box's
    # own IPC namespace they exist only as long as the box; the host's tables are unchanged.
    code = ("import ctypes\nlibc = ctypes.CDLL(None)\n"
            "ids = [libc.shmget(0, 1 << 16, 0o1666), libc.semget(0, 1, 0o1666), libc.msgget(0, 0o1666)]\n"
            "print(3 if min(ids) >= 0 else -1)\n")
    before = _sysv_ipc()
    report = run_tests(code, IO1, audit=False)
    new = {k: v - before[k] for k, v in _sysv_ipc().items() if v - before[k]}
    assert not new, new
    assert report.n_passed == 1, report.tests  # the calls themselves work inside the box
    if sandbox.isolation().root:
        assert "ipcns" in report.isolation, report.isolation


def test_cgroup_or_fallback_warning_once_and_limits_hold(caplog):
    # Where the machine delegates a cgroup v2 subtree with the memory and pids controllers,
    # each box gets its own cgroup; otherwise the sandbox falls back to per-process rlimits and
    # says so ONCE (a logged warning). Either way the limits below hold.
    sandbox.cgroup_support.cache_clear()
    caplog.set_level(logging.INFO, logger=LOGGER)
    support = sandbox.cgroup_support()
    mem_task = task_from_meta({"tests": {"io": [{"stdin": "", "stdout": "3\n"}]}, "memory_limit_mb": 64})
    bomb = run_tests("x = bytearray(256 * 1024 * 1024)\nx[::4096] = b'1' * len(x[::4096])\nprint(3)\n", mem_task)
    many = run_tests("import os, time\nn = 0\nfor _ in range(64):\n    try:\n        pid = os.fork()\n"
                     "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
                     "    n += 1\nprint(3 if n > 8 else -1)\n", IO1, audit=False)
    sandbox.cgroup_support()
    records = [r for r in caplog.records if r.name == LOGGER and "cgroup" in r.getMessage()]
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    if support.available:
        assert "cgroup" in bomb.isolation and not warnings, (bomb.isolation, warnings)
    else:
        assert support.reason
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        # one short line on every run that scores code (it was a 400-character paragraph); the reason at INFO
        line = warnings[0].getMessage()
        assert "rlimit" in line and sandbox.CGROUP_ENV in line and "\n" not in line and len(line) <= 120, line
        assert [r.getMessage() for r in records if r.levelno == logging.INFO and support.reason in r.getMessage()]
        assert "cgroup" not in bomb.isolation
    assert bomb.tests[0].status in (TestStatus.ERROR, TestStatus.KILLED), bomb.tests
    assert many.tests[0].status is TestStatus.FAILED, many.tests  # forked at most 8 children


def test_box_cgroup_files(tmp_path, monkeypatch):
    # The cgroup a box gets, on a stand-in directory (cgroupfs files are plain files here): the
    # limits are written where the kernel reads them, the kill goes through cgroup.kill, and
    # the directory is removed (on cgroupfs rmdir works on a dir that "holds" these files).
    written = []
    write = sandbox._write
    monkeypatch.setattr(sandbox, "_write", lambda path, text: (written.append((path.name, text)), write(path, text)))
    limits = SandboxLimits(memory_mb=64, max_processes=8)
    cg = sandbox.BoxCgroup.create(tmp_path, "rlvr-box-test", limits, controllers=("cpu", "memory", "pids"))
    d = tmp_path / "rlvr-box-test"
    assert cg.path == d
    assert (d / "memory.max").read_text() == str(64 << 20)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "memory.oom.group").read_text() == "1"
    assert (d / "pids.max").read_text() == "10"  # + the relay and the pid namespace's reaper
    assert (d / "cpu.max").read_text() == "100000 100000"  # one CPU per box
    (d / "cgroup.procs").write_text("")
    (d / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert cg.close() == 0
    assert ("cgroup.kill", "1") in written and not d.exists()


def test_stderr_flood_cut_at_the_source():
    # 200 MB on stderr: the grader keeps 8 KiB and discards the rest in the kernel (splice to
    # /dev/null), so neither its Python heap nor its resident memory grows with the flood.
    code = "import os\nchunk = b'x' * (1 << 20)\nfor _ in range(200):\n    os.write(2, chunk)\nprint(3)\n"
    limits = SandboxLimits(wall_s=20.0, cpu_s=20)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        box = Box(code)
        try:
            (r,) = run_processes([{"box": box, "mode": "script", "limits": limits, "stdin": b""}], limits.wall_s)
        finally:
            box.close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert r.returncode == 0 and r.stdout == b"3\n", (r.returncode, r.killed, r.stdout[:100])
    assert len(r.stderr) == sandbox.STDERR_CAP
    assert r.stderr_bytes == 200 << 20  # all of it was written, and counted
    assert peak < 4 << 20, peak  # Python allocations during the run
    assert (rss1 - rss0) * 1024 < 32 << 20, (rss0, rss1)  # ru_maxrss is in KiB


def test_io_per_test_limit_counts_from_the_candidate_start():
    # The 1 s startup allowance is for the interpreter and the confinement only: a script that
    # runs 1.5x its limit times out even though limit + allowance would have covered it.
    task = task_from_meta({"tests": {"io": [{"stdin": "", "stdout": "3\n"}]}, "time_limit_s": 0.4})
    slow = run_tests("import time\ntime.sleep(0.6)\nprint(3)\n", task)
    fast = run_tests("import time\ntime.sleep(0.1)\nprint(3)\n", task)
    assert slow.tests[0].status is TestStatus.TIMEOUT, slow.tests
    assert fast.n_passed == 1, fast.tests


def test_calls_timeout_answer_is_a_timeout_verdict():
    # CPU-bound Python in one call is interrupted by the per-call alarm; the calls after it run
    # (the process survives) and pass.
    meta = {"entry_point": "f", "tests": {"calls": [{"args": [1], "expected": 1}, {"args": [0], "expected": 0}]},
            "time_limit_s": 0.3}
    t0 = time.monotonic()
    report = run_tests("def f(x):\n    while x:\n        pass\n    return x\n", task_from_meta(meta))
    assert [t.status for t in report.tests] == [TestStatus.TIMEOUT, TestStatus.PASSED], report.tests
    assert time.monotonic() - t0 < 5.0


def test_non_x86_64_warns_loudly(monkeypatch, caplog):
    import platform

    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    sandbox.isolation.cache_clear()
    try:
        iso = sandbox.isolation()
    finally:
        sandbox.isolation.cache_clear()
    assert not iso.seccomp and not iso.strong
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert any("AF_VSOCK" in m and "aarch64" in m for m in msgs), msgs


def test_box_joins_its_cgroup_first(tmp_path, monkeypatch):
    # The cgroup path as the harness sees it, on a stand-in directory (this machine may have no
    # delegated cgroup v2): the harness writes its own pid to the box's cgroup.procs before
    # anything else (so every process of the box is in it), reports "cgroup", and the box's
    # cgroup is gone after close. (pids/populated are stubbed: the stand-in has no kernel behind it.)
    base = tmp_path / "cg"
    base.mkdir()
    os.chmod(tmp_path, 0o755)
    monkeypatch.setattr(sandbox, "cgroup_support",
                        lambda: sandbox.CgroupSupport(True, base, ("cpu", "memory", "pids")))
    create = sandbox.BoxCgroup.create

    def create_with_procs_file(*args, **kwargs):  # cgroupfs has it; the harness never creates it
        cg = create(*args, **kwargs)
        (cg.path / "cgroup.procs").write_text("")
        return cg

    monkeypatch.setattr(sandbox.BoxCgroup, "create", create_with_procs_file)
    monkeypatch.setattr(sandbox.BoxCgroup, "pids", lambda self: [])
    monkeypatch.setattr(sandbox.BoxCgroup, "_populated", lambda self: False)
    limits = SandboxLimits(wall_s=10.0, test_s=5.0)
    box = Box("print(3)\n")
    try:
        (r,) = run_processes([{"box": box, "mode": "script", "limits": limits, "stdin": b"", "per_test": "start"}],
                             limits.wall_s)
        cg = box.cgroup.path
        joined = (cg / "cgroup.procs").read_text().split()
        assert r.stdout == b"3\n" and r.isolation.split(",")[0] == "cgroup", (r.stdout, r.isolation, r.stderr)
        assert len(joined) == 1 and int(joined[0]) == r.pid
        assert (cg / "pids.max").read_text() == "10" and (cg / "memory.max").read_text() == str(256 << 20)
    finally:
        box.close()
    assert not cg.exists() and not list(base.iterdir())
