"""Killable worker processes with a wall-clock deadline per call and a memory cap.

Why not `signal.alarm` (math-verify, the Dr. GRPO grader): signals only fire in the main thread
of the main interpreter, so they silently stop working in threads, async code and Ray workers, and
they cannot interrupt C code that never returns to the interpreter (gmpy2 / big-int arithmetic).
Here every call is sent over a pipe to a separate process; the parent waits with `poll(deadline)`
and, on timeout, SIGKILLs the worker and starts a fresh one later. This works from any thread
(each call holds its own worker), needs no cooperation from the checked code, and bounds memory
with RLIMIT_AS inside the worker.

Start method: "forkserver" by default. It is safe when torch (threads, CUDA) is loaded in the
parent, because workers fork from a small clean server process, and a replacement after a kill
costs a fork (milliseconds) rather than a fresh interpreter plus `import sympy` as with "spawn"
(benchmarks/verifier.py measures both). Targets are given as "module:function" strings or
picklable module-level callables, so they resolve by name in the worker.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

IN_WORKER = False  # True inside a worker process: the symbolic tier then runs in-process
DEFAULT_PRELOAD = ("rlvr.rewards.symbolic",)


@dataclass(frozen=True)
class CallResult:
    """Outcome of one call in a worker."""

    status: str  # "ok" | "timeout" | "error"
    value: Any = None  # the target's return value when status == "ok"
    info: str = ""  # why it failed
    seconds: float = 0.0  # wall time from send to answer (or kill)


def resolve(target: str | Callable) -> Callable:
    """"pkg.mod:func" -> the function (callables pass through)."""
    if callable(target):
        return target
    module, _, name = str(target).partition(":")
    if not module or not name:
        raise ValueError(f"target {target!r} is not 'module:function'")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _worker_main(conn, mem_limit_mb: int | None, preload: Sequence[str]) -> None:
    global IN_WORKER
    IN_WORKER = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    if mem_limit_mb:
        try:
            import resource

            limit = int(mem_limit_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    for mod in preload:
        importlib.import_module(mod)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if msg is None:
            return
        target, args = msg
        try:
            value = resolve(target)(*args)
            reply = ("ok", value)
        except MemoryError:
            reply = ("error", "MemoryError: worker memory cap reached")
        except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
            reply = ("error", f"{type(exc).__name__}: {exc}"[:500])
        try:
            conn.send(reply)
        except (OSError, ValueError, MemoryError):
            return


class _Worker:
    __slots__ = ("proc", "conn")

    def __init__(self, proc, conn):
        self.proc, self.conn = proc, conn

    def kill(self, wait: bool = True) -> None:
        """SIGKILL the worker. With wait=False the exit status is collected on a daemon thread,
        so a timed-out call returns at its deadline instead of after the reap (~tens of ms)."""
        try:
            self.proc.kill()
        except (OSError, ValueError, AttributeError):
            pass
        if wait:
            self._reap()
        else:
            threading.Thread(target=self._reap, name="rlvr-verifier-reap", daemon=True).start()

    def _reap(self) -> None:
        self.proc.join(timeout=10)
        try:
            self.conn.close()
        except OSError:
            pass


class WorkerPool:
    """Up to `size` worker processes, started lazily; `call` runs one target under a deadline.

    Thread-safe: each call takes an idle worker (or starts one, or waits for one), so `size`
    calls run at once. A worker that misses its deadline or dies is killed and replaced on demand.
    """

    def __init__(
        self,
        size: int = 2,
        mem_limit_mb: int | None = 2048,
        start_method: str = "forkserver",
        preload: Sequence[str] = DEFAULT_PRELOAD,
        startup_timeout_s: float = 120.0,
    ):
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        known = mp.get_all_start_methods()
        if start_method not in known:
            raise ValueError(f"unknown start method {start_method!r}; this platform has: {', '.join(known)}")
        self.size = size
        self.mem_limit_mb = mem_limit_mb
        self.start_method = start_method
        self.preload = tuple(preload)
        self.startup_timeout_s = startup_timeout_s
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # Only effective before the forkserver first starts; harmless afterwards.
            self._ctx.set_forkserver_preload(list(self.preload))
        self._idle: list[_Worker] = []
        self._alive = 0  # idle + busy + starting
        self._cond = threading.Condition()
        self._closed = False
        self._pid = os.getpid()
        self.kills = 0  # workers killed for missing a deadline
        self.deaths = 0  # workers that died on their own (crash, memory cap)
        self.started = 0
        self.started_pids: list[int] = []  # every worker ever started (tests check they are gone)

    # -- worker lifecycle -------------------------------------------------------------------
    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_worker_main, args=(child, self.mem_limit_mb, self.preload), daemon=True, name="rlvr-verifier"
        )
        proc.start()
        child.close()
        worker = _Worker(proc, parent)
        if not parent.poll(self.startup_timeout_s):
            worker.kill()
            raise RuntimeError(f"verifier worker did not start within {self.startup_timeout_s}s")
        try:
            parent.recv()
        except (EOFError, OSError) as exc:
            worker.kill()
            raise RuntimeError("verifier worker died while starting (memory cap too low?)") from exc
        self.started += 1
        self.started_pids.append(proc.pid)
        return worker

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("worker pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._alive < self.size:
                    self._alive += 1
                    break
                self._cond.wait()
        try:
            return self._start_worker()
        except BaseException:
            with self._cond:
                self._alive -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if self._closed:
                worker.kill()
                self._alive -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def _discard(self, worker: _Worker, wait: bool = True) -> None:
        worker.kill(wait=wait)
        with self._cond:
            self._alive -= 1
            self._cond.notify()

    # -- public -----------------------------------------------------------------------------
    def call(self, target: str | Callable, args: tuple = (), timeout_s: float = 3.0) -> CallResult:
        """Run target(*args) in a worker; at most `timeout_s` seconds of wall time once the worker
        has it (waiting for a free worker is not counted). Never raises for the target's sake."""
        worker = self._acquire()
        t0 = time.perf_counter()
        try:
            worker.conn.send((target, args))
        except (OSError, ValueError) as exc:  # worker died while idle, or args not picklable
            self._discard(worker)
            self.deaths += 1
            return CallResult("error", None, f"could not send to worker: {type(exc).__name__}: {exc}"[:300])
        try:
            ready = worker.conn.poll(max(0.0, timeout_s))
        except BaseException:
            self._discard(worker)
            raise
        if not ready:
            self._discard(worker, wait=False)
            self.kills += 1
            # start the replacement now, off this thread, so the next call does not pay for it
            threading.Thread(target=self._replenish, name="rlvr-verifier-replenish", daemon=True).start()
            return CallResult("timeout", None, f"no answer within {timeout_s:g}s; worker killed", time.perf_counter() - t0)
        try:
            kind, value = worker.conn.recv()
        except (EOFError, OSError) as exc:
            self._discard(worker)
            self.deaths += 1
            info = f"worker died ({type(exc).__name__}; memory cap or crash)"
            return CallResult("error", None, info, time.perf_counter() - t0)
        seconds = time.perf_counter() - t0
        if kind == "ok":
            self._release(worker)
            return CallResult("ok", value, "", seconds)
        # The target raised. A MemoryError can leave the worker half-broken: replace it.
        if str(value).startswith("MemoryError"):
            self._discard(worker)
        else:
            self._release(worker)
        return CallResult("error", None, str(value), seconds)

    def _replenish(self) -> None:
        with self._cond:
            if self._closed or self._alive >= self.size:
                return
            self._alive += 1
        try:
            worker = self._start_worker()
        except BaseException:  # noqa: BLE001 - a later call will try again and report
            with self._cond:
                self._alive -= 1
                self._cond.notify()
            return
        self._release(worker)

    def warmup(self, n: int | None = None) -> None:
        """Start workers now (their start-up is not part of any deadline anyway)."""
        n = self.size if n is None else min(n, self.size)
        got = [self._acquire() for _ in range(n)]
        for w in got:
            self._release(w)

    def live_pids(self) -> list[int]:
        with self._cond:
            return [w.proc.pid for w in self._idle]

    def close(self) -> None:
        """Stop all idle workers; busy ones are killed when their call returns."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._alive -= len(idle)
            self._cond.notify_all()
        for w in idle:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
            w.proc.join(timeout=2)
            if w.proc.is_alive():
                w.kill()
            else:
                w.conn.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_default: WorkerPool | None = None
_default_lock = threading.Lock()


def default_pool_size() -> int:
    env = os.environ.get("RLVR_VERIFIER_WORKERS")
    if env:
        return max(1, int(env))
    return max(1, min(4, os.cpu_count() or 1))


def get_pool(min_size: int | None = None) -> WorkerPool:
    """The process-wide pool used by the grader's symbolic tier (created on first use, re-created
    after a fork, grown to `min_size`). Environment: RLVR_VERIFIER_WORKERS (size),
    RLVR_VERIFIER_MEM_MB (address-space cap per worker, 0 = none, default 2048),
    RLVR_VERIFIER_START_METHOD (forkserver | spawn)."""
    global _default
    with _default_lock:
        if _default is not None and (_default._pid != os.getpid() or _default._closed):
            _default = None
        if _default is None:
            _default = WorkerPool(
                size=max(default_pool_size(), min_size or 1),
                mem_limit_mb=int(os.environ.get("RLVR_VERIFIER_MEM_MB", "2048")) or None,
                start_method=os.environ.get("RLVR_VERIFIER_START_METHOD", "forkserver"),
            )
        elif min_size and _default.size < min_size:
            with _default._cond:
                _default.size = min_size
                _default._cond.notify_all()
        return _default


def shutdown_default_pool() -> None:
    global _default
    with _default_lock:
        if _default is not None and _default._pid == os.getpid():
            _default.close()
        _default = None


atexit.register(shutdown_default_pool)


def _after_fork_in_child() -> None:
    """A process forked from one that ran a forkserver (a DataLoader worker, a Ray or
    multiprocessing "fork" child) inherits multiprocessing's record of the PARENT's forkserver:
    its pid (not our child, so `waitpid` raises ChildProcessError) and its socket. Forget it, so
    the first worker this process starts brings up its own forkserver. The parent's workers and
    default pool are not ours either: drop the reference without touching them."""
    global _default
    _default = None
    try:
        from multiprocessing import forkserver

        fs = forkserver._forkserver
        alive_fd = getattr(fs, "_forkserver_alive_fd", None)
        if alive_fd is not None:
            try:
                os.close(alive_fd)  # our copy only; the parent's server exits when its parent does
            except OSError:
                pass
        for attr in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_inherited_fds"):
            if hasattr(fs, attr):
                setattr(fs, attr, None)
    except Exception:  # noqa: BLE001 - best effort; a failure surfaces as a typed error later
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
