"""Code reward functions: `(response, example) -> Reward`, example.meta holding the code task.

Parts of every reward:
  tests      test score under the aggregate ("fraction" of tests passed, or "all_or_nothing")
  format     1.0 when a program was extracted by the task's rules (extract.py), else 0.0
  integrity  1.0 when no integrity flag was raised, else 0.0 (reported separately from the task
             reward: the flags are the trajectory's integrity, the tests its completion)
total = tests (+ format_weight * format), then the integrity policy: "zero" sets total to 0 when
any flag was raised, "report" leaves it and only reports. Registered variants use "zero".
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from rlvr.rewards.code.extract import extract_code, is_empty_program
from rlvr.rewards.code.runner import ExecutionReport, TestStatus, run_tests
from rlvr.rewards.code.sandbox import SandboxLimits
from rlvr.rewards.code.task import CodeTaskError, task_from_meta
from rlvr.rewards.types import ExampleLike, Reward, Status


def _fraction(report: ExecutionReport) -> float:
    return report.fraction


def _all_or_nothing(report: ExecutionReport) -> float:
    return 1.0 if report.tests and report.n_passed == len(report.tests) else 0.0


TEST_AGGREGATES: dict[str, Callable[[ExecutionReport], float]] = {
    "fraction": _fraction,
    "all_or_nothing": _all_or_nothing,
}


def _policy_zero(total: float, flagged: bool) -> float:
    return 0.0 if flagged else total


def _policy_report(total: float, flagged: bool) -> float:
    return total


INTEGRITY_POLICIES: dict[str, Callable[[float, bool], float]] = {
    "zero": _policy_zero,
    "report": _policy_report,
}


def _lookup(table: dict, name: str, what: str):
    if name not in table:
        raise KeyError(f"unknown {what} {name!r}; known: {sorted(table)}")
    return table[name]


def score_code(response: str, example: ExampleLike, *, aggregate: str = "fraction", integrity: str = "zero",
               format_weight: float = 0.0, limits: SandboxLimits | None = None) -> Reward:
    """Extract the program, run it against the hidden tests in the sandbox, and score it.
    Never raises for anything in `response`; a malformed task gives Status.ERROR."""
    agg = _lookup(TEST_AGGREGATES, aggregate, "test aggregate")
    policy = _lookup(INTEGRITY_POLICIES, integrity, "integrity policy")
    try:
        task = task_from_meta(example.meta)
    except CodeTaskError as e:
        return Reward(0.0, {"tests": 0.0, "format": 0.0, "integrity": 1.0}, Status.ERROR, str(e))
    code = extract_code(response, task.code_format, allow_empty=True)
    if code is None:  # the format failure
        return Reward(0.0, {"tests": 0.0, "format": 0.0, "integrity": 1.0}, Status.UNPARSABLE, "no code block")
    if is_empty_program(code):  # a program that fails every test (not run: it would "print" an empty output)
        return Reward(0.0, {"tests": 0.0, "format": 0.0, "integrity": 1.0}, Status.INCORRECT,
                      f"empty program: 0/{task.n_tests} tests passed (not run)")
    try:
        report = run_tests(code, task, limits)
    except Exception as e:  # grader-side failure (disk full, no temp dir): counted, not hidden
        return Reward(0.0, {"tests": 0.0, "format": 1.0, "integrity": 1.0}, Status.ERROR,
                      f"sandbox failure: {type(e).__name__}: {e}"[:300])
    tests = agg(report)
    flagged = bool(report.flags)
    total = policy(tests + format_weight * 1.0, flagged)
    n, k = len(report.tests), report.n_passed
    if n and k == n:
        status = Status.CORRECT
    elif any(t.status is TestStatus.TIMEOUT for t in report.tests):
        status = Status.TIMEOUT
    else:
        status = Status.INCORRECT
    info = f"{k}/{n} tests passed"
    if flagged:
        names = sorted({f.name for f in report.flags})
        info += f"; integrity flags: {','.join(names)} (policy {integrity})"
    first_bad = next((t for t in report.tests if t.status is not TestStatus.PASSED), None)
    if first_bad is not None:
        info += f"; {first_bad.kind}[{first_bad.index}] {first_bad.status.value}: {first_bad.detail[:80]}"
    return Reward(total, {"tests": tests, "format": 1.0, "integrity": 0.0 if flagged else 1.0}, status, info)


def code_format_reward(response: str, example: ExampleLike) -> Reward:
    """1.0 when a non-empty program can be extracted by the task's rules; runs nothing."""
    meta = getattr(example, "meta", {}) or {}
    code = extract_code(response, meta.get("code_format", "fenced"))
    ok = code is not None and not is_empty_program(code)
    return Reward(float(ok), {"format": float(ok)}, Status.CORRECT if ok else Status.UNPARSABLE)


def make_code_reward(aggregate: str = "fraction", integrity: str = "zero", format_weight: float = 0.0,
                     limits: SandboxLimits | None = None) -> Callable[[str, ExampleLike], Reward]:
    """A configured reward function (picklable: a functools.partial of a module function)."""
    _lookup(TEST_AGGREGATES, aggregate, "test aggregate")
    _lookup(INTEGRITY_POLICIES, integrity, "integrity policy")
    return partial(score_code, aggregate=aggregate, integrity=integrity, format_weight=format_weight,
                   limits=limits)


def code_reward(response: str, example: ExampleLike) -> Reward:
    """Fraction of hidden tests passed; integrity flags zero it."""
    return score_code(response, example, aggregate="fraction", integrity="zero")


def code_all_or_nothing(response: str, example: ExampleLike) -> Reward:
    """1.0 only when every hidden test passes; integrity flags zero it."""
    return score_code(response, example, aggregate="all_or_nothing", integrity="zero")


CODE_REWARD_FUNCTIONS: dict[str, Callable[[str, ExampleLike], Reward]] = {
    "code": code_reward,
    "code_all_or_nothing": code_all_or_nothing,
    "code_format": code_format_reward,
}
