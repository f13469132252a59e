"""The run directory: resolved config, metrics and samples as JSONL, TensorBoard events, plots.

Layout (docs/runs.md has the full description and the metric schema):

    RUN_DIR/
      config.yaml          resolved config (loads back with rlvr.config.load_config)
      metrics.jsonl        one JSON object per logged step: {"step", "time", <metric>: number, ...}
      samples.jsonl        a few generations per logged step: {"step", "prompt", "response", ...}
      tb/                  TensorBoard events (run.report_to has tensorboard, the default, and it is installed)
      trackers.json        the wandb / mlflow run ids a resume continues (run.report_to; rlvr.runs.trackers)
      wandb/ trackio/ mlflow.db   the offline files of those trackers (rlvr.runs.trackers)
      checkpoints/         step_000010/ ..., `latest` pointer (rlvr.runs.checkpoint)
      plots/               PNGs written by plot_run / `rlvr plot RUN_DIR`
      .rlvr-lock           marks the folder as an rlvr run; locked (fcntl.lockf) by the process writing it

`time` is wall seconds since the run started, carried across resume: a resumed run continues
from the time of the last row it keeps, so plots against time have no jump back to 0.

Whose folder: a run is created only in a new or empty folder or in an rlvr run directory (`.rlvr-lock`, or
for runs written before it, metrics.jsonl or checkpoints/); a folder of other files is refused, so a
user's own config.yaml is never replaced. Overwriting a run (`exist_ok`, run.overwrite) removes only what a
run writes (RUN_FILES, and in RUN_FOLDERS the names a run gives its files); anything else stays.

One writer: every RunDir holds RUN/.rlvr-lock locked for its life (a POSIX record lock: the kernel drops
it when the process dies, so a crashed run never blocks its resume, and a forked child never inherits
it); a second process that opens the run for writing (a resume of a live run, an overwrite of it) gets
RunDirInUse naming the folder and the pid holding it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import errno
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.config import ConfigError, to_dict, to_yaml
from rlvr.runs.checkpoint import (
    checkpoint_name,
    list_checkpoints,
    remove_checkpoint,
    remove_stale_temporaries,
    write_text_atomic,
)
from rlvr.runs.trackers import STATE_FILE, Trackers, numeric_metrics, parse_report_to

try:
    import fcntl
except ImportError:  # not POSIX: run directories are not locked
    fcntl = None

log = logging.getLogger(__name__)

_TB_NOTICE_SHOWN = False


def _jsonable(value: Any) -> Any:
    """Plain JSON value of a metric/sample field: tensors and numpy scalars become numbers,
    non-finite floats become null (strict JSON has no NaN; a gap in a plot shows it)."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    if hasattr(value, "value") and isinstance(value.value, str):  # Enum like Status
        return value.value
    return str(value)


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file; a torn last line (the process died mid-write) is skipped, any other
    bad line raises ValueError naming file and line."""
    path = Path(path)
    if not path.exists():
        return []
    rows: list[dict] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines):  # no trailing newline: the final write was cut short
                log.warning("%s:%d: skipping a torn last line", path, i)
                continue
            raise ValueError(f"{path}:{i}: invalid JSON ({exc.msg})") from exc
    return rows


def _truncate_jsonl(path: Path, max_step: int) -> int:
    """Keep rows with step <= max_step (and a torn tail dropped); atomic rewrite. Returns rows kept."""
    if not path.exists():
        return 0
    kept = [r for r in read_jsonl(path) if int(r.get("step", 0)) <= max_step]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in kept:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(kept)


def _drop_later_checkpoints(ckpt_dir: Path, step: int) -> None:
    if not ckpt_dir.is_dir():
        return
    later = [p for p in list_checkpoints(ckpt_dir) if int(p.name.split("_")[1]) > step]
    if later:
        write_text_atomic(ckpt_dir / "latest", checkpoint_name(step) + "\n")  # the resume step, before deleting
        for p in later:
            remove_checkpoint(p)


# ------------------------------------------------------------------------------ whose folder, one writer

LOCK_FILE = ".rlvr-lock"
"""RUN/.rlvr-lock: marks a folder as an rlvr run directory, and is locked by the process writing it."""

RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "reward_errors.jsonl", STATE_FILE, "mlflow.db",
             "mlflow.db-journal", "mlflow.db-wal", "mlflow.db-shm", "config.yaml.tmp", "metrics.jsonl.tmp",
             "samples.jsonl.tmp", STATE_FILE + ".tmp")
"""The files a run writes at the top of its directory (overwrite removes them; LOCK_FILE stays: see _clear_run)."""

RUN_FOLDERS: dict[str, tuple[str, ...]] = {
    "checkpoints": (r"step_\d+", r"step_\d+\.damaged(-\d+)?", "latest", r"latest\.tmp", r"\.tmp-.*",
                    r"\.sharded-step_\d+"),
    "tb": (r"events\.out\.tfevents\..*",),
    "plots": (r"reward\.png", r"reward_time\.png", r"length\.png", r"optimization\.png", r"system\.png",
              r"other\.png"),  # the figures plot_run writes (rlvr.runs.plots.FIGURES and other.png)
    "base_model": (r".*",),  # a LoRA run's frozen base (rlvr.models.lora.BASE_DIR): all of it is the run's
    "ref_policy": (r"step_\d+\.pt", r"step_\d+\.tmp"),  # the KL reference's snapshots (rlvr.train.pg.reference)
    "wandb": (r"offline-run-.*", r"run-.*", "latest-run", r"debug(-internal|-cli\..*)?\.log"),
    "trackio": (r".*\.db(-wal|-shm|-journal)?", r".*\.lock", "media"),
    "mlartifacts": (r"\d+",),  # MLflow's artifacts, one folder per experiment id
}
"""The folders a run writes and, in each, the names (regular expressions) of the entries it writes there:
overwrite removes those and keeps anything else (a folder left empty is removed)."""

_TOP_PATTERNS = (r"\.tmp-base_model-\d+",)  # a LoRA base model's interrupted write (rlvr.runs.checkpoint)


def is_run_dir(path: str | Path) -> bool:
    """Whether `path` is an rlvr run directory: it has LOCK_FILE, or (a run written before the lock file)
    metrics.jsonl or checkpoints/."""
    path = Path(path)
    return (path / LOCK_FILE).exists() or (path / "metrics.jsonl").is_file() or (path / "checkpoints").is_dir()


def _listing(names: Sequence[str], at_most: int = 6) -> str:
    shown = ", ".join(names[:at_most])
    return shown + (f" and {len(names) - at_most} more" if len(names) > at_most else "")


def _entries(path: Path) -> list[str]:
    return sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())


def check_run_target(path: str | Path, what: str = "") -> None:
    """Refuse (FileExistsError) to start a run in a folder that is neither new, nor empty, nor an rlvr run
    directory: its files are someone else's, and a run would replace some (config.yaml) and mix in others.
    `what` prefixes the folder in the message (e.g. "run.out_dir=")."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{what}{path} is a file, not a folder: choose a new or empty folder for the run")
    if not path.is_dir() or is_run_dir(path):
        return
    names = _entries(path)
    if names:
        raise FileExistsError(
            f"{what}{path} is not empty and is not an rlvr run directory (it holds {_listing(names)}): a run is "
            "written only into a new or empty folder or into a run of its own, never among other files (it would "
            f"replace config.yaml and mix its files with yours). Choose a new or empty folder (e.g. {what}"
            f"{path / 'run'}), or leave run.out_dir out (runs/<name>-<time>)")


def _clear_run(path: Path) -> list[str]:
    """Remove what a run writes in `path` (RUN_FILES, RUN_FOLDERS' entries); returns what it kept (not the
    run's). LOCK_FILE stays: it is locked by this process, and removing a locked file would let a second
    process lock a new one."""
    kept: list[str] = []
    for name in RUN_FILES:
        (path / name).unlink(missing_ok=True)
    for child in path.iterdir():
        if any(re.fullmatch(p, child.name) for p in _TOP_PATTERNS):
            shutil.rmtree(child, ignore_errors=True)
    for folder in RUN_FOLDERS:
        d = path / folder
        if not d.is_dir() or d.is_symlink():
            continue
        patterns = RUN_FOLDERS[folder]
        for child in sorted(d.iterdir()):
            if any(re.fullmatch(p, child.name) for p in patterns):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
            else:
                kept.append(f"{folder}/{child.name}")
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty
    return kept


_HELD: dict[str, list] = {}  # realpath of a run directory -> [lock fd, holders in this process, pid]


def _held(key: str) -> list | None:
    held = _HELD.get(key)
    if held is not None and held[2] != os.getpid():  # copied into a forked child, which holds no record lock
        del _HELD[key]
        return None
    return held


def _lock_path(path: Path) -> str:
    return os.path.realpath(path)


def _holder(path: Path) -> str:
    try:
        pid = (path / LOCK_FILE).read_text(encoding="utf-8").split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return "another process"
    return f"process {pid}" if pid.isdigit() else "another process"


def _in_use(path: Path) -> RunDirInUse:
    who = _holder(path)
    return RunDirInUse(
        f"{path} is in use: {who} is writing this run (it holds {path / LOCK_FILE}); a second process must not "
        "resume, overwrite or write it at the same time. Wait for that run to end, or stop it first"
        + (f" (kill {who.split()[1]})" if who.startswith("process ") else ""))


class RunDirInUse(FileExistsError):
    """Another live process holds the run directory's lock (RUN/.rlvr-lock)."""


def acquire_run_lock(path: str | Path) -> None:
    """Lock run directory `path` (created if needed) for this process, or raise RunDirInUse naming the pid that
    holds it. Re-entrant within a process (counted; release_run_lock once per acquire). The lock is a POSIX
    record lock (fcntl.lockf) on RUN/.rlvr-lock: released by the kernel when the process dies (a crashed run
    never blocks its resume) and not inherited by forked children. On a filesystem without locks it warns
    and goes on unlocked."""
    path = Path(path)
    key = _lock_path(path)
    if (held := _held(key)) is not None:
        held[1] += 1
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        if fcntl is not None:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            os.close(fd)
            raise _in_use(path) from None
        log.warning("%s: cannot lock %s (%s): nothing stops a second process from writing this run", path,
                    LOCK_FILE, exc.strerror or exc)
    else:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[key] = [fd, 1, os.getpid()]


def release_run_lock(path: str | Path) -> None:
    """Undo one acquire_run_lock of this process; the last one unlocks (the file stays)."""
    key = _lock_path(Path(path))
    held = _held(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _HELD[key]
        os.close(held[0])  # closing the descriptor drops the record lock


@contextlib.contextmanager
def hold_run_dir(path: str | Path) -> Iterator[None]:
    """`with hold_run_dir(path):` the run directory locked by this process (acquire_run_lock) for the block."""
    acquire_run_lock(path)
    try:
        yield
    finally:
        release_run_lock(path)


def check_not_in_use(path: str | Path) -> None:
    """Raise RunDirInUse when another live process holds `path`'s lock (a quick check before loading a model;
    the lock itself is taken when the run directory is opened)."""
    path = Path(path)
    if fcntl is None or _held(_lock_path(path)) is not None or not (path / LOCK_FILE).is_file():
        return
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            raise _in_use(path) from None
    finally:
        os.close(fd)


def check_run_config(path: str | Path) -> None:
    """A resume reads its settings from RUN/config.yaml: ConfigError when that file is there but empty, not
    readable, not YAML or not a mapping of keys (a resume must never fall back to every default)."""
    import yaml

    cfg = Path(path) / "config.yaml"
    if not cfg.exists():
        return
    fix = (f"a resume needs the run's settings: write them back into {cfg} (the YAML file the run was started "
           "with, plus its command-line overrides) and resume again, or start over with run.overwrite=true")
    try:
        text = cfg.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{cfg} cannot be read ({exc}): {fix}") from exc
    if not text.strip():
        raise ConfigError(f"{cfg} is empty ({len(text.encode())} bytes): the run's settings are lost; {fix}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{cfg} is not valid YAML ({exc.__class__.__name__}); {fix}") from exc
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{cfg} holds no config keys (a {type(data).__name__}); {fix}")


def default_run_path(root: str | Path = "runs", name: str = "run") -> Path:
    """`root/<name>-<YYYYmmdd-HHMMSS>` (a numeric suffix is added if that already exists)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^\w.-]+", "_", name) or "run"
    path = Path(root) / f"{safe}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = Path(root) / f"{safe}-{stamp}-{n}"
    return path


class RunDir:
    """Writer of one run directory. Use `RunDir.create(...)` for a new run and
    `RunDir.resume(path, step)` to continue one from a checkpoint.

    `report_to` (run.report_to: 'tensorboard', 'wandb,mlflow', 'none', ...) chooses where metrics go
    besides metrics.jsonl, and then decides TensorBoard too; None keeps the `tensorboard` flag alone.
    The external trackers (rlvr.runs.trackers) open at the first write_config or log_metrics and
    close with the RunDir; one that fails warns and is dropped, never the run.

    Not thread-safe; one writer per directory.
    """

    def __init__(self, path: str | Path, *, tensorboard: bool = True, time_offset: float = 0.0,
                 purge_step: int | None = None, report_to: str | Sequence[str] | None = None,
                 resume: bool = False):
        self.path = Path(path)
        self.report_to = report_to
        names = parse_report_to(report_to) if report_to is not None else (["tensorboard"] if tensorboard else [])
        tensorboard = "tensorboard" in names
        self.trackers = Trackers(self.path, [n for n in names if n != "tensorboard"], resume=resume)
        acquire_run_lock(self.path)  # (creates the folder) held until close(): one writer per run directory
        self._locked = True
        try:
            self.checkpoints_dir.mkdir(exist_ok=True)
            self._t0 = time.monotonic()
            self._time_offset = float(time_offset)
            self._metrics_f = open(self.metrics_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._samples_f = open(self.samples_path, "a", encoding="utf-8")  # noqa: SIM115
            self._tb = self._open_tensorboard(purge_step) if tensorboard else None
        except BaseException:
            self._unlock()
            raise

    # -------------------------------------------------------------------------------- paths
    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def samples_path(self) -> Path:
        return self.path / "samples.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def plots_dir(self) -> Path:
        return self.path / "plots"

    @property
    def tb_dir(self) -> Path:
        return self.path / "tb"

    # -------------------------------------------------------------------------- construction
    @classmethod
    def create(cls, path: str | Path | None = None, *, root: str | Path = "runs", name: str = "run",
               config: Any = None, tensorboard: bool = True, exist_ok: bool = False,
               report_to: str | Sequence[str] | None = None) -> RunDir:
        """A new run directory at `path`, or `root/<name>-<timestamp>` when path is None; writes
        `config` (a config dataclass or a mapping) to config.yaml. `path` must be new, empty or an rlvr run
        directory: a folder of other files is refused (FileExistsError naming what it holds; check_run_target).
        An existing run is refused unless exist_ok; then what the old run wrote (its metrics, samples, events,
        checkpoints, plots and tracker files: RUN_FILES, RUN_FOLDERS) is deleted first (a fresh run must not
        resume from stale files), and anything else in the folder is kept. A run another process is writing
        is refused (RunDirInUse). `report_to`: see the class."""
        path = Path(path) if path is not None else default_run_path(root, name)
        check_run_target(path)
        with hold_run_dir(path):
            if (path / "metrics.jsonl").exists() or (path / "checkpoints").exists():
                if not exist_ok:
                    raise FileExistsError(
                        f"{path} already holds a run; resume it or choose another directory (or overwrite it)"
                    )
                kept = _clear_run(path)
                if kept:
                    log.warning("%s: overwritten; kept what the run did not write: %s", path, _listing(kept))
            run = cls(path, tensorboard=tensorboard, report_to=report_to)
        if config is not None:
            run.write_config(config)
        return run

    @classmethod
    def resume(cls, path: str | Path, step: int, *, tensorboard: bool = True,
               report_to: str | Sequence[str] | None = None) -> RunDir:
        """Reopen a run at checkpoint `step`: metrics.jsonl and samples.jsonl keep only rows with
        step <= `step` (what the uninterrupted run had written by then), TensorBoard events from
        later steps are purged, checkpoints of later steps are deleted (they belong to the abandoned
        continuation; keeping them would let "keep last k" and `latest` pick them over the new
        ones), and `time` continues from the last kept metrics row. The trackers of `report_to` continue
        their runs (RUN/trackers.json); rows a tracker got after `step` before the run stopped stay there
        (only TensorBoard's can be purged)."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no run directory at {path}")
        with hold_run_dir(path):  # before the first change: a live run is never cut back under its writer
            remove_stale_temporaries(path)  # what a crashed save left (.tmp-* folders, a LoRA base's copy)
            _drop_later_checkpoints(path / "checkpoints", step)
            _truncate_jsonl(path / "metrics.jsonl", step)
            _truncate_jsonl(path / "samples.jsonl", step)
            rows = read_jsonl(path / "metrics.jsonl")
            offset = max((float(r["time"]) for r in rows if isinstance(r.get("time"), int | float)), default=0.0)
            return cls(path, tensorboard=tensorboard, time_offset=offset, purge_step=step + 1,
                       report_to=report_to, resume=True)

    def open_for_resume(self, step: int) -> RunDir:
        """Same as `RunDir.resume(self.path, step)`, for a RunDir already open: closes this one."""
        self.close()
        return RunDir.resume(self.path, step, tensorboard=self._tb is not None, report_to=self.report_to)

    def _open_tensorboard(self, purge_step: int | None):
        global _TB_NOTICE_SHOWN
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception:  # tensorboard not installed (optional dependency)  # noqa: BLE001
            if not _TB_NOTICE_SHOWN:
                log.info("tensorboard is not installed: no TensorBoard events (pip install 'rlvr[tensorboard]')")
                _TB_NOTICE_SHOWN = True
            return None
        return SummaryWriter(log_dir=str(self.tb_dir), purge_step=purge_step)

    # -------------------------------------------------------------------------------- writing
    def elapsed(self) -> float:
        """Wall seconds since the run started, including the time before a resume."""
        return self._time_offset + (time.monotonic() - self._t0)

    def write_config(self, config: Any) -> Path:
        """Write the resolved config: a config dataclass as rlvr.config.to_yaml gives it, or a mapping.
        Atomic, as every run file (config.yaml.tmp, fsync, os.replace): a crash while a resume rewrites it
        leaves the old file or the new one, never an empty one."""
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            write_text_atomic(self.config_path, to_yaml(config))
            self.trackers.log_config(_jsonable(to_dict(config)))
            return self.config_path
        import yaml

        write_text_atomic(self.config_path, yaml.safe_dump(_jsonable(dict(config)), sort_keys=False))
        self.trackers.log_config(_jsonable(dict(config)))
        return self.config_path

    def log_metrics(self, step: int, metrics: Mapping[str, Any], *, time_s: float | None = None) -> dict:
        """Append one row {"step", "time", **metrics} to metrics.jsonl (flushed), TensorBoard and the
        trackers of run.report_to (the row's numeric fields, rlvr.runs.trackers.numeric_metrics).
        Values may be floats, ints, 0-d tensors or numpy scalars. Returns the row written."""
        if "step" in metrics or "time" in metrics:
            raise ValueError("metric names 'step' and 'time' are reserved")
        row: dict[str, Any] = {"step": int(step), "time": round(self.elapsed() if time_s is None else time_s, 3)}
        row.update({str(k): _jsonable(v) for k, v in metrics.items()})
        self._metrics_f.write(json.dumps(row) + "\n")
        self._metrics_f.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, global_step=int(step))
            self._tb.flush()
        self.trackers.log(int(step), numeric_metrics(row))
        return row

    def log_samples(self, step: int, samples: Iterable[Mapping[str, Any]]) -> int:
        """Append generations to samples.jsonl, each as {"step": step, **sample}. Suggested fields:
        prompt, response, reference, reward, parts (reward parts), status, entropy, length."""
        n = 0
        for s in samples:
            row = {"step": int(step), **{str(k): _jsonable(v) for k, v in s.items() if k != "step"}}
            self._samples_f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
        self._samples_f.flush()
        if self._tb is not None and n:
            self._tb.add_text("samples", f"{n} samples at step {step}; see samples.jsonl", global_step=int(step))
        return n

    def read_metrics(self) -> list[dict]:
        self._metrics_f.flush()
        return read_jsonl(self.metrics_path)

    def read_samples(self) -> list[dict]:
        self._samples_f.flush()
        return read_jsonl(self.samples_path)

    def close(self, failed: bool = False) -> None:
        """Close the files and finish the tracker runs (`failed`: the training raised; mlflow and wandb
        mark the run so)."""
        try:
            self.trackers.close(failed=failed)
            for f in (self._metrics_f, self._samples_f):
                if not f.closed:
                    f.close()
            if self._tb is not None:
                self._tb.close()
                self._tb = None
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._locked:
            self._locked = False
            release_run_lock(self.path)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(failed=exc[0] is not None)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"


def metric_series(rows: Sequence[Mapping[str, Any]], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """(xs, ys) of the rows that have a numeric `key` (metrics may be logged at some steps only)."""
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and isinstance(r.get(x), int | float):
            xs.append(float(r[x]))
            ys.append(float(v))
    return xs, ys
