"""Grader side of the sandbox: one fresh box (temp dirs + unprivileged uid slot) per process,
spawn the harness (rlvr/rewards/code/harness.py) in its own session, feed its stdin, read its
outputs with byte caps, enforce the wall-clock deadline, kill the whole process group (and, as
root, every process of the slot's uid) at the end, and remove the box.

What holds where is documented in docs/code_rewards.md ("Isolation"). In short, as root:
own session + process group, per-slot uid (61000+ by default, RLVR_SANDBOX_UID_BASE), a cgroup v2
per box where the machine delegates one (memory, pids, CPU; else per-process rlimits only, with
a warning), rlimits, network + mount + PID + IPC namespace, size-capped tmpfs work dir, Landlock
filesystem allow-list, seccomp socket-family filter, clean environment, no inherited fds. Not
root: the same minus the uid drop and the tmpfs (Landlock, seccomp and a user+network+IPC
namespace do not need root); the isolation report says so (`Isolation.strong` is False).
"""

from __future__ import annotations

import fcntl
import logging
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
from functools import lru_cache, wraps
from pathlib import Path

from rlvr.rewards.code import harness

HARNESS_SOURCE = Path(harness.__file__).read_text(encoding="utf-8")
UID_BASE = int(os.environ.get("RLVR_SANDBOX_UID_BASE", "61000"))
UID_SLOTS = 512
LOCK_DIR = Path(tempfile.gettempdir()) / "rlvr-sandbox-locks"
ANSWER_SLACK_S = 0.25  # grader-side backstop for a call's answer, beyond the per-test limit

log = logging.getLogger(__name__)


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
    test_s: float = 0.0  # per-test time limit inside the process (0: only the wall clock)

    def to_harness(self, nproc: int) -> dict:
        return {"cpu_s": self.cpu_s, "memory_mb": self.memory_mb, "file_size_mb": self.file_size_mb,
                "disk_mb": self.disk_mb, "max_open_files": self.max_open_files, "nproc": nproc,
                "test_s": float(self.test_s)}


STDERR_CAP = 8 << 10  # stderr bytes kept per process; the rest is discarded in the kernel


def _probed_once(fn):
    """lru_cache that also runs `fn` only once when many grader threads ask at the same time
    (so its warnings are logged once). `cache_clear` is kept for tests."""
    cached = lru_cache(maxsize=1)(fn)
    lock = threading.Lock()

    @wraps(fn)
    def wrapper():
        with lock:
            return cached()

    wrapper.cache_clear = cached.cache_clear
    return wrapper


@dataclass(frozen=True)
class Isolation:
    """What this machine gives the sandbox. `strong` means: distinct unprivileged uid per box,
    network namespace, Landlock and seccomp all active."""

    root: bool
    landlock_abi: int
    seccomp: bool
    strong: bool
    notes: str
    cgroup: bool = False  # a cgroup v2 per box (memory, pids, CPU); False: per-process rlimits


@_probed_once
def isolation() -> Isolation:
    """What this machine gives the sandbox; probed once. Warns (logged, once) where the
    isolation is weaker than documented: no seccomp filter (not x86_64), no cgroup."""
    import ctypes
    import platform

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        abi = max(0, int(libc.syscall(444, None, 0, 1)))
    except OSError:
        abi = 0
    root = os.geteuid() == 0
    machine = platform.machine()
    seccomp = machine == "x86_64" and sys.platform == "linux"
    if not seccomp:
        log.warning(
            "rlvr sandbox: NO seccomp filter on this machine (%s; the filter is x86_64 only). "
            "Socket families other than AF_UNIX are NOT blocked by the kernel: AF_VSOCK reaches "
            "the host of a virtual machine even from inside the network namespace, and ptrace, "
            "unshare, io_uring, bpf ... are not denied. Treat code rewards on this machine as "
            "weakly isolated (Isolation.strong is False).", machine)
    strong = root and abi >= 1 and seccomp
    cg = cgroup_support()
    notes = ("root: uid drop per slot, netns+mountns+ipcns, tmpfs work dir" if root
             else "NOT root: same uid as the grader (weaker: no uid separation)")
    notes += "; cgroup per box" if cg.available else "; rlimits only (no cgroup: " + cg.reason + ")"
    return Isolation(root, abi, seccomp, strong, notes, cg.available)


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
# cgroup v2 per box: memory (RSS + tmpfs, no swap, the whole box OOM-killed together), pids
# (processes AND threads of the box) and CPU bandwidth (one CPU per box). Used when the machine
# delegates a cgroup v2 subtree with the memory and pids controllers to the grader; otherwise the
# per-process rlimits (always set anyway) are all there is, and a warning says so once.
# ----------------------------------------------------------------------------------------------

CGROUP_ENV = "RLVR_SANDBOX_CGROUP"  # a delegated cgroup v2 dir (no processes of its own) to use
CGROUP_PREFIX = "rlvr-box-"
_CGROUP_FAILED: list[str] = []  # set on the first failure to create a box cgroup (warned once)


@dataclass(frozen=True)
class CgroupSupport:
    available: bool
    base: Path | None = None  # boxes are created as children of this cgroup
    controllers: tuple[str, ...] = ()  # enabled for the boxes, among cpu, memory, pids
    reason: str = ""  # why not, when not available


def _cgroup2_mount() -> Path | None:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                if post.split(" ", 1)[0] == "cgroup2":
                    return Path(pre.split()[4])
    except OSError:
        pass
    return None


def _read(path: Path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _probe_cgroup() -> CgroupSupport:
    if sys.platform != "linux":
        return CgroupSupport(False, reason="not Linux")
    mount = _cgroup2_mount()
    if mount is None:
        return CgroupSupport(False, reason="no cgroup2 filesystem mounted (cgroup v1 only)")
    env = os.environ.get(CGROUP_ENV, "").strip()
    if env:
        base = Path(env) if env.startswith("/") else mount / env
    else:
        try:
            own = next(line[3:].strip() for line in _read(Path("/proc/self/cgroup")).splitlines()
                       if line.startswith("0::"))
        except (OSError, StopIteration):
            return CgroupSupport(False, reason="this process has no cgroup v2 membership")
        base = mount / own.lstrip("/")
    try:
        available = _read(base / "cgroup.controllers").split()
    except OSError as e:
        return CgroupSupport(False, reason=f"cannot read {base}/cgroup.controllers ({e.strerror})")
    missing = [c for c in ("memory", "pids") if c not in available]
    if missing:
        return CgroupSupport(False, reason=f"controllers {'+'.join(missing)} not available in {base} "
                                           "(held by cgroup v1 hierarchies, or not delegated)")
    if not os.access(base, os.W_OK):
        return CgroupSupport(False, reason=f"{base} is not writable (not delegated to uid {os.geteuid()})")
    enabled = set(_read(base / "cgroup.subtree_control").split())
    for c in ("memory", "pids", "cpu"):
        if c in available and c not in enabled:
            try:
                _write(base / "cgroup.subtree_control", "+" + c)
                enabled.add(c)
            except OSError as e:
                if c != "cpu":  # cpu is optional (e.g. refused with realtime processes around)
                    return CgroupSupport(False, reason=(
                        f"cannot enable {c} in {base}/cgroup.subtree_control ({e.strerror}): a cgroup that "
                        f"holds processes cannot delegate controllers; point {CGROUP_ENV} at an empty "
                        "delegated cgroup"))
    probe = base / f"rlvr-probe-{os.getpid()}-{random.randrange(1 << 30)}"
    try:
        probe.mkdir()
        try:
            ok = (probe / "memory.max").exists() and (probe / "pids.max").exists()
        finally:
            probe.rmdir()
    except OSError as e:
        return CgroupSupport(False, reason=f"cannot create a cgroup under {base} ({e.strerror})")
    if not ok:
        return CgroupSupport(False, reason=f"a cgroup under {base} has no memory/pids files")
    return CgroupSupport(True, base, tuple(c for c in ("cpu", "memory", "pids") if c in enabled))


@_probed_once
def cgroup_support() -> CgroupSupport:
    """Probed once per process; the fallback is logged once, as a warning."""
    support = _probe_cgroup()
    if not support.available:
        # One short line (it used to be a paragraph on every run); the reason and the details are at INFO
        # level, in isolation().notes and in docs/code_rewards.md ("Resource limits per box").
        log.warning("rlvr sandbox: no cgroup v2, so limits are per process (rlimits); %s=DIR limits each box",
                    CGROUP_ENV)
        log.info("rlvr sandbox: no cgroup v2 for the boxes: %s; falling back to per-process rlimits (RLIMIT_AS "
                 "memory and RLIMIT_CPU per process, RLIMIT_NPROC per uid). Set %s to a delegated cgroup v2 "
                 "directory to limit each box as a whole.", support.reason, CGROUP_ENV)
    return support


class BoxCgroup:
    """The cgroup of one box (one sandboxed process and everything it starts)."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, base: Path, name: str, limits: SandboxLimits,
               controllers: tuple[str, ...] = ("cpu", "memory", "pids")) -> BoxCgroup:
        path = base / name
        path.mkdir(mode=0o755)
        cg = cls(path)
        try:
            # +2: the relay and the pid-namespace reaper (as for RLIMIT_NPROC); threads count too
            _write(path / "pids.max", str(limits.max_processes + 2))
            _write(path / "memory.max", str(limits.memory_mb << 20))
            for fname, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                try:
                    _write(path / fname, value)
                except OSError:  # no swap accounting / old kernel: the limits above still hold
                    pass
            if "cpu" in controllers:
                _write(path / "cpu.max", "100000 100000")  # one CPU per box, whatever it forks
        except OSError:
            cg.close()
            raise
        return cg

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in _read(self.path / "cgroup.procs").split()]
        except (OSError, ValueError):
            return []

    def _populated(self) -> bool:
        try:
            return "populated 1" in _read(self.path / "cgroup.events")
        except OSError:
            return bool(self.pids())

    def close(self, grace_s: float = 0.0) -> int:
        """Kill whatever is still in the cgroup after `grace_s` (processes of a group that was
        already SIGKILLed may still be dying), wait until it is empty, remove it. Returns how
        many processes had to be killed."""
        deadline = time.monotonic() + grace_s
        while self._populated() and time.monotonic() < deadline:
            time.sleep(0.005)
        alive = self.pids()
        try:
            _write(self.path / "cgroup.kill", "1")  # kernel >= 5.14: the whole cgroup at once
        except OSError:
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for _ in range(400):  # ~2 s; SIGKILLed processes leave quickly
            if not self._populated():
                break
            for pid in self.pids():  # forked after the kill (pre-5.14 fallback)
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.005)
        try:
            self.path.rmdir()
        except OSError as e:
            mount = _cgroup2_mount()
            if mount is None or mount not in self.path.parents:
                shutil.rmtree(self.path, ignore_errors=True)  # a stand-in directory (tests)
            else:
                log.warning("rlvr sandbox: could not remove the box cgroup %s (%s)", self.path, e.strerror)
        return len(alive)


def live_box_cgroups() -> list[Path]:
    """Box cgroups of THIS grader process that still exist (for cleanliness checks)."""
    support = cgroup_support()
    if not support.available or support.base is None:
        return []
    return sorted(support.base.glob(f"{CGROUP_PREFIX}{os.getpid()}-*"))


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
        self.cgroup: BoxCgroup | None = None

    def open_cgroup(self, limits: SandboxLimits) -> str | None:
        """The box's own cgroup (the harness joins it first thing), or None where the machine
        gives none: then the per-process rlimits are the only limits (warned once)."""
        support = cgroup_support()
        if not support.available or support.base is None:
            return None
        name = f"{CGROUP_PREFIX}{os.getpid()}-{self.uid}-{random.randrange(1 << 40):010x}"
        try:
            self.cgroup = BoxCgroup.create(support.base, name, limits, support.controllers)
        except OSError as e:
            if not _CGROUP_FAILED:  # once: a persistent failure would otherwise log per box
                _CGROUP_FAILED.append(e.strerror)
                log.warning("rlvr sandbox: could not create a box cgroup under %s (%s); such boxes have "
                            "rlimits only (the isolation notes of their reports lack 'cgroup')",
                            support.base, e.strerror)
            return None
        return str(self.cgroup.path)

    def close(self) -> int:
        """Kill leftovers of the slot uid and of the box's cgroup, remove the dirs and the
        cgroup, free the slot. Returns #killed."""
        killed = 0
        if self.iso.root:
            killed = kill_uid(self.uid, grace_s=0.5)
        if self.cgroup is not None:
            killed += self.cgroup.close(grace_s=0.5)
            self.cgroup = None
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
    markers: set[str] = field(default_factory=set)  # "start", "ready", "done" written by the harness
    wall_s: float = 0.0
    leftovers: int = 0  # processes of the slot uid still alive after the group kill
    stderr_bytes: int = 0  # everything written to stderr; `stderr` keeps the first STDERR_CAP
    pid: int = 0  # of the harness process (the box's first process)


class _Proc:
    def __init__(self, box: Box, mode: str, limits: SandboxLimits, stdin: bytes | None,
                 fds: dict[str, int], extra: dict, per_test: str | None = None):
        exe, prefix = interpreter()
        self.box, self.limits = box, limits
        # Grader-side per-test deadline: "start" = the limit counts from the harness's start
        # marker (script mode, one test per process); "answers" = from the ready marker, then
        # from each answer line on stdout (serve mode, calls), plus ANSWER_SLACK_S.
        self.per_test = per_test if limits.test_s > 0 else None
        self.test_deadline: float | None = None
        self.test_armed = False
        self.flag_pos = 0
        cgroup = box.open_cgroup(limits)
        flag_r, flag_w = os.pipe()
        iso = box.iso
        # +2: the relay and the pid-namespace reaper (see harness.enter_pid_namespace)
        nproc = limits.max_processes + 2 + (0 if iso.root else _user_process_count())
        cfg = {"root": iso.root, "mode": mode, "grader_pid": os.getpid(), "uid": box.uid, "work": str(box.work),
               "cgroup": cgroup,
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
        self.err_bytes = 0
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


def _flag_lines(p: _Proc) -> list[bytes]:
    """Complete flag lines that arrived since the last call (each byte is looked at once)."""
    end = p.flagbuf.rfind(b"\n") + 1
    if end <= p.flag_pos:
        return []
    lines = bytes(p.flagbuf[p.flag_pos:end]).split(b"\n")[:-1]
    p.flag_pos = end
    return lines


def _discard(fd: int, sink: int) -> int:
    """Drop what is readable on the pipe `fd` inside the kernel (splice to /dev/null): the bytes
    never reach this process. Returns how many were dropped; 0 at end of file; -1 if nothing
    was readable yet."""
    try:
        return os.splice(fd, sink, 1 << 20, flags=getattr(os, "SPLICE_F_NONBLOCK", 2))
    except BlockingIOError:
        return -1
    except OSError:  # no splice here: read into a small buffer and forget it
        try:
            return len(os.read(fd, 65536))
        except BlockingIOError:
            return -1
        except OSError:
            return 0


def run_processes(specs: list[dict], wall_s: float) -> list[ProcResult]:
    """Spawn every spec (dict with box, mode, limits, stdin, fds, extra, per_test) together and
    supervise them until all have exited or `wall_s` has passed (then everything is SIGKILLed
    and marked "timeout"). A process whose per-test deadline (see _Proc.per_test) passes is
    killed alone, also marked "timeout". Descriptors named in a spec's `fds` are closed here
    once the children hold them."""
    procs: list[_Proc] = []
    try:
        for s in specs:
            procs.append(_Proc(s["box"], s["mode"], s["limits"], s.get("stdin"), s.get("fds", {}),
                               s.get("extra", {}), s.get("per_test")))
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
    sink = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                for p in procs:
                    p.kill("timeout")
                break
            for p in procs:
                if p.test_deadline is not None and now >= p.test_deadline and p.returncode is None:
                    p.kill("timeout")  # this test ran past its own limit: the others go on
                    p.test_deadline = None
            for p in procs:
                if p.returncode is None:
                    rc = p.popen.poll()
                    if rc is not None:
                        p.returncode, p.exited_at = rc, now
                        p.kill(None)  # the group dies with its leader, always
            if all(p.exited_at is not None for p in procs) and (
                    not open_fds or all(now - p.exited_at > grace for p in procs)):
                break
            wake = min([deadline] + [p.test_deadline for p in procs if p.test_deadline is not None])
            for key, _ in sel.select(timeout=min(0.05, max(wake - now, 0.0))):
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
                if kind == "err" and len(p.err) >= STDERR_CAP:
                    # Over the cap: cut at the source. The rest of a stderr flood is dropped in
                    # the kernel without ever being copied here (the writer is not blocked, so
                    # an honest chatty program still runs; only the first STDERR_CAP is kept).
                    n = _discard(fd, sink)
                    if n > 0:
                        p.err_bytes += n
                    elif n == 0:
                        sel.unregister(fd)
                        open_fds.discard(fd)
                    continue
                try:
                    # never more than the cap's remainder of stderr into this process
                    chunk = os.read(fd, 65536 if kind != "err" else min(65536, STDERR_CAP - len(p.err)))
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
                    if p.per_test == "answers" and p.test_deadline is not None and b"\n" in chunk:
                        p.test_deadline = time.monotonic() + p.limits.test_s + ANSWER_SLACK_S
                elif kind == "err":
                    p.err += chunk
                    p.err_bytes += len(chunk)
                else:
                    if len(p.flagbuf) < 65536:
                        p.flagbuf += chunk
                    if p.per_test and not p.test_armed:
                        # Only the FIRST marker counts: the harness writes it before any candidate
                        # code runs (script: "start") or after the import (serve: "ready"); one
                        # written by the candidate can only start its own clock early. A flood
                        # that fills the buffer first starts the clock too.
                        marker = b"start" if p.per_test == "start" else b"ready"
                        if marker in _flag_lines(p) or len(p.flagbuf) >= 65536:
                            slack = ANSWER_SLACK_S if p.per_test == "answers" else 0.0
                            p.test_deadline = time.monotonic() + p.limits.test_s + slack
                            p.test_armed = True
    finally:
        sel.close()
        os.close(sink)
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
        elif parts[0] == "isolation" and len(parts) >= 2 and not iso:  # the harness's, written first
            iso = parts[1]
        elif parts[0] in ("start", "ready", "done"):
            markers.add(parts[0])
    end = p.exited_at if p.exited_at is not None else time.monotonic()
    return ProcResult(returncode=p.returncode, stdout=bytes(p.out), stderr=bytes(p.err), killed=p.killed,
                      flags=flags, isolation=iso, markers=markers, wall_s=end - p.t0,
                      stderr_bytes=p.err_bytes, pid=p.popen.pid)
