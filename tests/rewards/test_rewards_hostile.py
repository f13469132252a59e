"""Hostile inputs never hang the grader, never score correct, and leave no process behind.

Every input must come back non-correct within DEADLINE + 1 s, from the main thread and from a
non-main thread (where signal-based timeouts stop working). Worker processes are counted by a
/proc scan of our descendants (forkserver workers are grandchildren, not children)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from rlvr.rewards import get_reward_fn
from rlvr.rewards import grader as grader_mod
from rlvr.rewards import pool as pool_mod
from rlvr.rewards.grader import grade_answer, verifier_timeout
from rlvr.rewards.labeled.hostile import HOSTILE
from rlvr.rewards.types import SimpleExample, Status

DEADLINE = 1.0



def descendants(pid: int) -> set[int]:
    """All live (or zombie) descendant pids of `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out: set[int] = set()
    stack = [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


def _forkserver_pid() -> set[int | None]:
    """multiprocessing's own long-lived helpers (started once per process, not per pool): the
    forkserver and the resource tracker. They are not workers and are not expected to exit."""
    from multiprocessing import forkserver, resource_tracker

    return {
        getattr(forkserver._forkserver, "_forkserver_pid", None),
        getattr(resource_tracker._resource_tracker, "_pid", None),
    }


@pytest.fixture(scope="module")
def fresh_pool():
    """A private 2-worker pool installed as the grader's default, warmed up, closed after."""
    before = descendants(os.getpid())
    saved = pool_mod._default
    pool = pool_mod.WorkerPool(size=2, mem_limit_mb=2048)
    pool_mod._default = pool
    grader_mod.set_cache(False)
    pool.warmup()
    yield pool
    pool.close()
    pool_mod._default = saved
    grader_mod.set_cache(True)
    after = descendants(os.getpid()) - _forkserver_pid()
    # killed workers are reaped asynchronously; give each a bounded moment to disappear
    left = [p for p in sorted(after - before) if not _wait_gone(p)]
    assert not left, f"processes left behind: {[(p, _cmdline(p)) for p in left]}"


def _check_all(results: list[tuple[str, Status, float]]) -> None:
    assert len(results) == len(HOSTILE)
    for text, status, seconds in results:
        assert status is not Status.CORRECT, text[:60]
        assert seconds < DEADLINE + 1.0, f"{text[:60]!r} took {seconds:.2f}s"


def _run(out: list) -> None:
    for text in HOSTILE:
        t0 = time.perf_counter()
        v = grade_answer(text, "1", timeout_s=DEADLINE)
        out.append((text, v.status, time.perf_counter() - t0))


def test_at_least_30_hostile_inputs():
    assert len(HOSTILE) >= 30


def test_hostile_main_thread(fresh_pool):
    out: list = []
    _run(out)
    _check_all(out)
    assert len(fresh_pool.live_pids()) <= fresh_pool.size


def test_hostile_non_main_thread(fresh_pool):
    out: list = []
    th = threading.Thread(target=_run, args=(out,))
    th.start()
    th.join(timeout=len(HOSTILE) * (DEADLINE + 1.0) + 30)
    assert not th.is_alive()
    _check_all(out)


def test_hostile_from_async_code(fresh_pool):
    def timed(*args):
        t0 = time.perf_counter()
        return grade_answer(*args), time.perf_counter() - t0

    async def main():
        # straight in the event loop thread, and from a worker thread via to_thread
        a = timed("\\prod_{k=1}^{10^{9}} k", "1", DEADLINE)
        b = await asyncio.to_thread(timed, "\\prod_{k=1}^{10^{9}} k", "1", DEADLINE)
        return a, b

    (a, ta), (b, tb) = asyncio.run(main())
    assert a.status is Status.TIMEOUT and b.status is Status.TIMEOUT
    assert ta < DEADLINE + 1.0 and tb < DEADLINE + 1.0


def test_hostile_responses_through_reward_functions(fresh_pool):
    with verifier_timeout(DEADLINE):
        _hostile_responses()


def _hostile_responses():
    ex = SimpleExample("1")
    for text in HOSTILE[:20] + ["\\prod_{k=1}^{10^{6}} (x+k)"] + HOSTILE[-5:]:
        for name in ("r1_zero", "gsm8k"):
            fn = get_reward_fn(name)
            response = f"<think>x</think> <answer>\\boxed{{{text}}}</answer>"
            t0 = time.perf_counter()
            r = fn(response, ex)
            assert r.status is not Status.CORRECT and r.total == 0.0
            assert time.perf_counter() - t0 < DEADLINE + 1.0
    # a megabyte of response text: extraction is linear and capped
    t0 = time.perf_counter()
    r = get_reward_fn("gsm8k")("7" * 1_000_000 + " #### " + "(" * 3000, ex)
    assert r.status is not Status.CORRECT
    assert time.perf_counter() - t0 < DEADLINE + 1.0


HUGE_NUMBERS = [
    "1" + ",000" * 100_000,  # 300,001 digits with thousands separators
    "1" + " 000" * 100_000,
    "\\$1" + ",000" * 2_000,  # 6,001 digits: over Python's 4,300-digit int() limit
    "9" * 5_000,
    "-" + "9" * 300_000 + ".5",
]


def test_huge_digit_numbers_are_verdicts_not_exceptions():
    # The plain-number fast path used to call int() on these and raise ValueError
    # ("Exceeds the limit (4300 digits) for integer string conversion").
    assert all(h in HOSTILE for h in HUGE_NUMBERS if len(h) > 100_000)
    for huge in HUGE_NUMBERS:
        v = grade_answer(huge, "1")
        assert v.status is Status.INCORRECT and "guard" in v.info, v
        v = grade_answer("1", huge)  # on the gold side: the gold is rejected, reported as error
        assert v.status is Status.ERROR and "gold answer rejected" in v.info, v
        assert grade_answer(huge, huge).status is Status.ERROR
    ex = SimpleExample("1")
    for name in ("gsm8k", "r1_zero", "math", "final"):
        for resp in (f"#### {HUGE_NUMBERS[0]}", f"</think> <answer>{HUGE_NUMBERS[2]}</answer>", HUGE_NUMBERS[3]):
            r = get_reward_fn(name)(resp, ex)
            assert r.total == 0.0 and r.status is not Status.ERROR, (name, r.info)


def test_timeout_is_reported_not_scored_zero_silently(fresh_pool):
    v = grade_answer("\\prod_{k=1}^{10^{9}} k", "1", timeout_s=0.5)
    assert v.status is Status.TIMEOUT and "killed" in v.info
    assert fresh_pool.kills >= 1
    with verifier_timeout(0.5):
        r = get_reward_fn("r1_zero")("<think>x</think> <answer>\\prod_{k=1}^{10^{9}} k</answer>", SimpleExample("1"))
    assert r.status is Status.TIMEOUT and r.total == 0.0


def test_c_level_hang_is_killed_and_worker_replaced():
    with pool_mod.WorkerPool(size=1, mem_limit_mb=None, preload=()) as pool:
        pool.warmup()
        first_pid = pool.live_pids()[0]
        t0 = time.perf_counter()
        # one C call on big integers: never returns to the interpreter, so no signal could stop it
        res = pool.call("builtins:pow", (3, 10**9), timeout_s=0.5)
        assert res.status == "timeout"
        assert time.perf_counter() - t0 < 0.5 + 1.0
        # the killed worker dies and is reaped (asynchronously: the call returns at its deadline)
        assert _wait_gone(first_pid), _cmdline(first_pid)
        ok = pool.call("builtins:abs", (-3,), timeout_s=5.0)  # a fresh worker answers
        assert ok.status == "ok" and ok.value == 3
        assert pool.live_pids()[0] != first_pid
    assert len(pool.started_pids) >= 2  # the killed one and its replacement
    for pid in pool.started_pids:
        assert _wait_gone(pid), _cmdline(pid)


def _wait_gone(pid: int, attempts: int = 200) -> bool:
    """Poll until `pid` no longer exists (bounded; not a speed assertion)."""
    for _ in range(attempts):
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.05)
    return False


def test_memory_cap_turns_into_error_and_worker_survives():
    with pool_mod.WorkerPool(size=1, mem_limit_mb=512, preload=()) as pool:
        res = pool.call("builtins:bytearray", (2 * 1024**3,), timeout_s=10.0)
        assert res.status == "error" and "MemoryError" in res.info
        ok = pool.call("builtins:len", ("abc",), timeout_s=5.0)
        assert ok.status == "ok" and ok.value == 3


def test_pool_serves_concurrent_threads_and_reports_target_errors():
    with pool_mod.WorkerPool(size=2, mem_limit_mb=None, preload=()) as pool:
        results: list = [None] * 4

        def work(i):
            results[i] = pool.call("time:sleep", (0.2,), timeout_s=5.0)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r.status for r in results] == ["ok"] * 4
        bad = pool.call("builtins:int", ("not a number",), timeout_s=5.0)
        assert bad.status == "error" and "ValueError" in bad.info
        missing = pool.call("no_such_module_xyz:f", (), timeout_s=5.0)
        assert missing.status == "error" and "ModuleNotFoundError" in missing.info


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def _grade_in_forked_child(q) -> None:
    q.put(grade_answer("x^2-1", "(x-1)(x+1)", timeout_s=30).status.value)


def test_works_in_a_forked_child_and_leaves_nothing_behind():
    # The parent has used the forkserver (earlier tests or this call); a "fork" child (DataLoader
    # worker, Ray/multiprocessing fork) inherits a stale record of it and must start its own.
    assert grade_answer("\\sqrt{8}", "2\\sqrt{2}", timeout_s=30).status is Status.CORRECT
    import multiprocessing

    before = descendants(os.getpid())
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_grade_in_forked_child, args=(q,))
    p.start()
    assert q.get(timeout=120) == "correct"
    p.join(timeout=60)
    assert p.exitcode == 0
    # the child's forkserver and workers exit when the child's pipes close; allow them a moment
    for _ in range(100):
        left = descendants(os.getpid()) - before - _forkserver_pid()
        if not left:
            break
        time.sleep(0.1)
    assert not left, [(x, _cmdline(x)) for x in left]
