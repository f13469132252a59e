"""Code rewards: extraction rules, value codec and comparison, task validation, reward parts and
statuses, integrity policy, the non-root fallback, and the batch scorer."""

from __future__ import annotations

import math
import os
import secrets
import shutil
from pathlib import Path

import pytest
from helpers import REPO

from rlvr.rewards import get_reward_fn, score_batch
from rlvr.rewards.code import harness, sandbox
from rlvr.rewards.code.extract import extract_code, is_empty_program
from rlvr.rewards.code.rewards import code_all_or_nothing, code_format_reward, code_reward, make_code_reward
from rlvr.rewards.code.runner import TestStatus, run_tests
from rlvr.rewards.code.task import CodeTaskError, normalize_stdout, task_from_meta, values_equal
from rlvr.rewards.types import SimpleExample, Status

ADD_META = {"entry_point": "add", "tests": {"calls": [{"args": [1, 2], "expected": 3},
                                                      {"args": [2, 2], "expected": 4},
                                                      {"args": [0, 5], "expected": 5},
                                                      {"args": [-1, 1], "expected": 0}]}}


def block(code: str, tag: str = "python") -> str:
    return f"```{tag}\n{code}```"


# ---- extraction ---------------------------------------------------------------------------


def test_extract_last_python_block_wins():
    r = "draft:\n```python\nx = 1\n```\nfinal:\n```python\nx = 2\n```\n"
    assert extract_code(r) == "x = 2\n"


def test_extract_prefers_tagged_over_untagged_and_ignores_other_languages():
    r = "```\nuntagged = 1\n```\n```bash\nrm -rf /\n```\n```py\ntagged = 1\n```\n```\nlater = 1\n```"
    assert extract_code(r) == "tagged = 1\n"
    assert extract_code("```bash\necho hi\n```") is None
    assert extract_code("```\nx = 3\n```") == "x = 3\n"


def test_extract_unterminated_fence_gives_no_code():
    assert extract_code("```python\nprint(1)\n") is None
    assert extract_code("no code here") is None
    assert extract_code("inline ```python print(1)``` is not a block") is None


def test_extract_raw_and_caps():
    assert extract_code("print(1)", "raw") == "print(1)"
    assert extract_code(block("x = 1\n" * 10_000)) is None  # 60 000 chars > MAX_CODE_CHARS
    hostile = "```python\n" * 20_000  # many openings, no closing: linear pass, no code
    assert extract_code(hostile) is None


def test_empty_program_detection():
    assert is_empty_program("# nothing\n")
    assert is_empty_program('"""docstring"""\npass\n...\n')
    assert not is_empty_program("print()\n")
    assert not is_empty_program("def f(:\n")  # a syntax error is not "empty": it fails tests


# ---- codec and comparison ----------------------------------------------------------------


@pytest.mark.parametrize("value", [None, True, 3, -2**70, 1.5, float("inf"), "é", [1, [2]], (1, "a"),
                                   {1, 2}, frozenset({3}), {"k": [1, 2], 5: None}, b"\x00\xff"])
def test_codec_roundtrip_exact_types(value):
    got = harness.decode_value(harness.encode_value(value))
    assert got == value and type(got) is type(value)


def test_codec_rejects_objects_and_malformed():
    class E:
        def __eq__(self, other):
            return True

    with pytest.raises(TypeError):
        harness.encode_value(E())
    with pytest.raises(ValueError):
        harness.decode_value({"a": 1, "b": 2})
    with pytest.raises(ValueError):
        harness.decode_value({"__float__": "1e999"})  # only inf/-inf/nan are spelled as strings


def test_values_equal_rules():
    assert values_equal([1, 2], (1, 2))  # JSON has no tuples
    assert not values_equal(True, 1) and not values_equal(1, True)  # bool is not int
    assert not values_equal(2.0, 2)  # an int expectation needs an int
    assert values_equal(2, 2.0)  # a float expectation accepts an equal int
    assert values_equal(0.1 + 0.2, 0.3)  # |0.30000000000000004 - 0.3| = 5.5e-17 < 1e-9
    assert not values_equal(0.3001, 0.3)  # relative error 3.3e-4 > 1e-6
    assert values_equal(float("nan"), math.nan)
    assert not values_equal({"a": 1}, {"a": 1, "b": 2})
    assert not values_equal("1", 1)


def test_normalize_stdout():
    assert normalize_stdout("1 2 \n3\n\n\n") == ["1 2", "3"]
    assert normalize_stdout("") == []
    assert normalize_stdout(" x") == [" x"]  # leading whitespace is significant


# ---- task validation ---------------------------------------------------------------------


@pytest.mark.parametrize("meta,key", [
    ({}, "meta['tests']"),
    ({"tests": {}}, "meta['tests']"),
    ({"tests": {"io": [{"stdin": "1"}]}}, "meta['tests']['io'][0]"),
    ({"tests": {"calls": [{"args": [1], "expected": 1}]}}, "meta['entry_point']"),
    ({"tests": {"io": [{"stdout": ""}]}, "time_limit_s": 0}, "meta['time_limit_s']"),
    ({"tests": {"io": [{"stdout": ""}]}, "language": "rust"}, "meta['language']"),
    ({"tests": {"unit": []}}, "meta['tests']"),
])
def test_task_errors_name_the_key(meta, key):
    with pytest.raises(CodeTaskError, match=key.replace("[", r"\[").replace("]", r"\]")):
        task_from_meta(meta)


# ---- rewards -----------------------------------------------------------------------------


def test_fraction_all_or_nothing_and_parts():
    # add returns a+b except for a == 0 (then 0): tests 1, 2, 4 pass, test 3 (0+5) fails -> 3/4.
    code = "def add(a, b):\n    return 0 if a == 0 else a + b\n"
    ex = SimpleExample("", ADD_META)
    r = code_reward(block(code), ex)
    assert r.total == pytest.approx(0.75) and r.parts["tests"] == pytest.approx(0.75)
    assert r.parts["format"] == 1.0 and r.parts["integrity"] == 1.0 and r.status is Status.INCORRECT
    assert code_all_or_nothing(block(code), ex).total == 0.0
    good = code_all_or_nothing(block("def add(a, b):\n    return a + b\n"), ex)
    assert good.total == 1.0 and good.status is Status.CORRECT
    weighted = make_code_reward("fraction", "zero", format_weight=0.1)(block(code), ex)
    assert weighted.total == pytest.approx(0.85)  # 0.75 + 0.1 * 1.0


def test_unparsable_and_empty_program():
    ex = SimpleExample("", {"tests": {"io": [{"stdin": "x\n", "stdout": ""}]}})
    none = code_reward("I would print nothing.", ex)
    assert none.status is Status.UNPARSABLE and none.total == 0.0 and none.parts["format"] == 0.0
    # An empty program would "match" the empty expected output: it fails every test without running.
    empty = code_reward(block("# nothing to do\npass\n"), ex)
    assert empty.status is Status.INCORRECT and empty.total == 0.0 and empty.parts["format"] == 0.0
    assert code_reward(block("input()\n"), ex).total == 1.0  # a real program that prints nothing
    assert code_format_reward(block("x = 1\n"), ex).total == 1.0
    assert code_format_reward("no code", ex).total == 0.0


def test_bad_task_is_error_not_exception():
    r = code_reward(block("print(1)\n"), SimpleExample("", {"tests": {"calls": []}}))
    assert r.status is Status.ERROR and r.total == 0.0 and "meta['tests']" in r.info


def test_timeout_status_counted():
    ex = SimpleExample("", {"tests": {"io": [{"stdin": "", "stdout": "1\n"}]}, "time_limit_s": 0.3})
    r = code_reward(block("while True:\n    pass\n"), ex)
    assert r.status is Status.TIMEOUT and r.total == 0.0


def test_integrity_policy_report_keeps_score():
    code = "import gc\ngc.get_objects()\ndef add(a, b):\n    return a + b\n"
    ex = SimpleExample("", ADD_META)
    zero = code_reward(block(code), ex)
    report = make_code_reward(integrity="report")(block(code), ex)
    assert zero.total == 0.0 and zero.parts["tests"] == 1.0 and zero.parts["integrity"] == 0.0
    assert report.total == 1.0 and report.parts["integrity"] == 0.0 and "introspection" in report.info
    with pytest.raises(KeyError, match="known"):
        make_code_reward(integrity="ignore")


def test_registered_and_batch_scored_in_order():
    ex = SimpleExample("", ADD_META)
    responses = [block("def add(a, b):\n    return a + b\n"), "no code", block("def add(a, b):\n    return a * b\n")]
    rewards = score_batch("code", responses, [ex] * 3, workers=3)
    # a*b: 1*2=2 (want 3) no, 2*2=4 yes, 0*5=0 (want 5) no, -1*1=-1 (want 0) no -> 1/4
    assert [r.total for r in rewards] == [1.0, 0.0, 0.25]
    assert get_reward_fn("code_all_or_nothing") is code_all_or_nothing


def test_stdout_printing_in_function_tasks_does_not_corrupt_answers():
    code = "def add(a, b):\n    print('{\"ok\": true, \"value\": 99}')\n    return a + b\n"
    report = run_tests(code, task_from_meta(ADD_META))
    assert report.n_passed == 4 and "ok" in report.tests[0].stderr


def test_non_root_fallback(monkeypatch):
    # Simulated: the isolation probe says "not root", so no uid drop/mount namespace; Landlock,
    # seccomp and a user+network namespace still apply, and the report says isolation is weaker.
    weak = sandbox.Isolation(root=False, landlock_abi=sandbox.isolation().landlock_abi, seccomp=True,
                             strong=False, notes="NOT root")
    monkeypatch.setattr(sandbox, "isolation", lambda: weak)
    task = task_from_meta({"tests": {"io": [{"stdin": "1 2\n", "stdout": "3\n"}]}})
    good = run_tests("a, b = map(int, input().split())\nprint(a + b)\n", task)
    assert good.n_passed == 1 and "tmpfs" not in good.isolation
    leak = run_tests("print(open('/work/main/pyproject.toml').read())\n", task, audit=False)
    assert leak.tests[0].status is TestStatus.ERROR  # Landlock, not the audit hook, stopped it


def _run_bpf(prog, nr, args=(), arch=0xC000003E):
    """A tiny classic-BPF interpreter (ld abs word, jeq, jge, ret): an independent check of
    the filter's verdicts, without installing it."""
    import struct

    regs = [a & 0xFFFFFFFFFFFFFFFF for a in args] + [0] * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *regs)
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
        elif code == 0x15:
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:
            pc += 1 + (jt if acc >= k else jf)
        else:
            assert code == 0x06
            return k


def test_seccomp_verdicts():
    allow, eperm, eacces = 0x7FFF0000, 0x00050001, 0x0005000D
    prog = harness.build_seccomp_program(grader_pid=1000, own_pid=4242)
    assert len(prog) < 4096  # BPF_MAXINSNS
    assert _run_bpf(prog, 41, (1, 1, 0)) == allow  # socket(AF_UNIX)
    assert _run_bpf(prog, 41, (2, 1, 0)) == eacces  # socket(AF_INET)
    assert _run_bpf(prog, 41, (40, 1, 0)) == eacces  # socket(AF_VSOCK)
    assert _run_bpf(prog, 53, (10, 1, 0)) == eacces  # socketpair(AF_INET6)
    assert _run_bpf(prog, 101) == eperm  # ptrace
    assert _run_bpf(prog, 112) == eperm  # setsid
    assert _run_bpf(prog, 425) == eperm  # io_uring_setup
    assert _run_bpf(prog, 41 | 0x40000000, (2,)) == eperm  # x32 ABI alias
    assert _run_bpf(prog, 41, (2,), arch=0x40000003) == 0x80000000  # i386 -> kill the process
    assert _run_bpf(prog, 62, (-1, 9)) == eperm  # kill(-1): every process of the uid
    assert _run_bpf(prog, 62, (1000, 9)) == eperm  # kill(grader)
    assert _run_bpf(prog, 62, (-1000, 9)) == eperm  # kill(grader's group)
    assert _run_bpf(prog, 62, (-4242, 9)) == allow  # kill(own group)
    assert _run_bpf(prog, 62, (4243, 9)) == allow  # kill(a child): the kernel checks the uid
    assert _run_bpf(prog, 234, (1000, 1000, 9)) == eperm  # tgkill(grader)
    assert _run_bpf(prog, 200, (1000, 9)) == eperm  # tkill(grader)
    assert _run_bpf(prog, 0, (0,)) == allow  # read
    assert _run_bpf(prog, 59) == allow  # execve (Landlock limits what can be executed)


# A real unprivileged grader: as root, a helper process makes the interpreter reachable for
# uid 65534 (private mount namespace: tmpfs over the 0700 ancestor + read-only bind of Python),
# drops to 65534 and runs the sandbox from there. Everything the inner grader does is the
# non-root code path: no uid drop, user+network namespace, Landlock, seccomp.
_AS_NOBODY = r'''
import ctypes, os, sys, tempfile
exe, prefix, hide, inner = sys.argv[1:5]
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x00020000) == 0
libc.mount(None, b"/", None, 16384 | (1 << 18), None)
if hide:
    stash = tempfile.mkdtemp()
    assert libc.mount(prefix.encode(), stash.encode(), None, 4096 | 16384, None) == 0
    assert libc.mount(b"tmpfs", hide.encode(), b"tmpfs", 0, b"mode=0755") == 0
    os.makedirs(prefix, exist_ok=True)
    assert libc.mount(stash.encode(), prefix.encode(), None, 4096 | 16384, None) == 0
os.setgroups([]); os.setgid(65534); os.setuid(65534)
os.chdir("/tmp")
os.execve(exe, [exe, "-S", "-c", inner], {"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
'''

_INNER = r'''
import json, os, sys
sys.path[:0] = [REPO, SITE]
from rlvr.rewards.code.runner import run_tests
from rlvr.rewards.code.sandbox import isolation
from rlvr.rewards.code.task import task_from_meta
t = task_from_meta({"tests": {"io": [{"stdin": "1 2\n", "stdout": "3\n"}]}})
good = run_tests("a, b = map(int, input().split())\nprint(a + b)\n", t)
leak = run_tests(f"print(open({REPO + '/pyproject.toml'!r}).read()[:20])\n", t, audit=False)
kill = run_tests(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nprint(3)\n", t, audit=False)
net = run_tests("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\nprint(3)\n", t, audit=False)
print(json.dumps({"uid": os.getuid(), "strong": isolation().strong, "iso": good.isolation,
                  "good": good.n_passed, "leak": leak.tests[0].status.value, "kill": kill.tests[0].status.value,
                  "net": net.tests[0].status.value}))
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create the unprivileged grader")
def test_real_unprivileged_grader():
    import json
    import subprocess
    import sys

    repo = str(REPO)
    site = next(p for p in sys.path if p.endswith("site-packages"))
    exe, prefix = sandbox.interpreter()
    inner = f"REPO = {repo!r}\nSITE = {site!r}\n" + _INNER
    proc = subprocess.run([exe, "-I", "-S", "-c", _AS_NOBODY, exe, prefix, sandbox.hidden_ancestor() or "", inner],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["uid"] == 65534 and out["strong"] is False  # reported as weaker isolation
    assert out["good"] == 1
    assert "landlock" in out["iso"] and "seccomp" in out["iso"]
    assert "ipcns" in out["iso"] or "netns(userns)" not in out["iso"], out["iso"]  # IPC ns with the user ns
    assert out["leak"] == "error"  # Landlock denies the repo file
    assert out["kill"] == "error"  # same uid, yet the grader survived (pid ns, seccomp, Landlock scope)
    assert out["net"] == "error"  # network namespace (user ns) + seccomp


def test_stdlib_imports_work_inside_the_sandbox():
    # Honest programs use the standard library (incl. extension modules from lib-dynload and
    # multiprocessing's AF_UNIX sockets); the confinement must not break them. No site-packages.
    code = ("import math, collections, itertools, functools, heapq, bisect, re, json, random, string\n"
            "import fractions, decimal, datetime, statistics, array, struct, hashlib, socket\n"
            "a, b = socket.socketpair()\na.sendall(b'k')\nassert b.recv(1) == b'k'\n"
            "print(math.comb(5, 2), sorted(collections.Counter('aab').values()), heapq.nsmallest(1, [3, 1]))\n")
    report = run_tests(code, task_from_meta({"tests": {"io": [{"stdin": "", "stdout": "10 [1, 2] [1]\n"}]}}))
    assert report.n_passed == 1 and not report.flags, (report.tests, report.flags)


_DYING_GRADER = r'''
import sys
sys.path[:0] = [REPO, SITE]
from rlvr.rewards.code.runner import run_tests
from rlvr.rewards.code.task import task_from_meta
t = task_from_meta({"tests": {"io": [{"stdin": "", "stdout": "x\n"}]}, "time_limit_s": 20.0})
code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nprint('started', flush=True)\ntime.sleep(60)\n"
run_tests(code, t)
'''


def _sandbox_processes(base: int | None = None) -> list[str]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = open(f"/proc/{entry}/status").read()
            except OSError:
                continue
            uid = int(status.split("\nUid:")[1].split()[1])
            lo = sandbox.UID_BASE if base is None else base
            if lo <= uid < lo + sandbox.UID_SLOTS and "State:\tZ" not in status:
                out.append(entry)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="identifies sandbox processes by their slot uid")
def test_sandbox_dies_with_a_killed_grader(tmp_path):
    # A reward worker that hits its own timeout is SIGKILLed: nobody enforces the sandbox's wall
    # clock any more. The harness and its children carry PDEATHSIG=SIGKILL, so they die too.
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = str(REPO)
    site = next(p for p in sys.path if p.endswith("site-packages"))
    script = tmp_path / "grader.py"
    script.write_text(f"REPO = {repo!r}\nSITE = {site!r}\n" + _DYING_GRADER)
    # A private uid range (env read at import by the grader): only this test's boxes are counted.
    base = 300_000 + secrets.randbelow(1000) * sandbox.UID_SLOTS
    grader = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "RLVR_SANDBOX_UID_BASE": str(base)})
    try:
        for _ in range(200):  # wait until the candidate and its child run (as the slot uid)
            if len(_sandbox_processes(base)) >= 2:
                break
            time.sleep(0.05)
        assert len(_sandbox_processes(base)) >= 2
        grader.send_signal(signal.SIGKILL)
        grader.wait()
        for _ in range(40):
            if not _sandbox_processes(base):
                break
            time.sleep(0.05)
        assert not _sandbox_processes(base)
    finally:
        grader.kill()
        grader.wait()
        for pid in _sandbox_processes(base):  # only if the assertion above failed
            os.kill(int(pid), signal.SIGKILL)
        for d in Path("/tmp").glob("rlvr-sbx-*"):  # the killed grader could not remove its box
            main = d / "code" / "main.py"
            if main.exists() and "print('started', flush=True)" in main.read_text():
                subprocess.run(["rm", "-rf", str(d)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="identifies sandbox processes by their slot uid")
def test_through_killable_worker_pool():
    # isolate=True runs each reward call in the rewards layer's killable worker processes. A
    # worker killed at its deadline (1 s) takes its sandbox with it (PDEATHSIG), and the
    # verdict is a counted timeout, not a hang.
    import time

    ex = SimpleExample("", ADD_META)
    slow = SimpleExample("", {"tests": {"io": [{"stdin": "", "stdout": "x\n"}]}, "time_limit_s": 20.0})
    rewards = score_batch("code", [block("def add(a, b):\n    return a + b\n"), block("import time\ntime.sleep(60)\n")],
                          [ex, slow], workers=2, isolate=True, timeout_s=2.0)
    assert rewards[0].total == 1.0 and rewards[0].status is Status.CORRECT
    assert rewards[1].total == 0.0 and rewards[1].status is Status.TIMEOUT
    for _ in range(40):
        if not _sandbox_processes():
            break
        time.sleep(0.05)
    assert not _sandbox_processes()
    for d in Path("/tmp").glob("rlvr-sbx-*"):  # the killed worker could not remove its box
        main = d / "code" / "main.py"
        if main.exists() and main.read_text() == "import time\ntime.sleep(60)\n":
            shutil.rmtree(d, ignore_errors=True)


def test_slow_honest_program_times_out_without_integrity_flag():
    # A CPU-bound honest function hits the limit: a timeout, not an integrity violation.
    code = "def add(a, b):\n    while True:\n        a += 1\n"
    report = run_tests(code, task_from_meta({**ADD_META, "time_limit_s": 0.25}))
    assert [t.status for t in report.tests] == [TestStatus.TIMEOUT] * 4 and not report.flags


_SECCOMP_PROBE = r'''
import os, sys
ns = {"__name__": "harness"}
exec(open(sys.argv[1]).read(), ns)
assert ns["install_seccomp"](os.getppid(), os.getpid()) == "seccomp"
out = []
for pid in (-1, os.getppid(), os.getpid()):
    try:
        os.kill(pid, 0)  # signal 0: permission check only, nothing is delivered
        out.append("ok")
    except PermissionError:
        out.append("eperm")
print(",".join(out))
'''


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp filter is x86_64 only")
def test_seccomp_kill_rules_installed_for_real():
    # Installed in a throwaway process whose "grader" is this test process: kill(-1) and
    # kill(grader) fail with EPERM even for the same uid, kill(self) works.
    import subprocess

    exe, _ = sandbox.interpreter()
    out = subprocess.run([exe, "-I", "-S", "-c", _SECCOMP_PROBE, harness.__file__], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "eperm,eperm,ok", out.stderr


def test_honest_process_management_not_flagged():
    # Forking a worker and signalling it stays inside the box: no integrity flag.
    code = ("import os, signal, time\npid = os.fork()\nif pid == 0:\n    time.sleep(30)\n"
            "os.kill(pid, signal.SIGTERM)\nos.waitpid(pid, 0)\nprint(3)\n")
    report = run_tests(code, task_from_meta({"tests": {"io": [{"stdin": "", "stdout": "3\n"}]}}))
    assert report.n_passed == 1 and not report.flags, (report.tests, report.flags)


def test_raising_function_never_matches_empty_or_none_expectation():
    # The failure mode of verl's call-based wrapper (verl PR #7853): errors were caught and the
    # process exited 0, so `def solve(x): raise ValueError` earned 1.0 when the expected output
    # was "" or None. Here an exception is an error result, never a value.
    meta = {"entry_point": "solve", "tests": {"calls": [{"args": [1], "expected": ""},
                                                        {"args": [2], "expected": None}]}}
    raising = run_tests("def solve(x):\n    raise ValueError('failed call')\n", task_from_meta(meta))
    assert [t.status for t in raising.tests] == [TestStatus.ERROR, TestStatus.ERROR]
    honest = run_tests("def solve(x):\n    return '' if x == 1 else None\n", task_from_meta(meta))
    assert honest.n_passed == 2
    silent = run_tests("def solve(x):\n    pass\n", task_from_meta(meta))  # returns None for both
    assert [t.status for t in silent.tests] == [TestStatus.FAILED, TestStatus.PASSED]


# ---- verdict categories a grader expects (empty program, huge integer, C-stack overflow) ----------

SQUARE_CALLS = {"entry_point": "f", "tests": {"calls": [{"args": [3], "expected": 9}]}, "time_limit_s": 0.5}
SQUARE_ASSERTS = {"entry_point": "f", "tests": {"asserts": ["assert f(3) == 9"]}, "time_limit_s": 0.5}
SQUARE_IO = {"tests": {"io": [{"stdin": "3\n", "stdout": "9\n"}]}, "time_limit_s": 0.5}


def test_empty_program_is_a_failed_program_not_a_format_failure():
    for meta in (SQUARE_CALLS, SQUARE_IO, {"tests": {"io": [{"stdin": "x\n", "stdout": ""}]}}):
        ex = SimpleExample("", meta)
        for response in ("```python\n```", "```python\n\n\n```", block("# nothing to do\npass\n")):
            r = code_reward(response, ex)
            assert r.status is Status.INCORRECT, (response, r)
            assert r.total == 0.0 and r.parts["tests"] == 0.0 and "empty program" in r.info
    no_block = code_reward("I would print nothing.", SimpleExample("", SQUARE_IO))
    assert no_block.status is Status.UNPARSABLE and "no code block" in no_block.info


@pytest.mark.parametrize("meta", [SQUARE_CALLS, SQUARE_ASSERTS], ids=["calls", "asserts"])
@pytest.mark.parametrize("lift", [False, True], ids=["digit_limit", "limit_lifted"])
def test_huge_integer_result_is_an_error_not_a_timeout(meta, lift):
    # int -> str of a huge int hits Python's digit limit at once (ValueError); a candidate that lifts
    # the limit (sys.set_int_max_str_digits(0)) would make the answer's encoding spin to the deadline
    # computing 10 ** 10 ** 6 alone takes 0.2-0.8 s of CPU on a loaded 2-core machine: a 3 s limit leaves room for
    # it, while the spinning conversion it guards against takes 20-30 s (Python 3.11)
    meta = {**meta, "time_limit_s": 3.0}
    code = ("import sys\nsys.set_int_max_str_digits(0)\n" if lift else "") + "def f(n):\n    return 10 ** 10 ** 6\n"
    report = run_tests(code, task_from_meta(meta))
    (t,) = report.tests
    assert t.status is TestStatus.ERROR, t
    assert "ValueError" in t.detail and "digits" in t.detail, t
    assert code_reward(block(code), SimpleExample("", meta)).status is Status.INCORRECT


C_STACK_BOMBS = {
    # a __repr__ that recurses through C (repr -> __repr__ -> repr ...) with the recursion limit lifted
    "repr": "import sys\nsys.setrecursionlimit(10 ** 9)\nclass A:\n    def __repr__(self):\n"
            "        return repr(self.x)\na = A()\na.x = a\n",
    # Python -> C (functools.reduce) -> Python ...: every level uses the C stack
    "reduce": "import functools, sys\nsys.setrecursionlimit(10 ** 9)\n"
              "g = lambda n: functools.reduce(lambda x, y: g(n + 1), [1, 2])\n",
}


@pytest.mark.parametrize("meta,call", [(SQUARE_IO, "print(repr(a) if 'a' in dir() else g(0))\n"),
                                       (SQUARE_CALLS, "def f(n):\n    return repr(a) if 'a' in globals() else g(0)\n"),
                                       (SQUARE_ASSERTS, "def f(n):\n    return repr(a) if 'a' in globals() else g(0)\n")],
                         ids=["io", "calls", "asserts"])
@pytest.mark.parametrize("bomb", sorted(C_STACK_BOMBS))
def test_c_stack_overflow_is_a_crash_named_by_its_signal(meta, call, bomb):
    code = C_STACK_BOMBS[bomb] + call
    report = run_tests(code, task_from_meta(meta))
    (t,) = report.tests
    assert t.status is TestStatus.ERROR, t  # a crash, neither a timeout nor an output-cap kill
    assert "killed by signal SIGSEGV" in t.detail, t
    r = code_reward(block(code), SimpleExample("", meta))
    assert r.status is Status.INCORRECT and "SIGSEGV" in r.info, r
