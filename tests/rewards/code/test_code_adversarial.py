"""Adversarial suite: hostile candidate programs against the code sandbox.

Each case asserts the expected outcome (status, no pass, which integrity flag), that the runner
came back within its limits, and, at the end, that the machine is clean: no process of a sandbox
uid, no sandbox temp dir, none of the files the candidates tried to create. The cases run in a
thread pool (each candidate is its own sandboxed process group), so the suite takes seconds.

Several cases also run with the audit hook OFF (`audit=False`) to show that the kernel
confinement (uid, Landlock, seccomp, namespaces, cgroup or rlimits) holds on its own: the hook
only flags.

A module-level fixture snapshots the machine before the first test and checks it after the
last: no new SysV IPC object (shm, sem, msg), no box directory with the sandbox's prefix, no
child process of this test process, no process of this run's sandbox uids.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import REPO

from rlvr.rewards.code import sandbox
from rlvr.rewards.code.rewards import code_reward
from rlvr.rewards.code.runner import TestStatus, run_tests
from rlvr.rewards.code.sandbox import UID_SLOTS, isolation
from rlvr.rewards.code.task import task_from_meta
from rlvr.rewards.types import SimpleExample, Status

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")

RUN = {"uid_base": 200_000 + secrets.randbelow(1000) * UID_SLOTS}  # this run's private uid range
SECRET = "expected-" + secrets.token_hex(8)  # lives only in the grader's memory and environment
os.environ["RLVR_TEST_EXPECTED_OUTPUT"] = SECRET
GRADER_SECRET_FILE = Path("/tmp") / f"rlvr_hidden_tests_{secrets.token_hex(4)}.json"
PWNED = [Path("/tmp/rlvr_pwned_tmp"), Path("/root/rlvr_pwned_home"), REPO / "rlvr_pwned_repo"]

IO1_TASK = task_from_meta({"tests": {"io": [{"stdin": "1 2\n", "stdout": "3\n"}]}, "time_limit_s": 0.5})
MEM_TASK = task_from_meta({"tests": {"io": [{"stdin": "1 2\n", "stdout": "3\n"}]}, "time_limit_s": 1.0,
                           "memory_limit_mb": 64})
IO_TASK = task_from_meta({"tests": {"io": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 7\n", "stdout": "12\n"}]},
                          "time_limit_s": 1.0})
SECRET_TASK = task_from_meta({"tests": {"io": [{"stdin": "", "stdout": SECRET + "\n"}]}, "time_limit_s": 1.0})
EMPTY_TASK = task_from_meta({"tests": {"io": [{"stdin": "anything\n", "stdout": ""}]}, "time_limit_s": 1.0})
CALL_TASK = task_from_meta({"entry_point": "add", "tests": {"calls": [{"args": [1, 2], "expected": 3},
                                                                       {"args": [5, 7], "expected": 12}]},
                            "time_limit_s": 1.0})
ASSERT_TASK = task_from_meta({"entry_point": "add", "tests": {"asserts": ["assert add(1, 2) == 3",
                                                                          "assert add(5, 7) == 12"]},
                              "time_limit_s": 1.0})

# Per-test time limits: three tests, the middle one sleeps 1.5x the limit, the others are instant.
# Pooled per process (the old behaviour) the slow one passed: the process had 3 x limit.
SLOW_MID_CALLS = task_from_meta({"entry_point": "f", "tests": {"calls": [{"args": [0], "expected": 0},
                                                                          {"args": [1], "expected": 1},
                                                                          {"args": [2], "expected": 2}]},
                                 "time_limit_s": 0.5})
SLOW_MID_ASSERTS = task_from_meta({"entry_point": "f", "tests": {"asserts": ["assert f(0) == 0", "assert f(1) == 1",
                                                                            "assert f(2) == 2"]},
                                   "time_limit_s": 0.5})
SLOW_MID_CODE = "import time\ndef f(x):\n    if x == 1:\n        time.sleep(0.75)\n    return x\n"
# The same, for a candidate that turns the in-process alarm off: the grader's per-answer
# deadline (limit + 0.25 s) still ends the slow call (and, the process being gone, the ones
# after it); in assert tests the check process's own alarm ends the test.
SLOW_MID_NO_ALARM = ("import signal, time\ndef f(x):\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                     "    if x == 1:\n        time.sleep({})\n    return x\n")
# ... and one that swallows the alarm's exception and returns late: the harness times the call.
SLOW_MID_CATCH = ("import time\ndef f(x):\n    t = time.monotonic()\n    while x == 1 and time.monotonic() - t < 0.6:\n"
                  "        try:\n            time.sleep(0.6 - (time.monotonic() - t))\n        except BaseException:\n"
                  "            pass\n    return x\n")
SLOW_IO_TASK = task_from_meta({"tests": {"io": [{"stdin": "0\n", "stdout": "0\n"}, {"stdin": "1\n", "stdout": "1\n"},
                                                {"stdin": "2\n", "stdout": "2\n"}]}, "time_limit_s": 0.5})
SLOW_IO_CODE = "import time\nx = int(input())\nif x == 1:\n    time.sleep(0.75)\nprint(x)\n"
FLOOD_TASK = task_from_meta({"tests": {"io": [{"stdin": "", "stdout": "3\n"}]}, "time_limit_s": 5.0})
# SysV IPC through raw syscalls (the hook would flag ctypes): in the box's own IPC namespace
# they succeed, and every object vanishes with the box (checked by the module fixture).
SYSV_IPC_CODE = ("import ctypes\nlibc = ctypes.CDLL(None)\n"
                 "ids = [libc.shmget(0, 4096, 0o1666), libc.semget(0, 1, 0o1666), libc.msgget(0, 0o1666)]\n"
                 "print(3 if min(ids) >= 0 else -1)\n")
# Forks as many sleeping children as it can and prints 3 only if it got more than the box's
# process limit (8): a pass would mean the pids limit (cgroup, or RLIMIT_NPROC) did not hold.
MANY_PROCS_CODE = ("import os, time\nn = 0\nfor _ in range(64):\n    try:\n        pid = os.fork()\n"
                   "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
                   "    n += 1\nprint(3 if n > 8 else -1)\n")

GOOD_SCRIPT = "a, b = map(int, input().split())\nprint(a + b)\n"
GOOD_FUNC = "def add(a, b):\n    return a + b\n"

# (name, task, code, expectation). Expectation keys: status (every test), flags (must include),
# audit (False: hook off), passed (number of passed tests, default 0).
CASES = [
    ("infinite_loop", IO1_TASK, "while True:\n    pass\n", {"status": TestStatus.TIMEOUT}),
    ("sleep_forever", IO1_TASK, "import time\ntime.sleep(1000)\n", {"status": TestStatus.TIMEOUT}),
    ("cpu_limit_raise_attempt", IO1_TASK,
     "import resource\ntry:\n    resource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))\nexcept Exception:\n"
     "    pass\nwhile True:\n    pass\n", {"status": TestStatus.TIMEOUT}),
    ("fork_bomb", IO1_TASK,
     "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
     {"status": TestStatus.TIMEOUT, "flags": {"process_spawn"}}),
    ("fork_bomb_no_hook", IO1_TASK,
     "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
     {"status": TestStatus.TIMEOUT, "audit": False}),
    ("thread_bomb", IO_TASK,
     "import threading, time\n"
     "ts = [threading.Thread(target=time.sleep, args=(100,), daemon=True) for _ in range(10000)]\n"
     "for t in ts:\n    t.start()\n", {"status": TestStatus.ERROR}),
    ("memory_bomb", MEM_TASK, "x = bytearray(8 * 1024 ** 3)\nprint(3)\n", {"status": TestStatus.ERROR}),
    ("memory_creep", MEM_TASK, "a = []\nwhile True:\n    a.append(' ' * 10 ** 7)\n", {"status": TestStatus.ERROR}),
    ("gigabyte_output", IO_TASK, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
     {"status": TestStatus.KILLED}),
    ("gigabyte_stderr", IO_TASK,
     "import sys\nfor _ in range(512):\n    sys.stderr.write('x' * 65536)\nprint(3)\n", {"passed": 1}),
    ("disk_fill", IO_TASK, "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))\n",
     {"status": TestStatus.ERROR}),
    ("read_hidden_tests_repo", IO_TASK,
     f"print(open({str(REPO / 'rlvr/assets/code_tasks/tasks.jsonl')!r}).read()[:10])\n",
     {"status": TestStatus.ERROR, "flags": {"file_read_outside"}}),
    ("read_grader_file_no_hook", IO_TASK, f"print(open({str(GRADER_SECRET_FILE)!r}).read())\n",
     {"status": TestStatus.ERROR, "audit": False}),
    ("read_repo_no_hook", IO_TASK, f"print(open({str(REPO / 'pyproject.toml')!r}).read()[:10])\n",
     {"status": TestStatus.ERROR, "audit": False}),
    ("symlink_out", IO_TASK, f"import os\nos.symlink({str(REPO)!r}, 'l')\nprint(open('l/pyproject.toml').read())\n",
     {"status": TestStatus.ERROR, "flags": {"file_read_outside"}}),
    ("os_system_curl", IO_TASK, "import os\nos.system('curl http://example.com')\nprint(3)\n",
     {"status": TestStatus.ERROR, "flags": {"subprocess"}}),
    ("subprocess_popen", IO_TASK, "import subprocess\nsubprocess.run(['ls', '/'])\n",
     {"status": TestStatus.ERROR, "flags": {"subprocess"}}),
    ("socket_connect", IO_TASK,
     "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('1.1.1.1', 80))\nprint(3)\n",
     {"status": TestStatus.ERROR, "flags": {"network"}}),
    ("socket_connect_no_hook", IO_TASK,
     "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('1.1.1.1', 80))\nprint(3)\n",
     {"status": TestStatus.ERROR, "audit": False}),
    ("vsock_no_hook", IO_TASK, "import socket\ns = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\nprint(3)\n",
     {"status": TestStatus.ERROR, "audit": False}),
    ("write_home_and_tmp", IO_TASK,
     "for p in " + repr([str(p) for p in PWNED]) + ":\n    try:\n        open(p, 'w').write('x')\n"
     "    except OSError:\n        pass\nprint(3)\n", {"passed": 1, "flags": {"file_write_outside"}}),
    ("write_outside_no_hook", IO_TASK,
     "for p in " + repr([str(p) for p in PWNED]) + ":\n    try:\n        open(p, 'w').write('x')\n"
     "    except OSError:\n        pass\nprint(3)\n", {"passed": 1, "audit": False}),
    ("alter_own_code", IO_TASK, "import os\nopen(os.path.abspath(__file__), 'w')\n",
     {"status": TestStatus.ERROR, "flags": {"file_write_outside"}}),
    # The grader is this test process; the candidate is told its pid. In the box's pid
    # namespace that pid does not exist (or is not the grader); seccomp and the hook deny it too.
    ("kill_grader", IO_TASK, f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nprint(3)\n",
     {"status": TestStatus.ERROR, "flags": {"signal_outside"}}),
    ("kill_grader_no_hook", IO_TASK, f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nprint(3)\n",
     {"status": TestStatus.ERROR, "audit": False}),
    # Its parent inside the box is the namespace's reaper (pid 1), which ignores the signal:
    # harmless, so neither flagged nor an error.
    ("kill_parent_in_box", IO_TASK, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(3)\n",
     {"passed": None}),
    ("kill_everything_no_hook", IO_TASK, "import os\nos.kill(-1, 9)\nprint(3)\n", {"audit": False,
                                                                                  "passed": None}),
    ("env_secret", SECRET_TASK, "import os\nprint(os.environ.get('RLVR_TEST_EXPECTED_OUTPUT', 'none'))\n",
     {"status": TestStatus.FAILED}),
    ("proc_parent_environ", SECRET_TASK, "import os\nprint(open(f'/proc/{os.getppid()}/environ').read())\n",
     {"status": TestStatus.ERROR, "flags": {"file_read_outside"}}),
    ("scan_open_fds", SECRET_TASK,
     "import os\nfound = b''\nfor fd in range(3, 256):\n    try:\n        found += os.read(fd, 4096)\n"
     "    except OSError:\n        pass\nprint(found.decode(errors='replace'))\n", {"status": TestStatus.FAILED}),
    ("ctypes_libc", IO_TASK, "import ctypes\nlibc = ctypes.CDLL(None)\nprint(3)\n",
     {"status": TestStatus.ERROR, "flags": {"ctypes"}}),
    ("setsid_daemon", IO_TASK,
     "import os, time\nif os.fork() == 0:\n    try:\n        os.setsid()\n    except OSError:\n        pass\n"
     "    time.sleep(60)\nprint(3)\n", {"passed": 1}),
    ("crash_on_empty_expected", EMPTY_TASK, "raise SystemExit(1)\n", {"status": TestStatus.ERROR}),
    ("exception_on_empty_expected", EMPTY_TASK, "1 / 0\n", {"status": TestStatus.ERROR}),
    ("exit_before_asserts", ASSERT_TASK, "import sys\nsys.exit(0)\n",
     {"status": TestStatus.ERROR, "flags": {"exit_during_import"}}),
    ("os_exit_before_asserts", ASSERT_TASK, "import os\nos._exit(0)\n",
     {"status": TestStatus.ERROR, "flags": {"harness_bypassed"}}),
    ("monkeypatch_json", CALL_TASK,
     "import json\njson.dumps = lambda *a, **k: '{\"ok\": true, \"value\": 3}'\ndef add(a, b):\n    return 0\n",
     {"status": TestStatus.FAILED, "flags": {"harness_tamper"}}),
    ("always_equal_object", CALL_TASK,
     "class E:\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return E()\n",
     {"status": TestStatus.ERROR}),
    ("int_subclass_eq", CALL_TASK,
     "class I(int):\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return I(0)\n",
     {"status": TestStatus.FAILED}),
    ("always_equal_in_asserts", ASSERT_TASK,
     "class E:\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return E()\n",
     {"status": TestStatus.ERROR}),
    ("forge_verdicts_everywhere", ASSERT_TASK,
     "import os, json\nline = json.dumps({'nonce': 'x', 'i': 0, 'status': 'passed'}) + '\\n'\n"
     "for fd in range(1, 64):\n    try:\n        os.write(fd, line.encode())\n    except OSError:\n        pass\n"
     "def add(a, b):\n    return 0\n", {}),
    ("override_assertion_error", ASSERT_TASK,
     "import builtins\nbuiltins.AssertionError = ZeroDivisionError\ndef add(a, b):\n    return 0\n",
     {"status": TestStatus.FAILED}),
    ("gc_dig_for_tests", ASSERT_TASK,
     "import gc\nleak = [o for o in gc.get_objects() if isinstance(o, str) and 'assert' in o]\n"
     "def add(a, b):\n    return 0\n", {"status": TestStatus.FAILED, "flags": {"introspection"}}),
    # Raw syscalls through ctypes with the hook OFF: each prints the answer (3) only if the
    # syscall succeeded, so a pass would mean an escape. The kernel layers must say no.
    ("ctypes_socket_inet_no_hook", IO1_TASK,
     "import ctypes\nfd = ctypes.CDLL(None).socket(2, 1, 0)\nprint(3 if fd >= 0 else -1)\n",
     {"status": TestStatus.FAILED, "audit": False}),
    ("ctypes_socket_vsock_no_hook", IO1_TASK,
     "import ctypes\nfd = ctypes.CDLL(None).socket(40, 1, 0)\nprint(3 if fd >= 0 else -1)\n",
     {"status": TestStatus.FAILED, "audit": False}),
    ("ctypes_open_repo_no_hook", IO1_TASK,
     f"import ctypes\nfd = ctypes.CDLL(None).open({str(REPO / 'pyproject.toml').encode()!r}, 0)\n"
     "print(3 if fd >= 0 else -1)\n", {"status": TestStatus.FAILED, "audit": False}),
    ("ctypes_ptrace_parent_no_hook", IO1_TASK,
     "import ctypes, os\nr = ctypes.CDLL(None).ptrace(16, os.getppid(), 0, 0)\nprint(3 if r == 0 else -1)\n",
     {"status": TestStatus.FAILED, "audit": False}),
    ("ctypes_setsid_no_hook", IO1_TASK,
     # in a child (a group leader cannot setsid anyway): success would leave the process group
     "import ctypes, os\npid = os.fork()\nif pid == 0:\n    os._exit(0 if ctypes.CDLL(None).setsid() >= 0 else 1)\n"
     "print(3 if os.waitpid(pid, 0)[1] == 0 else -1)\n",
     {"status": TestStatus.FAILED, "audit": False}),
    ("ctypes_unshare_userns_no_hook", IO1_TASK,
     "import ctypes\nr = ctypes.CDLL(None).unshare(0x10000000)\nprint(3 if r == 0 else -1)\n",
     {"status": TestStatus.FAILED, "audit": False}),
    ("ctypes_io_uring_no_hook", IO1_TASK,
     "import ctypes\nbuf = ctypes.create_string_buffer(120)\nr = ctypes.CDLL(None).syscall(425, 4, buf)\n"
     "print(3 if r >= 0 else -1)\n", {"status": TestStatus.FAILED, "audit": False}),
    ("ctypes_kill_all_no_hook", IO1_TASK,
     "import ctypes\nr = ctypes.CDLL(None).kill(-1, 0)\nprint(3 if r == 0 else -1)\n",
     {"status": TestStatus.FAILED, "audit": False}),
    ("exec_shell_no_hook", IO1_TASK,  # /bin/sh would print the answer if exec were allowed
     "import os\ntry:\n    os.execv('/bin/sh', ['sh', '-c', 'echo 3'])\nexcept OSError:\n    print(-1)\n",
     {"status": TestStatus.FAILED, "audit": False}),
    ("recursion", IO_TASK, "def f(n):\n    return f(n + 1)\nf(0)\n", {"status": TestStatus.ERROR}),
    # Right output, then a non-daemon thread that never ends: as a script it would never exit.
    ("lingering_thread", IO1_TASK,
     "import threading, time\nprint(3)\nthreading.Thread(target=time.sleep, args=(1000,)).start()\n",
     {"status": TestStatus.TIMEOUT}),
    ("lingering_thread_no_hook", IO1_TASK,
     "import threading, time\nprint(3, flush=True)\nthreading.Thread(target=time.sleep, args=(1000,)).start()\n",
     {"status": TestStatus.TIMEOUT, "audit": False}),
    # ... whereas a daemon thread does not keep a script alive, and a non-daemon thread that
    # finishes is waited for (its output counts, as when run as a script).
    ("lingering_daemon_thread", IO1_TASK,
     "import threading, time\nthreading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\nprint(3)\n",
     {"passed": 1}),
    ("thread_prints_answer_late", IO1_TASK,
     "import threading, time\ndef late():\n    time.sleep(0.1)\n    print(3)\n"
     "threading.Thread(target=late).start()\n", {"passed": 1}),
    ("sysv_ipc_no_hook", IO1_TASK, SYSV_IPC_CODE, {"passed": None, "audit": False}),
    ("per_test_limit_calls", SLOW_MID_CALLS, SLOW_MID_CODE,
     {"statuses": [TestStatus.PASSED, TestStatus.TIMEOUT, TestStatus.PASSED]}),
    ("per_test_limit_asserts", SLOW_MID_ASSERTS, SLOW_MID_CODE,
     {"statuses": [TestStatus.PASSED, TestStatus.TIMEOUT, TestStatus.PASSED]}),
    ("per_test_limit_io", SLOW_IO_TASK, SLOW_IO_CODE,
     {"statuses": [TestStatus.PASSED, TestStatus.TIMEOUT, TestStatus.PASSED]}),
    ("per_test_limit_calls_alarm_off", SLOW_MID_CALLS, SLOW_MID_NO_ALARM.format(3.0),
     {"statuses": [TestStatus.PASSED, TestStatus.TIMEOUT, TestStatus.TIMEOUT], "audit": False}),
    # (None: the third test's verdict depends on scheduling, not on the limit being enforced)
    ("per_test_limit_calls_alarm_caught", SLOW_MID_CALLS, SLOW_MID_CATCH,
     {"statuses": [TestStatus.PASSED, TestStatus.TIMEOUT, None], "passed": None, "audit": False}),
    ("per_test_limit_asserts_alarm_off", SLOW_MID_ASSERTS, SLOW_MID_NO_ALARM.format(0.75),
     {"statuses": [TestStatus.PASSED, TestStatus.TIMEOUT, None], "passed": None, "audit": False}),
    ("many_processes_no_hook", IO1_TASK, MANY_PROCS_CODE, {"status": TestStatus.FAILED, "audit": False}),
    ("stderr_flood_200mb", FLOOD_TASK,
     "import os\nchunk = b'x' * (1 << 20)\nfor _ in range(200):\n    os.write(2, chunk)\nprint(3)\n", {"passed": 1}),
]


def _ipc_objects() -> set[tuple[str, str, int]]:
    """(kind, id, creator uid) of every SysV IPC object of the host's IPC namespace."""
    objs = set()
    for kind in ("shm", "sem", "msg"):
        try:
            header, *rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except OSError:
            continue
        cols = header.split()
        for row in rows:
            fields = dict(zip(cols, row.split(), strict=False))
            objs.add((kind, fields[cols[1]], int(fields["cuid"])))
    return objs


def _ours(uid: int) -> bool:
    """Created by this run: a uid of this run's private slot range (as root), or ours (not root)."""
    if isolation().root:
        return RUN["uid_base"] <= uid < RUN["uid_base"] + UID_SLOTS
    return uid == os.getuid()


def _children() -> set[int]:
    """Processes whose parent is this test process (a box's harness not waited for)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                out.add(int(entry))
    return out


def _box_dirs() -> set[str]:
    """Box directories (sandbox prefix rlvr-sbx-<uid>-) of this run's uids in the temp dirs."""
    out = set()
    for d in {Path("/tmp"), Path(tempfile.gettempdir())} | ({RUN["tmp"]} if "tmp" in RUN else set()):
        for p in d.glob("rlvr-sbx-*"):
            try:
                uid = int(p.name.split("-")[2])
            except (IndexError, ValueError):
                continue
            if _ours(uid):
                out.add(str(p))
    return out


def _machine_state() -> dict:
    return {"ipc": {o for o in _ipc_objects() if _ours(o[2])}, "children": _children(), "boxes": _box_dirs(),
            "cgroups": set(sandbox.live_box_cgroups())}


def _assert_machine_clean(before: dict) -> None:
    after = {}
    for _ in range(40):  # the kernel frees a dead box's namespaces asynchronously: allow ~1 s
        after = _machine_state()
        if all(not (after[k] - before[k]) for k in after):
            return
        time.sleep(0.025)
    assert {k: after[k] - before[k] for k in after if after[k] - before[k]} == {}


@pytest.fixture(scope="module", autouse=True)
def machine_clean_after_module():
    """Before/after snapshot of what a box could leave behind (checked at the end of the module)."""
    before = _machine_state()
    RUN["before"] = before
    yield
    _assert_machine_clean(before)


def _run_case(case):
    name, task, code, exp = case
    t0 = time.monotonic()
    report = run_tests(code, task, audit=exp.get("audit", True))
    return name, report, time.monotonic() - t0


@pytest.fixture(scope="module")
def outcomes():
    GRADER_SECRET_FILE.write_text(f'{{"expected": "{SECRET}"}}')
    os.chmod(GRADER_SECRET_FILE, 0o600)
    # This run's boxes live in a private temp dir and use a private uid range, so the
    # "machine left clean" check sees only what this run created (another run may be going on).
    # (Not under pytest's tmp_path: /tmp/pytest-of-root is 0700, the slot uids could not enter.)
    RUN["tmp"] = Path(tempfile.mkdtemp(prefix="rlvr-adversarial-"))
    os.chmod(RUN["tmp"], 0o755)
    saved = tempfile.tempdir, sandbox.UID_BASE
    tempfile.tempdir, sandbox.UID_BASE = str(RUN["tmp"]), RUN["uid_base"]
    try:
        # The benign candidates run CONCURRENTLY with the hostile ones: a kill(-1) or fork bomb
        # in one box must not disturb another.
        benign = [("benign_io", IO_TASK, GOOD_SCRIPT, {"passed": 2}),
                  ("benign_call", CALL_TASK, GOOD_FUNC, {"passed": 2}),
                  ("benign_assert", ASSERT_TASK, GOOD_FUNC, {"passed": 2})]
        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(_run_case, benign + CASES + benign))
    finally:
        GRADER_SECRET_FILE.unlink()
        tempfile.tempdir, sandbox.UID_BASE = saved
    yield {n + ("#2" if n in {r[0] for r in results[:i]} else ""): (rep, dt)
           for i, (n, rep, dt) in enumerate(results)}
    shutil.rmtree(RUN["tmp"], ignore_errors=True)


def test_suite_is_big_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_adversary_contained(outcomes, case):
    name, task, _code, exp = case
    report, dt = outcomes[name]
    n = task.n_tests
    # Never hangs the runner beyond its limits: per process wall = time_limit + 1 s startup, io
    # tests run one after another. This is a liveness check, not a speed goal: the slack (10 s)
    # covers scheduling on a loaded 2-core machine; a hang would exceed it by far.
    assert dt < n * (task.time_limit_s + 1.0) + 10.0, dt
    want_passed = exp.get("passed", sum(s is TestStatus.PASSED for s in exp.get("statuses", ())))
    if want_passed is not None:
        assert report.n_passed == want_passed, [t.status for t in report.tests]
    if "statuses" in exp:
        got = [t.status if want is not None else None for t, want in zip(report.tests, exp["statuses"], strict=True)]
        assert got == exp["statuses"], [(t.status, t.detail) for t in report.tests]
    if "status" in exp:
        assert all(t.status is exp["status"] for t in report.tests), [(t.status, t.detail) for t in report.tests]
    names = {f.name for f in report.flags}
    assert exp.get("flags", set()) <= names, (names, report.flags)
    if exp.get("audit", True) is False:
        assert not names - {"leftover_processes"}, names  # the hook was off: nothing to flag


@pytest.mark.parametrize("name", ["benign_io", "benign_call", "benign_assert", "benign_io#2", "benign_call#2",
                                  "benign_assert#2"])
def test_benign_neighbours_unaffected_and_unflagged(outcomes, name):
    report, _ = outcomes[name]
    assert report.n_passed == 2 and not report.flags, (report.tests, report.flags)


def test_machine_left_clean(outcomes):
    _assert_machine_clean(RUN["before"])
    for p in PWNED:
        assert not p.exists(), p
    leftovers = list(RUN["tmp"].iterdir())
    assert not leftovers, leftovers
    if not isolation().root:
        return
    stray = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = open(f"/proc/{entry}/status").read()
            except OSError:
                continue
            uid = int(status.split("\nUid:")[1].split()[1])
            # A zombie is dead already (no code, no memory); init reaps it shortly.
            if RUN["uid_base"] <= uid < RUN["uid_base"] + UID_SLOTS and "State:\tZ" not in status:
                stray.append(status[:200])
    assert not stray, stray


def test_isolation_report_is_strong_as_root(outcomes):
    report, _ = outcomes["benign_io"]
    if isolation().root:
        for part in ("netns", "pidns", "ipcns", "tmpfs", "landlock", "seccomp"):
            assert part in report.isolation, report.isolation


def test_reward_zeroed_by_flag_and_reported():
    # A correct program that ALSO tries the network: tests pass (1.0) but the integrity flag
    # zeroes the reward under the default policy; parts keep both facts.
    code = ("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\nexcept OSError:\n"
            "    pass\na, b = map(int, input().split())\nprint(a + b)\n")
    meta = {"tests": {"io": [{"stdin": "1 2\n", "stdout": "3\n"}]}, "time_limit_s": 1.0}
    r = code_reward(f"```python\n{code}```", SimpleExample("", meta))
    assert r.parts["tests"] == 1.0 and r.parts["integrity"] == 0.0 and r.total == 0.0
    assert r.status is Status.CORRECT and "network" in r.info
