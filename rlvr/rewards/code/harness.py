"""The program that runs INSIDE a sandbox. Stdlib only, self-contained: the grader passes this
file's source with `python -I -S -B -c <source> <json config>`, so nothing of rlvr is importable
(or even readable) in the sandbox. The grader also imports this module for the value codec, so
both sides share one definition of how values cross the process boundary.

Stages (see docs/code_rewards.md for what each one guarantees):

stage 0 (before anything else)
    join the box's cgroup (v2) when the grader made one: memory, pids and CPU are then limited
    for the box as a whole, and every process the box ever starts is in it.
stage 1 (root only; runs as root, before any untrusted byte is read)
    unshare a network + mount + PID + IPC namespace, bind the Python installation read-only onto a
    world-readable mount point (the interpreter may live under a 0700 directory such as /root),
    mount a size-capped tmpfs on the work directory, drop to the slot's unprivileged uid/gid with
    no supplementary groups, then exec stage 2 from the bound interpreter.
stage 2 (unprivileged)
    no_new_privs, Landlock (filesystem allow-list, TCP deny, signal + abstract-socket scoping),
    a seccomp filter (socket families other than AF_UNIX, ptrace, process_vm_*, setsid/setpgid,
    namespaces, mount, io_uring, bpf ... -> EPERM), an audit hook that FLAGS (and blocks)
    suspicious Python-level actions, then one of three modes:
      script  run the candidate as __main__ with the test's stdin (stdin/stdout tests)
      serve   import the candidate, answer call requests (JSON lines) on a pipe
      check   (the test process, never shares memory with the candidate) run assert-based test
              code whose `candidate`/entry point is a proxy that calls the serve process.

The rlimits are set by stage 1 (or, when not root, by stage 2 itself before anything else).

Per-test time limits (limits["test_s"]): script mode writes a "start" marker just before the
candidate runs (the grader's deadline for the test counts from it); serve mode arms an alarm for
each call and measures the call itself (the grader also kills a serve process whose next answer
is late); check mode arms an alarm for each test.
"""

import os
import sys

# ----------------------------------------------------------------------------------------------
# Value codec: candidate return values cross the boundary as tagged JSON, decoded on the trusted
# side into EXACT builtin types. A candidate cannot smuggle an object whose __eq__ always returns
# True (the "always equal" hack): only data crosses, never objects.
# ----------------------------------------------------------------------------------------------

MAX_DEPTH = 64
MAX_INT_DIGITS = 4300  # Python's default int <-> str digit limit (sys.set_int_max_str_digits)
_INT_BOUND = 10 ** MAX_INT_DIGITS


def encode_value(value, depth=0):
    """Python value -> JSON-able tagged structure. Runs on the untrusted side; anything it does is
    just part of the candidate's answer. Raises TypeError for unsupported types."""
    if depth > MAX_DEPTH:
        raise TypeError("value nested too deeply")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        # over the digit limit: a ValueError now (O(size)), whatever limit the candidate set with
        # sys.set_int_max_str_digits, never a quadratic int -> str conversion that spins to the deadline
        v = int(value)  # an exact int (a subclass's comparisons are not trusted)
        if v >= _INT_BOUND or v <= -_INT_BOUND:
            raise ValueError(f"integer result over {MAX_INT_DIGITS} digits (Python's int to str limit)")
        return v
    if isinstance(value, float):
        f = float(value)
        if f - f == 0.0:  # finite (inf - inf and nan - nan are nan)
            return f
        return {"__float__": repr(f)}
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        tag = {list: None, tuple: "__tuple__", set: "__set__", frozenset: "__frozenset__"}
        kind = next(t for t in (list, tuple, frozenset, set) if isinstance(value, t))
        items = [encode_value(v, depth + 1) for v in value]
        if kind in (set, frozenset):
            import json

            items.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return items if tag[kind] is None else {tag[kind]: items}
    if isinstance(value, dict):
        return {"__dict__": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": bytes(value).hex()}
    raise TypeError(f"cannot return a value of type {type(value).__name__}")


def decode_value(data, depth=0):
    """Tagged JSON -> exact builtin types (trusted side). Raises ValueError on malformed input."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode_value(v, depth + 1) for v in data]
    if type(data) is dict and len(data) == 1:
        (tag, body), = data.items()
        if tag == "__float__" and type(body) is str and body in ("inf", "-inf", "nan"):
            return float(body)
        if tag == "__bytes__" and type(body) is str:
            return bytes.fromhex(body)
        if type(body) is list:
            items = [decode_value(v, depth + 1) for v in body]
            if tag == "__tuple__":
                return tuple(items)
            if tag == "__set__":
                return set(items)
            if tag == "__frozenset__":
                return frozenset(items)
            if tag == "__dict__" and all(type(p) is list and len(p) == 2 for p in items):
                return {k: v for k, v in items}
    raise ValueError("malformed encoded value")


# ----------------------------------------------------------------------------------------------
# Kernel-level confinement (Linux, via ctypes). Each function returns a short note for the
# isolation report instead of raising: the grader decides whether weaker isolation is acceptable.
# ----------------------------------------------------------------------------------------------

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 38, 22

# x86_64 syscall numbers denied by the seccomp filter (-> EPERM) and why:
DENIED_SYSCALLS = {
    101: "ptrace", 310: "process_vm_readv", 311: "process_vm_writev",  # read other processes
    112: "setsid", 109: "setpgid",  # leaving the process group would escape killpg
    272: "unshare", 308: "setns", 165: "mount", 166: "umount2", 155: "pivot_root", 161: "chroot",
    321: "bpf", 298: "perf_event_open", 323: "userfaultfd", 250: "keyctl", 248: "add_key",
    249: "request_key", 425: "io_uring_setup",  # io_uring can open sockets behind seccomp's back
    424: "pidfd_send_signal", 129: "rt_sigqueueinfo", 297: "rt_tgsigqueueinfo",  # see kill rules
    246: "kexec_load", 175: "init_module", 313: "finit_module", 169: "reboot",
}
SOCKET_SYSCALLS = (41, 53)  # socket, socketpair: only AF_UNIX (1) allowed


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def set_rlimits(limits):
    import resource

    cpu = int(limits["cpu_s"])
    mem = int(limits["memory_mb"]) * 1024 * 1024
    pairs = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_FSIZE, (int(limits["file_size_mb"]) * 1024 * 1024,) * 2),
        (resource.RLIMIT_NOFILE, (int(limits["max_open_files"]),) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NPROC, (int(limits["nproc"]),) * 2),
    ]
    for res, val in pairs:
        resource.setrlimit(res, val)


def build_seccomp_program(grader_pid=0, own_pid=0):
    """Classic BPF for seccomp (x86_64). Returns a list of (code, jt, jf, k).

    Signals: kill(-1) (every process of the uid: with the grader's uid when not root, the whole
    session) and kill/tkill/tgkill of the grader's pid are denied, and kill of a negative pid
    (a process group) only for the box's own group. This matters when not root on kernels
    without Landlock signal scoping; other positive pids are left to the kernel's uid check."""
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, errno_eperm, kill = 0x7FFF0000, 0x00050000 | 1, 0x80000000
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, 0xC000003E), (ret, 0, 0, kill), (ld_abs, 0, 0, 0)]
    # x32 ABI syscall numbers (bit 30) would dodge the number checks below.
    prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, errno_eperm)]
    for nr in DENIED_SYSCALLS:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, errno_eperm)]
    for nr in SOCKET_SYSCALLS:
        # socket(family, ...): args[0] low word at offset 16 on little-endian.
        prog += [(jeq, 0, 4, nr), (ld_abs, 0, 0, 16), (jeq, 0, 1, 1), (ret, 0, 0, allow),
                 (ret, 0, 0, 0x00050000 | 13)]  # EACCES
    if grader_pid and own_pid:
        own_group = (-own_pid) & 0xFFFFFFFF
        prog += [(jeq, 0, 9, 62),  # kill(pid, sig)
                 (ld_abs, 0, 0, 16), (jeq, 0, 1, 0xFFFFFFFF), (ret, 0, 0, errno_eperm),
                 (jeq, 0, 1, grader_pid), (ret, 0, 0, errno_eperm),
                 (jge, 0, 2, 0x80000000), (jeq, 1, 0, own_group), (ret, 0, 0, errno_eperm),
                 (ret, 0, 0, allow)]
        for nr in (200, 234):  # tkill(tid, sig), tgkill(tgid, tid, sig)
            prog += [(jeq, 0, 4, nr), (ld_abs, 0, 0, 16), (jeq, 0, 1, grader_pid), (ret, 0, 0, errno_eperm),
                     (ret, 0, 0, allow)]
    prog.append((ret, 0, 0, allow))
    return prog


def install_seccomp(grader_pid, own_pid):
    machine = os.uname().machine
    if machine != "x86_64":
        return "seccomp: unsupported architecture " + machine
    ctypes, libc = _libc()

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    prog = build_seccomp_program(grader_pid, own_pid)
    arr = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), ctypes.cast(arr, ctypes.POINTER(SockFilter)))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return "seccomp: no_new_privs failed"
    if libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0) != 0:
        return "seccomp: failed errno " + str(ctypes.get_errno())
    return "seccomp"


def install_landlock(read_paths, rw_paths, dev_paths):
    """Filesystem allow-list; with ABI >= 4 deny all TCP bind/connect; with ABI >= 6 scope signals
    and abstract unix sockets to the sandbox's own domain (so it cannot signal the grader or
    another sandbox even under the same uid)."""
    ctypes, libc = _libc()
    abi = libc.syscall(444, None, 0, 1)
    if abi < 1:
        return "landlock: unavailable"
    fs_all = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
    if abi >= 2:
        fs_all |= 1 << 13  # REFER
    if abi >= 3:
        fs_all |= 1 << 14  # TRUNCATE
    read_dir = 1 | (1 << 2) | (1 << 3)  # EXECUTE | READ_FILE | READ_DIR
    file_rw = (1 << 1) | (1 << 2) | ((1 << 14) if abi >= 3 else 0)
    attr = [fs_all, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0]
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    buf = (ctypes.c_uint64 * 3)(*attr)
    rs = libc.syscall(444, buf, size, 0)
    if rs < 0:
        return "landlock: create_ruleset failed errno " + str(ctypes.get_errno())

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def add(path, access):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        if not os.path.isdir(path):
            access &= (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14)
        rule = PathBeneath(access & fs_all, fd)
        libc.syscall(445, rs, 1, ctypes.byref(rule), 0)
        os.close(fd)

    for p in read_paths:
        add(p, read_dir)
    for p in dev_paths:
        add(p, file_rw)
    for p in rw_paths:
        add(p, fs_all)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.syscall(446, rs, 0) != 0:
        return "landlock: restrict_self failed errno " + str(ctypes.get_errno())
    os.close(rs)
    return f"landlock-abi{abi}"


def join_cgroup(path):
    """Move this process (and so everything it will ever start) into the box's cgroup. Runs
    first, before any untrusted byte is read; the cgroup's files are the grader's, the
    candidate cannot write them (root-owned as root; Landlock keeps /sys out of reach)."""
    try:
        fd = os.open(path + "/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
    except OSError as e:
        return "cgroup: join failed errno " + str(e.errno)
    return "cgroup"


def unshare_ipc(libc):
    """Own IPC namespace: SysV shared memory, semaphores and message queues and POSIX message
    queues created in the box live only as long as the box (a hook-free interpreter could
    otherwise leave a segment behind on the host). Kernel-enforced; not the audit hook's job."""
    if libc.unshare(CLONE_NEWIPC) == 0:
        return "ipcns"
    return "no-ipcns"


def enter_as_root(cfg):
    """Root only, before any untrusted byte is read: rlimits, network + mount namespace, make the
    interpreter reachable for the unprivileged uid, tmpfs work dir, drop privileges. The
    interpreter keeps running (no re-exec): its stdlib paths stay valid because the directory
    that hid them (e.g. /root, mode 0700) is covered by a tmpfs that holds only a read-only bind
    of the Python installation."""
    ctypes, libc = _libc()
    set_rlimits(cfg["limits"])
    notes = []
    pidns = libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID) == 0
    if pidns or libc.unshare(CLONE_NEWNET | CLONE_NEWNS) == 0:
        notes.append("netns")
        if pidns:
            notes.append("pidns")
        libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
        prefix, stash, hide = cfg["prefix"], cfg["stash"], cfg.get("hide")
        if hide:
            ok = libc.mount(prefix.encode(), stash.encode(), None, MS_BIND | MS_REC, None) == 0
            ok = ok and libc.mount(b"tmpfs", hide.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                                   b"size=1m,mode=0755") == 0
            if ok:
                os.makedirs(prefix, exist_ok=True)
                ok = libc.mount(stash.encode(), prefix.encode(), None, MS_BIND | MS_REC, None) == 0
            if not ok:
                os.write(2, b"rlvr-sandbox: could not expose the interpreter to the sandbox uid\n")
                os._exit(70)
            libc.mount(None, prefix.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID, None)
            notes.append("hidden:" + hide)
        opts = f"size={cfg['limits']['disk_mb']}m,mode=0700,uid={cfg['uid']},gid={cfg['uid']}"
        if libc.mount(b"tmpfs", cfg["work"].encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts.encode()) == 0:
            notes.append("tmpfs")
    notes.append(unshare_ipc(libc))
    os.chdir(cfg["work"])
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
    notes.append(f"uid{cfg['uid']}")
    return notes


def confine(cfg, notes):
    """Confinement of the (now) unprivileged process. Returns the isolation notes."""
    notes = list(notes)
    if not cfg.get("root"):
        set_rlimits(cfg["limits"])
        ctypes, libc = _libc()
        userns = True
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID) == 0:
            notes += ["netns(userns)", "pidns"]
        elif libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
            notes.append("netns(userns)")
        else:
            userns = False
        # CAP_SYS_ADMIN in the new user namespace allows the IPC namespace; without one, EPERM.
        notes.append(unshare_ipc(libc) if userns else "no-ipcns")
    prefix = cfg["prefix"]
    reads = [prefix, "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/etc/ld.so.cache", cfg["code_dir"]]
    notes.append(install_landlock(reads, [cfg["work"]], ["/dev/null", "/dev/zero", "/dev/urandom"]))
    notes.append(install_seccomp(cfg["grader_pid"], os.getpid()))
    _, libc = _libc()
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no /proc/<pid>/mem, fd, environ for same-uid peers
    # Die with the grader: if the grader process is killed (e.g. a reward worker hit its own
    # timeout) nobody would enforce the wall clock any more. Set after the uid change, which
    # clears it; the getppid check closes the race with a grader that died before this line.
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != cfg["grader_pid"]:
        os._exit(71)
    return notes


def _close_io(cfg):
    for fd in {0, 1, 2, cfg["flag_fd"], cfg.get("req_fd", 0), cfg.get("resp_fd", 0)}:
        try:
            os.close(fd)
        except OSError:
            pass


def _exit_like(status):
    """Exit the way the waited-for process did (same exit code, or the same signal)."""
    if os.WIFSIGNALED(status):
        import signal

        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def enter_pid_namespace(cfg, libc):
    """After unshare(CLONE_NEWPID): this process stays outside as a relay; its child becomes
    pid 1 of the new namespace (a reaper), whose child runs the candidate as pid 2. The
    candidate sees no process outside its box (getppid() is 1) and cannot signal one; when it
    exits, the reaper exits and the kernel kills everything left in the namespace. The
    candidate is not pid 1 itself because pid 1 ignores signals it has no handler for (the CPU
    limit's SIGXCPU among them). Returns in the candidate process only."""
    r, w = os.pipe()
    init = os.fork()
    if init:  # relay: wait for the reaper, then exit like the candidate did
        os.close(w)
        _close_io(cfg)
        os.waitpid(init, 0)
        data = os.read(r, 32)
        _exit_like(int(data) if data else 9)  # no report: the reaper was killed
    os.close(r)
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    cand = os.fork()
    if cand:  # pid 1: reap everything until the candidate is gone, then die (and take the rest)
        _close_io(cfg)
        status = 9
        while True:
            try:
                pid, st = os.wait()
            except ChildProcessError:
                break
            if pid == cand:
                status = st
                break
        os.write(w, str(status).encode())
        os._exit(0)
    os.close(w)
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)


# ----------------------------------------------------------------------------------------------
# Audit hook: Python-level detection. Bypassable by ctypes (which it therefore flags and blocks);
# it is integrity FLAGGING and defense in depth, the boundary is the kernel confinement above.
# ----------------------------------------------------------------------------------------------


def make_audit_hook(flag_fd, work, read_roots, max_forks, grader_pid):
    state = {"forks": 0}
    write = os.write
    abspath, realpath = os.path.abspath, os.path.realpath
    own_group = os.getpgid(0)  # the box's process group (children share it: setpgid is denied)
    dev_ok = ("/dev/null", "/dev/zero", "/dev/urandom")
    blocked = PermissionError

    def flag(name, detail):
        try:
            write(flag_fd, ("flag\t{}\t{}\n".format(name, str(detail)[:200].replace("\n", " "))).encode())
        except OSError:
            pass

    def inside(path, roots):
        try:
            p = realpath(abspath(os.fsdecode(path)))
        except (TypeError, ValueError):
            return True
        return p in dev_ok or any(p == r or p.startswith(r + "/") for r in roots)

    def hook(event, args):
        if state.get("internal"):
            return
        if event == "open":
            path, mode = args[0], args[1]
            if isinstance(path, int) or path is None:
                return
            writing = mode is not None and any(c in str(mode) for c in "wax+")
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            writing = writing or bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if writing and not inside(path, [work]):
                flag("file_write_outside", path)
                raise blocked("rlvr sandbox: writing outside the work directory")
            if not writing and not inside(path, read_roots):
                flag("file_read_outside", path)
                raise blocked("rlvr sandbox: reading outside the sandbox")
        elif event.startswith("socket."):
            if event == "socket.__new__" and len(args) > 1 and args[1] == 1:
                return  # AF_UNIX stays inside the sandbox
            flag("network", event)
            raise blocked("rlvr sandbox: no network")
        elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "pty.spawn"):
            flag("subprocess", f"{event} {str(args)[:100]}")
            raise blocked("rlvr sandbox: no subprocesses")
        elif event in ("os.fork", "os.forkpty"):
            state["forks"] += 1
            if state["forks"] > max_forks:
                flag("process_spawn", f"more than {max_forks} forks")
                raise blocked("rlvr sandbox: too many processes")
        elif event in ("os.kill", "os.killpg"):
            # Inside the box anything goes (children, the own group); -1, the grader and other
            # process groups are outside.
            pid = args[0]
            group = pid if event == "os.killpg" else (-pid if pid < 0 else None)
            if pid == -1 or pid == grader_pid or (group is not None and group not in (0, own_group)):
                flag("signal_outside", f"{event}({pid})")
                raise blocked("rlvr sandbox: signal outside the sandbox")
        elif event in ("os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.symlink", "os.link",
                       "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.rmtree"):
            # os.symlink(target, link): the target may point anywhere (reads through the link are
            # checked on open, after resolving it); only the link itself is a write.
            first = args[1] if event == "os.symlink" else args[0]
            if not inside(first, [work]) or (event in ("os.rename", "os.link")
                                             and len(args) > 1 and not inside(args[1], [work])):
                flag("file_write_outside", f"{event} {first}")
                raise blocked("rlvr sandbox: writing outside the work directory")
        elif event.startswith("ctypes."):
            flag("ctypes", event)
            raise blocked("rlvr sandbox: ctypes is not available")
        elif event == "sys.addaudithook":
            flag("harness_tamper", "sys.addaudithook")
            raise blocked("rlvr sandbox: audit hooks are reserved")
        elif event in ("sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents"):
            flag("introspection", event)

    return hook, flag, state


# ----------------------------------------------------------------------------------------------
# Modes
# ----------------------------------------------------------------------------------------------


def _exec_candidate(path, name):
    with open(path, encoding="utf-8") as f:
        source = f.read()
    code = compile(source, "main.py", "exec", dont_inherit=True)
    ns = {"__name__": name, "__builtins__": __builtins__, "__file__": path}
    exec(code, ns)
    return ns


def _guarded_objects():
    import builtins
    import json

    return {"builtins.print": builtins.print, "builtins.open": builtins.open, "json.dumps": json.dumps,
            "json.loads": json.loads, "sys.exit": sys.exit, "os._exit": os._exit, "os.write": os.write,
            "builtins.__import__": builtins.__import__, "encode_value": encode_value}


def _tampered(reference):
    import builtins

    now = {"builtins.print": builtins.print, "builtins.open": builtins.open,
           "json.dumps": sys.modules["json"].dumps, "json.loads": sys.modules["json"].loads,
           "sys.exit": sys.exit, "os._exit": sys.modules["os"]._exit, "os.write": sys.modules["os"].write,
           "builtins.__import__": builtins.__import__,
           "encode_value": sys.modules["__main__"].__dict__.get("encode_value")}
    return [k for k, v in reference.items() if now[k] is not v]


def _interpreter_exit():
    """What `python main.py` does after the main module: wait for every non-daemon thread
    (threading._shutdown, looked up in sys.modules exactly as CPython's finalization does), then
    run the atexit handlers. A thread that never ends keeps the process alive, so the test's
    time limit ends it: a program that would never exit as a script does not pass here."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            import traceback

            traceback.print_exc()
    import atexit

    atexit._run_exitfuncs()


def mode_script(cfg, flag):
    """Run main.py as __main__; stdin/stdout are the test's pipes. Exit status as python would."""
    import traceback

    flag_write = os.write
    ffd = cfg["flag_fd"]
    sys.argv = ["main.py"]
    status = 0
    flag_write(ffd, b"start\n")  # the test's time limit counts from here (grader-side deadline)
    try:
        _exec_candidate(os.path.join(cfg["code_dir"], "main.py"), "__main__")
    except SystemExit as e:
        code = e.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        if not isinstance(code, int) and code is not None:
            print(code, file=sys.stderr)
    except BaseException as e:  # the candidate's own crash: report like python does
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "main.py":
            tb = tb.tb_next  # drop the harness's own frames from the excerpt
        traceback.print_exception(type(e), e, tb)
        status = 1
    try:
        _interpreter_exit()
    except SystemExit:  # sys.exit() in an atexit handler: python ignores it too
        pass
    except BaseException:
        traceback.print_exc()
    try:
        sys.stdout.flush()
    except Exception:
        status = status or 1
    try:
        flag_write(ffd, b"done\n")
    except OSError:
        pass
    os._exit(status & 0xFF)


class TestTimeout(BaseException):
    """The per-test (or per-call) time limit ran out. A BaseException, so that `except
    Exception` in the code under test does not swallow it."""


def _alarm(test_s):
    """-> (arm, disarm) for a per-test alarm of `test_s` seconds (no-ops when test_s is 0). The
    handler raises TestTimeout only while armed, so a signal that arrives just after disarming
    is ignored. References are taken now: later monkeypatching of signal/time changes nothing."""
    import _signal

    setitimer, real = _signal.setitimer, _signal.ITIMER_REAL
    state = {"armed": False}

    def handler(signum, frame):
        if state["armed"]:
            state["armed"] = False
            raise TestTimeout()

    def arm():
        if test_s > 0:
            _signal.signal(_signal.SIGALRM, handler)  # again each time: the candidate may replace it
            state["armed"] = True
            setitimer(real, test_s)

    def disarm():
        state["armed"] = False
        if test_s > 0:
            setitimer(real, 0)

    return arm, disarm


def mode_serve(cfg, flag):
    """Import the candidate, then answer one JSON request line per call on req_fd -> resp_fd.
    Each call runs under the per-test limit: an alarm interrupts it at the limit, and a call that
    returns late anyway (the candidate caught or disarmed the alarm) is still a timeout."""
    import json
    import time
    reference = _guarded_objects()
    dumps, loads, write, enc = json.dumps, json.loads, os.write, encode_value
    monotonic = time.monotonic
    test_s = float(cfg["limits"].get("test_s") or 0)
    arm, disarm = _alarm(test_s)
    ffd = cfg["flag_fd"]
    # Move the request/answer channels off 0/1 before the candidate runs: its stdin becomes
    # /dev/null and its stdout goes to stderr, so prints cannot corrupt the answers.
    req_fd, resp_fd = os.dup(cfg["req_fd"]), os.dup(cfg["resp_fd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    for fd in (cfg["req_fd"], cfg["resp_fd"]):
        if fd > 2:
            os.close(fd)
    req = os.fdopen(req_fd, "rb", buffering=1 << 16)
    fn = None
    error = None
    try:
        ns = _exec_candidate(os.path.join(cfg["code_dir"], "main.py"), "solution")
        fn = ns.get(cfg["entry_point"])
        if not callable(fn):
            error = "NameError: the program defines no function {!r}".format(cfg["entry_point"])
    except SystemExit as e:
        flag("exit_during_import", f"SystemExit({e.code!r})")
        error = "SystemExit during import"
    except BaseException as e:
        error = f"{type(e).__name__}: {str(e)[:300]}"
    changed = _tampered(reference)
    if changed:
        flag("harness_tamper", ",".join(changed))
    write(ffd, b"ready\n")
    if cfg.get("announce_ready"):  # the check process starts its first test's clock on this line
        write(resp_fd, b'{"ready": true}\n')
    while True:
        line = req.readline(cfg["max_request_bytes"])
        if not line:
            break
        rid = None
        try:
            request = loads(line)
            rid = request.get("id")
            args = [decode_value(a) for a in request["args"]]
            kwargs = {k: decode_value(v) for k, v in request.get("kwargs", {}).items()}
        except Exception as e:
            out = {"ok": False, "error": f"bad request: {e}"}
        else:
            if error is not None:
                out = {"ok": False, "error": error}
            else:
                t0 = monotonic()
                try:
                    try:
                        arm()
                        value = enc(fn(*args, **kwargs))  # encoding a huge value counts too
                    finally:
                        disarm()
                    out = {"ok": True, "value": value}
                except TestTimeout:
                    out = {"ok": False, "timeout": True, "error": "time limit exceeded"}
                except SystemExit as e:
                    out = {"ok": False, "error": f"SystemExit({e.code!r})"}
                except BaseException as e:
                    out = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}",
                           "type": type(e).__name__}
                if test_s > 0 and monotonic() - t0 > test_s:  # late, however it got here
                    out = {"ok": False, "timeout": True, "error": "time limit exceeded"}
        if rid is not None:
            out["id"] = rid
        changed = _tampered(reference)
        if changed:
            flag("harness_tamper", ",".join(changed))
        try:
            data = (dumps(out) + "\n").encode()
        except Exception as e:  # keeps the id: the check process waits for this call's answer
            bad = {"ok": False, "error": f"unencodable result: {type(e).__name__}: {e}"}
            data = (dumps(bad if rid is None else {**bad, "id": rid}) + "\n").encode()
        while data:
            data = data[write(resp_fd, data):]
    try:
        sys.stdout.flush()
    except Exception:
        pass
    write(ffd, b"done\n")
    os._exit(0)


class CandidateError(Exception):
    """Raised in the check process when a call into the candidate failed."""


def mode_check(cfg, flag):
    """Run assert-based tests. The candidate lives in another process; `candidate(...)` is an RPC."""
    import builtins
    import json

    config = json.loads(sys.stdin.buffer.read(cfg["max_request_bytes"]))
    nonce, entry = config["nonce"], config["entry_point"]
    req = os.fdopen(cfg["req_fd"], "wb", buffering=0)
    resp = os.fdopen(cfg["resp_fd"], "rb", buffering=1 << 16)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    limit = cfg["max_response_bytes"]
    arm, disarm = _alarm(float(cfg["limits"].get("test_s") or 0))
    seq = [0]

    def next_answer():
        answer = resp.readline(limit)
        if not answer.endswith(b"\n"):
            raise CandidateError("no (or oversized) answer from the candidate")
        return json.loads(answer)

    def proxy(*args, **kwargs):
        seq[0] += 1
        rid = seq[0]
        line = json.dumps({"id": rid, "args": [encode_value(a) for a in args],
                           "kwargs": {k: encode_value(v) for k, v in kwargs.items()}}) + "\n"
        try:
            req.write(line.encode())
        except OSError:
            raise CandidateError("candidate process is gone") from None
        while True:  # skip the late answer of a call whose test already timed out
            answer = next_answer()
            if isinstance(answer, dict) and answer.get("id") == rid:
                break
        if answer.get("timeout"):
            raise TestTimeout()
        if answer.get("ok"):
            return decode_value(answer["value"])
        exc = getattr(builtins, str(answer.get("type", "")), None)
        if isinstance(exc, type) and issubclass(exc, Exception) and exc.__module__ == "builtins":
            raise exc(answer.get("error", ""))
        raise CandidateError(answer.get("error", "candidate failed"))

    try:  # wait until the candidate is imported: its import time is not the first test's
        while True:
            ready = next_answer()
            if isinstance(ready, dict) and ready.get("ready") is True:
                break
    except (CandidateError, ValueError):
        pass  # gone or garbled: the calls below report it
    for i, test in enumerate(config["tests"]):
        ns = {"__name__": "__check__", "candidate": proxy, entry: proxy}
        try:
            try:
                arm()
                exec(compile(config.get("setup", "") + "\n" + test, f"test_{i}", "exec"), ns)
                if callable(ns.get("check")):
                    ns["check"](proxy)
            finally:
                disarm()
            status, detail = "passed", ""
        except TestTimeout:
            status, detail = "timeout", "time limit exceeded"
        except AssertionError as e:
            status, detail = "failed", f"AssertionError: {str(e)[:200]}"
        except CandidateError as e:
            status, detail = "error", str(e)[:300]
        except Exception as e:
            status, detail = "error", f"{type(e).__name__}: {str(e)[:300]}"
        out.write(json.dumps({"nonce": nonce, "i": i, "status": status, "detail": detail}) + "\n")
    out.write(json.dumps({"nonce": nonce, "end": True}) + "\n")
    out.flush()
    os._exit(0)


MODES = {"script": mode_script, "serve": mode_serve, "check": mode_check}


def main():
    import marshal  # builtin: no import cost (json would pull in re, ~30 ms per sandbox)

    cfg = marshal.loads(bytes.fromhex(sys.argv[-1]))  # written by the grader, not the candidate
    notes = [join_cgroup(cfg["cgroup"])] if cfg.get("cgroup") else []
    notes += enter_as_root(cfg) if cfg["root"] else []
    notes = confine(cfg, notes)
    if "pidns" in notes:
        _, libc = _libc()
        enter_pid_namespace(cfg, libc)
    work = os.path.realpath(cfg["work"])
    read_roots = [os.path.realpath(cfg["prefix"]), os.path.realpath(cfg["code_dir"]), work]
    hook, flag, state = make_audit_hook(cfg["flag_fd"], work, read_roots, cfg["max_forks"], cfg["grader_pid"])
    _, libc = _libc()

    def child_dies_with_parent():  # forked children die with their parent too, recursively
        state["internal"] = True
        libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
        state["internal"] = False

    os.register_at_fork(after_in_child=child_dies_with_parent)
    os.write(cfg["flag_fd"], ("isolation\t{}\n".format(",".join(n for n in notes if n))).encode())
    # The check process runs trusted test code; audit=False exists so that tests can show the
    # kernel confinement holds on its own (the hook is detection, not the boundary).
    if cfg["mode"] != "check" and cfg.get("audit", True):
        sys.addaudithook(hook)
    MODES[cfg["mode"]](cfg, flag)


if __name__ == "__main__":
    main()
