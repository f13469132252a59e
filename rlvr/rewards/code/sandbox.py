"""Grader side of the sandbox: one fresh box (temp dirs + unprivileged uid slot) per process,
spawn the harness (rlvr/rewards/code/_harness.py) in its own session, feed its stdin, read its
outputs with byte caps, enforce the wall-clock deadline, kill the whole process group (and, as
root, every process of the slot's uid) at the end, and remove the box.

What holds where is documented in docs/code_rewards.md ("Isolation"). In short, as root:
own session + process group, per-slot uid (61000+ by default, RLVR_SANDBOX_UID_BASE), rlimits,
network + mount namespace, size-capped tmpfs work dir, Landlock filesystem allow-list, seccomp
socket-family filter, clean environment, no inherited fds. Not root: the same minus the uid
drop and the tmpfs (Landlock, seccomp and a user+network namespace do not need root); the
isolation report says so (`Isolation.strong` is False).
"""

from __future__ import annotations

import fcntl
import marshal
import os
import random
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from rlvr.rewards.code import _harness

HARNESS_SOURCE = Path(_harness.__file__).read_text(encoding="utf-8")
UID_BASE = int(os.environ.get("RLVR_SANDBOX_UID_BASE", "61000"))
UID_SLOTS = 512
LOCK_DIR = Path(tempfile.gettempdir()) / "rlvr-sandbox-locks"


@dataclass(frozen=True)
class SandboxLimits:
    """Per-process limits. Units in the names; every limit is enforced by the kernel or by the
    grader's reader loop, never by the candidate's cooperation."""

    wall_s: float = 2.0  # wall clock from spawn to kill (grader-enforced, SIGKILL to the group)
    cpu_s: int = 2  # RLIMIT_CPU seconds (SIGXCPU, then SIGKILL)
    memory_mb: int = 256  # RLIMIT_AS address space
    file_size_mb: int = 8  # RLIMIT_FSIZE: largest file the candidate can write
    disk_mb: int = 16  # tmpfs size of the work dir (root only)
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_processes: int = 8  # RLIMIT_NPROC for the slot uid (root) / flagged fork count
    output_bytes: int = 1 << 20  # stdout cap; stderr is kept to 8 KiB; over the cap -> killed

    def to_harness(self, nproc: int) -> dict:
        return {"cpu_s": self.cpu_s, "memory_mb": self.memory_mb, "file_size_mb": self.file_size_mb,
                "disk_mb": self.disk_mb, "max_open_files": self.max_open_files, "nproc": nproc}


STDERR_CAP = 8 << 10


@dataclass(frozen=True)
class Isolation:
    """What this machine gives the sandbox. `strong` means: distinct unprivileged uid per box,
    network namespace, Landlock and seccomp all active."""

    root: bool
    landlock_abi: int
    seccomp: bool
    strong: bool
    notes: str


@lru_cache(maxsize=1)
def isolation() -> Isolation:
    import ctypes
    import platform

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        abi = max(0, int(libc.syscall(444, None, 0, 1)))
    except OSError:
        abi = 0
    root = os.geteuid() == 0
    seccomp = platform.machine() == "x86_64" and sys.platform == "linux"
    strong = root and abi >= 1 and seccomp
    notes = ("root: uid drop per slot, netns+mountns, tmpfs work dir" if root
             else "NOT root: same uid as the grader (weaker: no uid separation)")
    return Isolation(root, abi, seccomp, strong, notes)


def interpreter() -> tuple[str, str]:
    """(executable, prefix) of the base interpreter (never a venv: the sandbox gets stdlib only)."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


@lru_cache(maxsize=1)
def hidden_ancestor() -> str | None:
    """The topmost directory above the interpreter's prefix that "others" cannot traverse (e.g.
    /root with mode 0700 under pyenv), or None. As root the sandbox covers it with a tmpfs that
    holds only a read-only bind of the prefix, so the unprivileged uid can run Python."""
    _, prefix = interpreter()
    path = "/"
    for part in prefix.strip("/").split("/"):
        path = os.path.join(path, part)
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return path if path != prefix else None
    return None


# ----------------------------------------------------------------------------------------------
# uid slots: one unprivileged uid per live box, unique across threads AND processes (flock), so
# RLIMIT_NPROC counts only this box and the end-of-run sweep kills only this box's processes.
# ----------------------------------------------------------------------------------------------

_slot_lock = threading.Lock()


def _acquire_slot() -> tuple[int, int]:
    """-> (uid, lock fd). Waits when all slots are busy."""
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    start = random.randrange(UID_SLOTS)
    while True:
        for k in range(UID_SLOTS):
            uid = UID_BASE + (start + k) % UID_SLOTS
            fd = os.open(LOCK_DIR / f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return uid, fd
            except OSError:
                os.close(fd)
        time.sleep(0.01)


def _uid_pidfds(uid: int) -> list[int]:
    """pidfds of the live (non-zombie) processes whose real or effective uid is `uid`."""
    fds = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            pidfd = os.pidfd_open(int(entry))
        except OSError:
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                status = f.read()
            line = status[status.index(b"\nUid:") + 5:].split(b"\n", 1)[0].split()
            zombie = b"\nState:\tZ" in status  # already dead; its reaper collects it
            if uid in (int(line[0]), int(line[1])) and not zombie:
                fds.append(pidfd)
                continue
        except (OSError, ValueError, IndexError):
            pass
        os.close(pidfd)
    return fds


def kill_uid(uid: int, grace_s: float = 0.0, rounds: int = 50) -> int:
    """SIGKILL every process of `uid` (root only) that is still alive after `grace_s` seconds
    (time for a group that was already SIGKILLed to finish dying), via pidfds so a recycled pid
    is never hit. Repeats until a scan finds none (a forking process may race). Returns how
    many processes it had to kill: survivors of the group kill."""
    deadline = time.monotonic() + grace_s
    killed = 0
    for _ in range(rounds + int(grace_s / 0.005) + 1):
        fds = _uid_pidfds(uid)
        if not fds:
            return killed
        if time.monotonic() >= deadline:
            for fd in fds:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed += 1
                except OSError:
                    pass
        for fd in fds:
            os.close(fd)
        time.sleep(0.005)
    return killed


class Box:
    """A fresh sandbox home for ONE process: base dir (root-owned 0755) with
    `code/main.py` (read-only candidate source), `work/` (the candidate's cwd, owned by the slot
    uid) and `py/` (mount point for the interpreter, root only)."""

    def __init__(self, code: str | None):
        self.iso = isolation()
        self.uid, self._lock_fd = _acquire_slot() if self.iso.root else (os.getuid(), -1)
        if self.iso.root:
            kill_uid(self.uid)  # a slot starts empty even if a previous grader died mid-run
        tmp = tempfile.gettempdir()
        hide = hidden_ancestor() if self.iso.root else None
        if hide and (tmp + "/").startswith(hide + "/"):
            tmp = "/tmp"  # the box must not live under the directory the sandbox covers
        self.base = Path(tempfile.mkdtemp(prefix=f"rlvr-sbx-{self.uid}-", dir=tmp))
        if self.iso.root:
            # Boxes of this uid left by a grader that was killed mid-run: we hold the slot's
            # lock now, so nobody else can be using them.
            for stale in Path(tmp).glob(f"rlvr-sbx-{self.uid}-*"):
                if stale != self.base:
                    shutil.rmtree(stale, ignore_errors=True)
        os.chmod(self.base, 0o755)
        self.code_dir = self.base / "code"
        self.work = self.base / "work"
        self.stash = self.base / "py"
        self.code_dir.mkdir()
        self.work.mkdir(mode=0o700)
        self.stash.mkdir()
        if code is not None:
            main = self.code_dir / "main.py"
            main.write_text(code, encoding="utf-8")
            os.chmod(main, 0o444)
        os.chmod(self.code_dir, 0o755)
        if self.iso.root:
            os.chown(self.work, self.uid, self.uid)

    def close(self) -> int:
        """Kill leftovers of the slot uid, remove the dirs, free the slot. Returns #killed."""
        killed = 0
        if self.iso.root:
            killed = kill_uid(self.uid, grace_s=0.5)
        shutil.rmtree(self.base, ignore_errors=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        return killed


@dataclass
class ProcResult:
    """What one sandboxed process did. `killed` is None, "timeout" (wall deadline), or
    "output" (stdout over the cap); `returncode` is negative for a signal (-9 SIGKILL, -24 SIGXCPU)."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    killed: str | None
    flags: list[tuple[str, str]] = field(default_factory=list)
    isolation: str = ""
    markers: set[str] = field(default_factory=set)  # "ready", "done" written by the harness
    wall_s: float = 0.0
    leftovers: int = 0  # processes of the slot uid still alive after the group kill


class _Proc:
    def __init__(self, box: Box, mode: str, limits: SandboxLimits, stdin: bytes | None,
                 fds: dict[str, int], extra: dict):
        exe, prefix = interpreter()
        self.box, self.limits = box, limits
        flag_r, flag_w = os.pipe()
        iso = box.iso
        # +2: the relay and the pid-namespace reaper (see _harness.enter_pid_namespace)
        nproc = limits.max_processes + 2 + (0 if iso.root else _user_process_count())
        cfg = {"root": iso.root, "mode": mode, "grader_pid": os.getpid(), "uid": box.uid, "work": str(box.work),
               "code_dir": str(box.code_dir), "prefix": prefix, "stash": str(box.stash),
               "hide": hidden_ancestor() if iso.root else None,
               "limits": limits.to_harness(nproc), "flag_fd": flag_w, "max_forks": limits.max_processes,
               "max_request_bytes": 1 << 22, "max_response_bytes": limits.output_bytes, **fds, **extra}
        # A clean environment: nothing of the grader's (which may hold secrets) is inherited.
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(box.work), "TMPDIR": str(box.work)}
        self.t0 = time.monotonic()
        self.popen = subprocess.Popen(
            [exe, "-I", "-S", "-B", "-c", HARNESS_SOURCE, marshal.dumps(cfg).hex()],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(box.work),
            close_fds=True, pass_fds=(flag_w, *fds.values()), start_new_session=True)
        os.close(flag_w)
        self.pgid = self.popen.pid
        self.stdin_data = memoryview(stdin or b"")
        self.out = bytearray()
        self.err = bytearray()
        self.flagbuf = bytearray()
        self.flag_r = flag_r
        self.killed: str | None = None
        self.returncode: int | None = None
        self.exited_at: float | None = None
        self.pidfd = -1

    def kill(self, reason: str | None) -> None:
        if reason and self.killed is None and self.returncode is None:
            self.killed = reason
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except OSError:
            pass


def _user_process_count() -> int:
    uid = os.getuid()
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return n


def run_processes(specs: list[dict], wall_s: float) -> list[ProcResult]:
    """Spawn every spec (dict with box, mode, limits, stdin, fds, extra) together and supervise
    them until all have exited or `wall_s` has passed (then everything is SIGKILLed and marked
    "timeout"). Descriptors named in a spec's `fds` are closed here once the children hold them."""
    procs: list[_Proc] = []
    try:
        for s in specs:
            procs.append(_Proc(s["box"], s["mode"], s["limits"], s.get("stdin"), s.get("fds", {}),
                               s.get("extra", {})))
    finally:
        for s in specs:
            for fd in s.get("fds", {}).values():
                try:
                    os.close(fd)
                except OSError:
                    pass
    sel = selectors.DefaultSelector()
    for p in procs:
        for f, kind in ((p.popen.stdout, "out"), (p.popen.stderr, "err")):
            os.set_blocking(f.fileno(), False)
            sel.register(f.fileno(), selectors.EVENT_READ, (p, kind))
        os.set_blocking(p.flag_r, False)
        sel.register(p.flag_r, selectors.EVENT_READ, (p, "flag"))
        try:  # a pidfd becomes readable when the process exits: no polling latency
            p.pidfd = os.pidfd_open(p.popen.pid)
            sel.register(p.pidfd, selectors.EVENT_READ, (p, "exit"))
        except OSError:
            p.pidfd = -1
        if p.popen.stdin is not None:
            os.set_blocking(p.popen.stdin.fileno(), False)
            if len(p.stdin_data):
                sel.register(p.popen.stdin.fileno(), selectors.EVENT_WRITE, (p, "in"))
            else:
                p.popen.stdin.close()
    deadline = time.monotonic() + wall_s
    open_fds = {key.fd for key in sel.get_map().values() if key.data[1] != "exit"}
    grace = 0.25  # after a process exits, how long its (killed) descendants may hold the pipes
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                for p in procs:
                    p.kill("timeout")
                break
            for p in procs:
                if p.returncode is None:
                    rc = p.popen.poll()
                    if rc is not None:
                        p.returncode, p.exited_at = rc, now
                        p.kill(None)  # the group dies with its leader, always
            if all(p.exited_at is not None for p in procs) and (
                    not open_fds or all(now - p.exited_at > grace for p in procs)):
                break
            for key, _ in sel.select(timeout=min(0.05, max(deadline - now, 0.0))):
                p, kind = key.data
                fd = key.fd
                if kind == "exit":
                    sel.unregister(fd)
                    continue
                if kind == "in":
                    try:
                        n = os.write(fd, p.stdin_data[:65536])
                        p.stdin_data = p.stdin_data[n:]
                    except (BrokenPipeError, OSError):
                        p.stdin_data = memoryview(b"")
                    if not len(p.stdin_data):
                        sel.unregister(fd)
                        open_fds.discard(fd)
                        p.popen.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                if kind == "out":
                    room = p.limits.output_bytes - len(p.out)
                    p.out += chunk[:max(room, 0)]
                    if len(chunk) > room:
                        p.kill("output")
                elif kind == "err":
                    p.err += chunk[:max(STDERR_CAP - len(p.err), 0)]
                elif len(p.flagbuf) < 65536:
                    p.flagbuf += chunk
    finally:
        sel.close()
        results = []
        for p in procs:
            p.kill(None)
            try:
                rc = p.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                rc = None
            if p.returncode is None:
                p.returncode = rc
            for f in (p.popen.stdout, p.popen.stderr, p.popen.stdin):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
            os.close(p.flag_r)
            if p.pidfd >= 0:
                os.close(p.pidfd)
            results.append(_result(p))
    return results


def _result(p: _Proc) -> ProcResult:
    flags, markers, iso = [], set(), ""
    for line in bytes(p.flagbuf).decode("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if parts[0] == "flag" and len(parts) >= 3:
            flags.append((parts[1], parts[2]))
        elif parts[0] == "isolation" and len(parts) >= 2:
            iso = parts[1]
        elif parts[0] in ("ready", "done"):
            markers.add(parts[0])
    end = p.exited_at if p.exited_at is not None else time.monotonic()
    return ProcResult(returncode=p.returncode, stdout=bytes(p.out), stderr=bytes(p.err), killed=p.killed,
                      flags=flags, isolation=iso, markers=markers, wall_s=end - p.t0)
