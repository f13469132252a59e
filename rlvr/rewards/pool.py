"""Killable worker processes with a wall-clock deadline per call and a memory cap.

Why not `signal.alarm` (math-verify, the Dr. GRPO grader): signals only fire in the main thread
of the main interpreter, so they silently stop working in threads, async code and Ray workers, and
they cannot interrupt C code that never returns to the interpreter (gmpy2 / big-int arithmetic).
Here every call is sent over a socket to a separate process; the parent waits with
`poll(deadline)` and, on timeout, SIGKILLs the worker and starts a fresh one later. This works
from any thread (each call holds its own worker), needs no cooperation from the checked code, and
bounds memory with RLIMIT_AS inside the worker.

Workers start from this library's own entry point, never from the caller's script. They are not
`multiprocessing` processes: its "spawn" and "forkserver" start methods import the parent's
`__main__` module in every child, so a script that grades at module level without an
`if __name__ == "__main__":` guard would run again inside each worker. Instead:

* "forkserver" (default): one small server process per pool, started as
  `python -c "...; from rlvr.rewards.pool import _child_main; ..."` with the parent's sys.path,
  imports sympy once (`preload`) and forks each worker on request. The parent hands it one end of
  a fresh socket pair (SCM_RIGHTS); the forked worker talks over it. A replacement after a kill
  costs a fork (milliseconds), not a fresh interpreter plus `import sympy`, and torch threads or
  CUDA state of the trainer process are never forked. The server reaps its workers (SIGCHLD
  ignored); the parent kills them through a pidfd where the platform has one.
* "spawn": each worker is a fresh interpreter started the same way (slower to replace).

Targets are given as "module:function" strings or picklable callables defined in an importable
module (not in the script being run: that script is never imported in a worker), so they
resolve by name in the worker.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

IN_WORKER = False  # True inside a worker process: the symbolic tier then runs in-process
DEFAULT_PRELOAD = ("rlvr.rewards.symbolic",)
START_METHODS = ("forkserver", "spawn")

# The command line of every process this module starts: the parent's sys.path first (so targets
# and the package resolve as they do in the parent), then this module's entry point. Nothing of
# the caller's __main__ is imported.
_BOOT = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); from rlvr.rewards.pool import _child_main; _child_main(sys.argv[2:])"


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


# ---------------------------------------------------------------------------------------------
# Child side: the server and the worker loop


def _worker_main(conn: Connection, mem_limit_mb: int | None, preload: Sequence[str]) -> None:
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
            raw = conn.recv_bytes()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        try:
            msg = pickle.loads(raw)
        except BaseException as exc:  # noqa: BLE001 - e.g. a callable that cannot be imported here
            msg = ("__unloadable__", f"could not load the call in the worker: {type(exc).__name__}: {exc}")
        if msg is None:
            return
        target, args = msg
        try:
            if target == "__unloadable__":
                raise RuntimeError(args)
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
        except Exception as exc:  # noqa: BLE001 - an unpicklable return value
            try:
                conn.send(("error", f"could not send the result: {type(exc).__name__}: {exc}"[:500]))
            except Exception:  # noqa: BLE001
                return


def _serve(ctl: socket.socket, mem_limit_mb: int | None, preload: Sequence[str]) -> None:
    """The fork server: preload, then fork one worker per request until the parent hangs up."""
    global IN_WORKER
    IN_WORKER = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps our workers: no zombies
    for mod in preload:
        importlib.import_module(mod)
    ctl.sendall(b"R")
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 1, 1)
        except (OSError, KeyboardInterrupt):
            return
        if not msg:
            return  # the parent closed its end (or exited)
        if not fds:
            continue
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                ctl.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _worker_main(Connection(fds[0]), mem_limit_mb, ())
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        try:
            ctl.sendall(struct.pack("!q", pid))
        except OSError:
            return


def _child_main(argv: Sequence[str]) -> None:
    """Entry point of the processes this module starts: `server FD MEM PRELOAD_JSON` or
    `worker FD MEM PRELOAD_JSON`."""
    mode, fd, mem, preload = argv[0], int(argv[1]), int(argv[2]) or None, json.loads(argv[3])
    if mode == "server":
        _serve(socket.socket(fileno=fd), mem, preload)
    else:
        _worker_main(Connection(fd), mem, preload)


def _spawn(mode: str, child_fd: int, mem_limit_mb: int | None, preload: Sequence[str]) -> subprocess.Popen:
    args = [sys.executable, "-c", _BOOT, json.dumps(list(sys.path)), mode, str(child_fd),
            str(int(mem_limit_mb or 0)), json.dumps(list(preload))]  # fmt: skip
    return subprocess.Popen(args, pass_fds=(child_fd,), stdin=subprocess.DEVNULL, close_fds=True)


# ---------------------------------------------------------------------------------------------
# Parent side


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class _Worker:
    __slots__ = ("pid", "conn", "_pidfd", "_popen", "_lock")

    def __init__(self, pid: int, conn: Connection, popen: subprocess.Popen | None):
        self.pid, self.conn, self._popen = pid, conn, popen
        # A pidfd names this process and no later one with a recycled pid (forked workers are the
        # server's children, so the parent cannot wait for them).
        self._pidfd = _pidfd(pid) if popen is None else None
        self._lock = threading.Lock()

    def kill(self, wait: bool = True) -> None:
        """SIGKILL the worker. With wait=False its exit is awaited on a daemon thread, so a
        timed-out call returns at its deadline instead of after the reap (~tens of ms)."""
        try:
            if self._popen is not None:
                self._popen.kill()
            elif self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except (OSError, ValueError, AttributeError):
            pass
        if wait:
            self._reap()
        else:
            threading.Thread(target=self._reap, name="rlvr-verifier-reap", daemon=True).start()

    def wait_exit(self, timeout: float) -> bool:
        """Has the process exited within `timeout` seconds?"""
        if self._popen is not None:
            try:
                self._popen.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        if self._pidfd is not None:
            try:
                return bool(select.select([self._pidfd], [], [], timeout)[0])
            except (OSError, ValueError):
                return True
        # no pidfd: the worker's socket reads EOF once it is gone
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.conn.poll(max(0.0, deadline - time.monotonic())):
                    self.conn.recv_bytes()
                    continue
            except (EOFError, OSError):
                return True
        return False

    def _reap(self) -> None:
        self.wait_exit(10)
        self.close_handles()

    def close_handles(self) -> None:
        with self._lock:
            try:
                self.conn.close()
            except OSError:
                pass
            if self._pidfd is not None:
                try:
                    os.close(self._pidfd)
                except OSError:
                    pass
                self._pidfd = None


class _ForkServer:
    """One server process that forks workers with sympy already imported (see module doc)."""

    def __init__(self, mem_limit_mb: int | None, preload: Sequence[str], startup_timeout_s: float):
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.popen = _spawn("server", theirs.fileno(), mem_limit_mb, preload)
        finally:
            theirs.close()
        self.ctl = ours
        self.ctl.settimeout(startup_timeout_s)
        try:
            ready = self.ctl.recv(1)
        except OSError as exc:
            self.close()
            raise RuntimeError(f"verifier fork server did not start within {startup_timeout_s}s") from exc
        if ready != b"R":
            self.close()
            raise RuntimeError("verifier fork server died while starting")
        self.ctl.settimeout(30.0)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def fork(self, worker_fd: int) -> int:
        """Pid of a new worker that talks over `worker_fd` (sent to the server, closed here)."""
        with self._lock:
            socket.send_fds(self.ctl, [b"F"], [worker_fd])
            buf = b""
            while len(buf) < 8:
                got = self.ctl.recv(8 - len(buf))
                if not got:
                    raise OSError("verifier fork server closed its socket")
                buf += got
        return struct.unpack("!q", buf)[0]

    def close(self) -> None:
        try:
            self.ctl.close()  # the server exits on EOF
        except OSError:
            pass
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=5)

    def abandon(self) -> None:
        """In a forked child: drop our copy of the socket without touching the parent's server."""
        try:
            self.ctl.close()
        except OSError:
            pass


_POOLS: weakref.WeakSet = weakref.WeakSet()


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
        if start_method not in START_METHODS:
            raise ValueError(f"unknown start method {start_method!r}; known: {', '.join(START_METHODS)}")
        self.size = size
        self.mem_limit_mb = mem_limit_mb
        self.start_method = start_method
        self.preload = tuple(preload)
        self.startup_timeout_s = startup_timeout_s
        self._server: _ForkServer | None = None
        self._server_lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._alive = 0  # idle + busy + starting
        self._cond = threading.Condition()
        self._closed = False
        self._pid = os.getpid()
        self.kills = 0  # workers killed for missing a deadline
        self.deaths = 0  # workers that died on their own (crash, memory cap)
        self.started = 0
        self.started_pids: list[int] = []  # every worker ever started (tests check they are gone)
        _POOLS.add(self)

    # -- worker lifecycle -------------------------------------------------------------------
    def _get_server(self) -> _ForkServer:
        with self._server_lock:
            if self._closed:
                raise RuntimeError("worker pool is closed")
            if self._server is None or not self._server.alive():
                if self._server is not None:
                    self._server.close()
                self._server = _ForkServer(self.mem_limit_mb, self.preload, self.startup_timeout_s)
            return self._server

    def _start_worker(self) -> _Worker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if self.start_method == "forkserver":
                try:
                    pid = self._get_server().fork(theirs.fileno())
                except OSError:
                    # the server died (killed from outside, out of memory): start a new one once
                    with self._server_lock:
                        if self._server is not None:
                            self._server.close()
                            self._server = None
                    pid = self._get_server().fork(theirs.fileno())
                popen = None
            else:
                popen = _spawn("worker", theirs.fileno(), self.mem_limit_mb, self.preload)
                pid = popen.pid
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        if not conn.poll(self.startup_timeout_s):
            worker = _Worker(pid, conn, popen)
            worker.kill()
            raise RuntimeError(f"verifier worker did not start within {self.startup_timeout_s}s")
        try:
            conn.recv()
        except (EOFError, OSError) as exc:
            worker = _Worker(pid, conn, popen)
            worker.kill()
            raise RuntimeError("verifier worker died while starting (memory cap too low?)") from exc
        worker = _Worker(pid, conn, popen)  # alive and waiting: its pidfd names it
        self.started += 1
        self.started_pids.append(pid)
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
        try:
            payload = pickle.dumps((target, args), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - args not picklable
            return CallResult("error", None, f"could not send to worker: {type(exc).__name__}: {exc}"[:300])
        worker = self._acquire()
        t0 = time.perf_counter()
        try:
            worker.conn.send_bytes(payload)
        except (OSError, ValueError) as exc:  # worker died while idle
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
        except Exception as exc:  # noqa: BLE001 - a result the parent cannot unpickle
            self._release(worker)
            return CallResult("error", None, f"could not read the result: {type(exc).__name__}: {exc}"[:300])
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
            return [w.pid for w in self._idle]

    def server_pid(self) -> int | None:
        """Pid of this pool's fork server (None before the first worker, or with "spawn")."""
        server = self._server
        return server.popen.pid if server is not None else None

    def close(self) -> None:
        """Stop all idle workers and the fork server; busy ones are killed when their call returns."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._alive -= len(idle)
            self._cond.notify_all()
        for w in idle:
            try:
                w.conn.send_bytes(pickle.dumps(None))
            except (OSError, ValueError):
                pass
            if w.wait_exit(2):
                w.close_handles()
            else:
                w.kill()
        with self._server_lock:
            server, self._server = self._server, None
        if server is not None:
            server.close()

    def _abandon_after_fork(self) -> None:
        """In a forked child: close this process's copies of the pool's sockets (the parent's
        workers and server are not ours; they must see EOF when the parent closes them)."""
        self._closed = True
        for w in self._idle:
            try:
                w.conn.close()
            except OSError:
                pass
            if w._pidfd is not None:
                try:
                    os.close(w._pidfd)
                except OSError:
                    pass
        self._idle = []
        if self._server is not None:
            self._server.abandon()
            self._server = None
        # locks may have been held by another thread of the parent at fork time
        self._cond = threading.Condition()
        self._server_lock = threading.Lock()

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
    """A process forked from this one (a DataLoader worker, a Ray or multiprocessing "fork"
    child) inherits the pools' sockets but not their processes: close its copies, forget the
    default pool, and start its own on first use."""
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()
    for pool in list(_POOLS):
        if pool._pid != os.getpid():
            try:
                pool._abandon_after_fork()
            except Exception:  # noqa: BLE001 - best effort; a closed pool raises a typed error later
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
