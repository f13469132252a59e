"""Test driver of tests/cli/test_crash_consistency.py: runs `rlvr train` commands in forked children of one warm
process (torch, transformers and rlvr imported once), each child killed (os._exit, no clean-up: a SIGKILL as
far as the files are concerned) at the N-th file-mutating call of a chosen phase of the run.

Protocol: one JSON job per stdin line, one JSON result per stdout line.
    job:    {"argv": [...], "log": PATH, "phase": "save:4" | "resume" | null, "kill_at": N | 0 (count only),
             "exit_before_save": S | 0, "exit_after_save": S | 0, "calls_out": PATH | null}
    result: {"status": "exit" | "killed", "code": int, "calls": n}

File-mutating calls, counted only for paths inside the run directory (the job's run.out_dir / --resume) and
only during the phase (save:S: the save_checkpoint call of step S; resume: session.open_run of a resume, which
locks, cuts the logs back, drops later checkpoints and rewrites config.yaml):
  - open / io.open / os.open for writing (w, a, x, +; O_WRONLY, O_RDWR, O_CREAT, O_TRUNC): the kill comes
    right after the open (the file created or truncated, nothing written: a kill in the middle of a write);
  - torch.save and safetensors' serialize_file (model.safetensors): the file is written, then cut to half its
    size before the kill (a torn write);
  - os.replace, os.rename, os.unlink, os.remove, os.rmdir, os.mkdir, os.truncate, shutil.rmtree: the kill comes
    before the call (calls made inside shutil.rmtree are part of it, not counted again; an os.mkdir of a folder
    that exists changes nothing and is not counted).
Not seen: writes made from native code by other libraries (the tokenizers library writes tokenizer.json
itself); they lie between two counted calls, inside the temporary checkpoint folder.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import sys
import traceback

KILLED = 77  # the exit status of a child killed at its kill point

os.environ.setdefault("RLVR_NUM_THREADS", "1")
os.environ.setdefault("RLVR_PROGRESS", "off")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import safetensors.torch  # noqa: E402
import torch  # noqa: E402

import rlvr.runs.checkpoint  # noqa: E402
import rlvr.runs.plots  # noqa: E402
import rlvr.train.pg.loop  # noqa: E402,F401
import rlvr.train.session  # noqa: E402
from rlvr.cli import app  # noqa: E402

try:
    from torch.utils.tensorboard import SummaryWriter  # noqa: E402,F401 - imported once, here
except Exception:  # noqa: BLE001
    pass
# transformers imports its model code lazily: most of a tiny child's time, paid once here instead
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402,F401
from transformers.utils import logging as _hf_logging  # noqa: E402,F401

torch.set_num_threads(1)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Hooks:
    def __init__(self, run_dir: str, phase: str | None, kill_at: int):
        self.root = os.path.realpath(run_dir)
        self.phase, self.kill_at = phase, kill_at
        self.active = False  # inside the phase
        self.depth = 0  # inside a counted call (shutil.rmtree's own unlinks)
        self.calls: list[list[str]] = []

    def inside(self, path) -> bool:
        if isinstance(path, int) or path is None:
            return False
        try:
            p = os.path.realpath(os.fsdecode(path))
        except TypeError:
            return False
        return p == self.root or p.startswith(self.root + os.sep)

    def count(self, kind: str, path) -> bool:
        """Record a call; True when this one is the kill point."""
        if not self.active or self.depth or not self.inside(path):
            return False
        self.calls.append([kind, os.path.relpath(os.path.realpath(os.fsdecode(path)), self.root)])
        return self.kill_at == len(self.calls)


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(KILLED)


def install(h: Hooks, job: dict) -> None:
    real_open, real_os_open = builtins.open, os.open

    def hooked_open(file, mode="r", *a, **k):
        f = real_open(file, mode, *a, **k)
        if any(c in mode for c in "wax+") and h.count("open:" + mode, file):
            die()
        return f

    def hooked_os_open(path, flags, *a, **k):
        fd = real_os_open(path, flags, *a, **k)
        if flags & _WRITE_FLAGS and h.count("os.open", path):
            die()
        return fd

    builtins.open = hooked_open
    io.open = hooked_open
    os.open = hooked_os_open

    def before(name, fn, nested=False):
        def hooked(path, *a, **k):
            if h.count(name, path):
                die()
            if not nested:
                return fn(path, *a, **k)
            h.depth += 1
            try:
                return fn(path, *a, **k)
            finally:
                h.depth -= 1

        return hooked

    for name in ("replace", "rename", "unlink", "remove", "rmdir", "truncate"):
        setattr(os, name, before("os." + name, getattr(os, name)))
    real_mkdir = os.mkdir

    def mkdir(path, *a, **k):  # (makedirs(exist_ok=True) of an existing folder changes nothing: not counted)
        if not os.path.isdir(path) and h.count("os.mkdir", path):
            die()
        return real_mkdir(path, *a, **k)

    os.mkdir = mkdir
    shutil.rmtree = before("shutil.rmtree", shutil.rmtree, nested=True)

    def torn(name, fn, path_arg):
        def hooked(*a, **k):
            path = a[path_arg] if len(a) > path_arg else k.get("f", k.get("filename"))
            kill = h.count(name, path) if isinstance(path, str | os.PathLike) else False
            out = fn(*a, **k)
            if kill:
                size = os.path.getsize(path)
                with real_open(path, "r+b") as f:
                    f.truncate(size // 2)
                die()
            return out

        return hooked

    torch.save = torn("torch.save", torch.save, 1)
    safetensors.torch.serialize_file = torn("serialize_file", safetensors.torch.serialize_file, 1)

    real_save = rlvr.runs.checkpoint.save_checkpoint

    def save_checkpoint(run_dir, step, *a, **k):
        if job.get("exit_before_save") == step:
            die()
        h.active = h.phase == f"save:{step}"
        try:
            out = real_save(run_dir, step, *a, **k)
        finally:
            h.active = False
        if job.get("exit_after_save") == step:
            die()
        return out

    rlvr.runs.checkpoint.save_checkpoint = save_checkpoint

    real_open_run = rlvr.train.session.open_run

    def open_run(cfg, *, resume, **k):
        h.active = resume and h.phase == "resume"
        try:
            return real_open_run(cfg, resume=resume, **k)
        finally:
            h.active = False

    rlvr.train.session.open_run = open_run
    # plots are not what is compared, and drawing them is most of a tiny run's end
    rlvr.runs.plots.plot_run = lambda *a, **k: []


def run_dir_of(argv: list[str]) -> str:
    if "--resume" in argv:
        return argv[argv.index("--resume") + 1]
    return next(a.split("=", 1)[1] for a in argv if a.startswith("run.out_dir="))


def child(job: dict) -> None:
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    h = Hooks(run_dir_of(job["argv"]), job.get("phase"), int(job.get("kill_at") or 0))
    install(h, job)
    code = 0
    try:
        app(args=job["argv"], prog_name="rlvr")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 3
    if job.get("calls_out"):
        with open(job["calls_out"], "w") as f:  # (outside the run directory: not counted)
            json.dump(h.calls, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                child(job)
            finally:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        calls = 0
        if job.get("calls_out") and os.path.exists(job["calls_out"]):
            with open(job["calls_out"]) as f:
                calls = len(json.load(f))
        result = {"status": "killed" if code == KILLED else "exit", "code": code, "calls": calls}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
