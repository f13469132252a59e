"""Run one candidate program against a task's hidden tests, each process in a fresh sandbox box.

Where the verdict is computed, per test kind (the candidate never sees an expected value):
  io      one process per test: the test's stdin arrives on a pipe, stdout is compared here, in
          the grader. Passing needs exit status 0 AND matching output, so a crash never passes,
          even when the expected output is empty.
  calls   one "serve" process imports the program and answers call requests (args as tagged
          JSON); return values come back as data and are compared here.
  asserts two processes: the candidate ("serve") and the test code ("check"), which calls the
          candidate through a pipe. The test process has its own uid, is non-dumpable and writes
          verdicts tagged with a per-run random nonce that the candidate never receives, so
          `sys.exit(0)` before the tests, monkeypatching the harness or printing fake verdicts
          cannot produce a pass.

Time limits are per test, never pooled over the tests a process runs: io tests count from the
harness's start marker (the grader kills the process at the limit; the STARTUP_S allowance only
covers interpreter start + confinement); calls and asserts run each call/test under an alarm in
the harness, and the grader also kills a serve process whose next answer is later than the limit
(+ ANSWER_SLACK_S). The process wall clock (tests x limit + STARTUP_S) stays as the outer bound.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from dataclasses import dataclass, field
from enum import StrEnum

from rlvr.rewards.code.harness import decode_value, encode_value
from rlvr.rewards.code.sandbox import Box, ProcResult, SandboxLimits, isolation, run_processes
from rlvr.rewards.code.task import CodeTask, normalize_stdout, values_equal

STARTUP_S = 1.0  # wall-clock allowance per process for interpreter start + confinement
# signals by which a program crashes on its own (SIGSEGV: a C stack overflow, e.g. deep recursion
# through C code with the recursion limit lifted): the test is an error, not a kill by a limit
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
EXCERPT = 400  # characters of stderr kept per test


class TestStatus(StrEnum):
    __test__ = False  # not a pytest class
    PASSED = "passed"
    FAILED = "failed"  # ran to completion, wrong answer
    ERROR = "error"  # crashed (SIGSEGV, SIGABRT, ...), non-zero exit, exception, bad return type
    TIMEOUT = "timeout"  # wall or CPU limit
    KILLED = "killed"  # output cap, or killed by a signal other than the time limits and crashes


@dataclass(frozen=True)
class TestResult:
    __test__ = False  # not a pytest class
    kind: str  # "io" | "call" | "assert"
    index: int
    status: TestStatus
    detail: str = ""
    stderr: str = ""  # excerpt (last EXCERPT characters)


@dataclass(frozen=True)
class IntegrityFlag:
    name: str  # e.g. "network", "file_read_outside", "harness_tamper", "leftover_processes"
    detail: str = ""
    test: str = ""  # "io[2]", "calls", "asserts"


@dataclass
class ExecutionReport:
    tests: list[TestResult] = field(default_factory=list)
    flags: list[IntegrityFlag] = field(default_factory=list)
    isolation: str = ""  # notes from inside the sandbox, e.g. "netns,tmpfs,landlock-abi7,seccomp"

    @property
    def n_passed(self) -> int:
        return sum(t.status is TestStatus.PASSED for t in self.tests)

    @property
    def fraction(self) -> float:
        return self.n_passed / len(self.tests) if self.tests else 0.0


def limits_for(task: CodeTask, n_units: int = 1, base: SandboxLimits | None = None) -> SandboxLimits:
    """Limits for a process that runs `n_units` tests of `task` in sequence. `wall_s` and
    `cpu_s` bound the process; `test_s` (the task's limit) bounds each test in it."""
    base = base or SandboxLimits()
    budget = task.time_limit_s * n_units
    return SandboxLimits(wall_s=budget + STARTUP_S, cpu_s=int(budget) + 2, memory_mb=task.memory_limit_mb,
                         file_size_mb=base.file_size_mb, disk_mb=base.disk_mb,
                         max_open_files=base.max_open_files, max_processes=base.max_processes,
                         output_bytes=base.output_bytes, test_s=task.time_limit_s)


def _excerpt(b: bytes) -> str:
    return b.decode("utf-8", "replace")[-EXCERPT:]


def _process_status(r: ProcResult) -> tuple[TestStatus, str] | None:
    """Status implied by how the process ended, or None when it exited on its own."""
    if r.killed == "timeout":
        return TestStatus.TIMEOUT, "time limit (killed)"
    if r.killed == "output":
        return TestStatus.KILLED, "output limit"
    if r.returncode is not None and r.returncode < 0:
        sig = -r.returncode
        if sig == 24:  # SIGXCPU: RLIMIT_CPU soft limit
            return TestStatus.TIMEOUT, "CPU limit"
        if sig in CRASH_SIGNALS:  # the program crashed (a C stack overflow is SIGSEGV): an error, at once
            return TestStatus.ERROR, f"killed by signal {_signal_name(sig)} (crash)"
        return TestStatus.KILLED, f"killed by signal {_signal_name(sig)}"
    return None


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"{sig}"


def _collect_flags(report: ExecutionReport, r: ProcResult, where: str) -> None:
    for name, detail in r.flags:
        report.flags.append(IntegrityFlag(name, detail, where))
    if r.isolation and not report.isolation:
        report.isolation = r.isolation


def _run(specs: list[dict], boxes: list[Box], wall_s: float) -> list[ProcResult]:
    try:
        results = run_processes(specs, wall_s)
    finally:
        leftovers = [b.close() for b in boxes]
    for r, n in zip(results, leftovers, strict=False):
        r.leftovers = n
    return results


def _leftover_flag(report: ExecutionReport, r: ProcResult, where: str) -> None:
    if r.leftovers:
        report.flags.append(IntegrityFlag("leftover_processes", f"{r.leftovers} still alive after the group kill",
                                          where))


def run_io_tests(code: str, task: CodeTask, report: ExecutionReport, base: SandboxLimits | None,
                 audit: bool = True) -> None:
    limits = limits_for(task, 1, base)
    for i, case in enumerate(task.io_tests):
        box = Box(code)
        (r,) = _run([{"box": box, "mode": "script", "limits": limits, "stdin": case.stdin.encode(),
                      "extra": {"audit": audit}, "per_test": "start"}], [box],
                    limits.wall_s)
        _collect_flags(report, r, f"io[{i}]")
        _leftover_flag(report, r, f"io[{i}]")
        ended = _process_status(r)
        if ended is not None:
            status, detail = ended
        elif r.returncode != 0:
            status, detail = TestStatus.ERROR, f"exit status {r.returncode}"
        elif normalize_stdout(r.stdout.decode("utf-8", "replace")) == normalize_stdout(case.stdout):
            status, detail = TestStatus.PASSED, ""
        else:
            status, detail = TestStatus.FAILED, "wrong output: " + _excerpt(r.stdout)[:120]
        report.tests.append(TestResult("io", i, status, detail, _excerpt(r.stderr)))


def _serve_spec(box: Box, limits: SandboxLimits, entry: str, stdin: bytes | None, fds: dict,
                audit: bool) -> dict:
    # `fds` are passed to the child (and closed here); without them the requests come on stdin
    # and the answers go to stdout, where the grader times each answer (per_test="answers").
    # With them (asserts) the check process times each test and waits for a ready line first.
    std = {"announce_ready": True} if fds else {"req_fd": 0, "resp_fd": 1}
    return {"box": box, "mode": "serve", "limits": limits, "stdin": stdin, "fds": fds,
            "extra": {"entry_point": entry, "audit": audit, **std}, "per_test": None if fds else "answers"}


def _bypass_flag(report: ExecutionReport, r: ProcResult, where: str) -> None:
    # The harness writes "done" when its request loop ends normally; a process that EXITED
    # (status >= 0) without it was ended by the candidate (os._exit, ...). Deaths by signal are
    # not flagged: the CPU limit and crashes end honest programs that way too.
    if r.killed is None and r.returncode is not None and r.returncode >= 0 and "done" not in r.markers:
        report.flags.append(IntegrityFlag("harness_bypassed", f"serve process ended early (rc={r.returncode})",
                                          where))


def run_call_tests(code: str, task: CodeTask, report: ExecutionReport, base: SandboxLimits | None,
                   audit: bool = True) -> None:
    n = len(task.call_tests)
    limits = limits_for(task, n, base)
    requests = b"".join(
        (json.dumps({"args": [encode_value(a) for a in c.args],
                     "kwargs": {k: encode_value(v) for k, v in c.kwargs.items()}}) + "\n").encode()
        for c in task.call_tests)
    box = Box(code)
    # serve mode with req_fd=0/resp_fd=1: the harness moves them aside before the candidate runs
    # and points the candidate's fd 1 at stderr, so prints cannot corrupt the answers.
    (r,) = _run([_serve_spec(box, limits, task.entry_point, requests, {}, audit)], [box], limits.wall_s)
    _collect_flags(report, r, "calls")
    _leftover_flag(report, r, "calls")
    _bypass_flag(report, r, "calls")
    lines = r.stdout.split(b"\n")
    ended = _process_status(r)
    for i, case in enumerate(task.call_tests):
        if i >= len(lines) - 1:  # no complete answer line for this call
            status, detail = ended or (TestStatus.ERROR, f"no answer (exit status {r.returncode})")
            report.tests.append(TestResult("call", i, status, detail, _excerpt(r.stderr)))
            continue
        try:
            answer = json.loads(lines[i])
            if not isinstance(answer, dict):
                raise ValueError("answer is not an object")
            if answer.get("ok") is True:
                got = decode_value(answer.get("value"))
                ok = values_equal(got, case.expected)
                status = TestStatus.PASSED if ok else TestStatus.FAILED
                detail = "" if ok else f"got {got!r}"[:160]
            elif answer.get("timeout") is True:
                status, detail = TestStatus.TIMEOUT, "per-test time limit"
            else:
                status, detail = TestStatus.ERROR, str(answer.get("error", ""))[:300]
        except (ValueError, TypeError, RecursionError) as e:
            status, detail = TestStatus.ERROR, f"malformed answer: {e}"[:200]
        report.tests.append(TestResult("call", i, status, detail, _excerpt(r.stderr)))


def run_assert_tests(code: str, task: CodeTask, report: ExecutionReport, base: SandboxLimits | None,
                     audit: bool = True) -> None:
    n = len(task.assert_tests)
    limits = limits_for(task, n, base)
    nonce = secrets.token_hex(16)
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    cand_box, check_box = Box(code), Box(None)
    config = json.dumps({"nonce": nonce, "entry_point": task.entry_point, "tests": list(task.assert_tests),
                         "setup": task.assert_setup}).encode()
    specs = [_serve_spec(cand_box, limits, task.entry_point, None, {"req_fd": req_r, "resp_fd": resp_w}, audit),
             {"box": check_box, "mode": "check", "limits": limits, "stdin": config,
              "fds": {"req_fd": req_w, "resp_fd": resp_r}}]
    cand, check = _run(specs, [cand_box, check_box], limits.wall_s)
    _collect_flags(report, cand, "asserts")
    _leftover_flag(report, cand, "asserts")
    _bypass_flag(report, cand, "asserts")
    verdicts: dict[int, tuple[str, str]] = {}
    ended = False
    for line in check.stdout.decode("utf-8", "replace").splitlines():
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if not isinstance(v, dict) or "nonce" not in v:
            continue
        if v["nonce"] != nonce:
            report.flags.append(IntegrityFlag("forged_result", "verdict with a wrong nonce", "asserts"))
            continue
        if v.get("end"):
            ended = True
        elif isinstance(v.get("i"), int) and v["i"] not in verdicts:
            verdicts[v["i"]] = (str(v.get("status")), str(v.get("detail", "")))
    cand_end = _process_status(cand)
    check_end = _process_status(check)
    for i in range(n):
        if i in verdicts:
            st, detail = verdicts[i]
            status = TestStatus(st) if st in ("passed", "failed", "error", "timeout") else TestStatus.ERROR
            if status is TestStatus.ERROR and cand_end is not None:  # the candidate died: say how
                detail = f"candidate {cand_end[1]}: {detail}"
        else:
            status, detail = check_end or cand_end or (TestStatus.ERROR, "test process gave no verdict")
        report.tests.append(TestResult("assert", i, status, detail, _excerpt(cand.stderr)))
    if not ended and not (check_end or cand_end):
        report.flags.append(IntegrityFlag("harness_bypassed", "test process ended without its end marker",
                                          "asserts"))


def run_tests(code: str, task: CodeTask, base_limits: SandboxLimits | None = None, *,
              audit: bool = True) -> ExecutionReport:
    """Run `code` against every hidden test of `task`. Never raises for anything the candidate
    does; raises only for grader-side failures (e.g. cannot create a temp dir). `audit=False`
    turns off the in-process audit hook (flags), leaving only the kernel confinement: for tests."""
    report = ExecutionReport()
    if task.io_tests:
        run_io_tests(code, task, report, base_limits, audit)
    if task.call_tests:
        run_call_tests(code, task, report, base_limits, audit)
    if task.assert_tests:
        run_assert_tests(code, task, report, base_limits, audit)
    if not report.isolation:
        report.isolation = isolation().notes
    return report
