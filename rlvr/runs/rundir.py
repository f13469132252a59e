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

`time` is wall seconds since the run started, carried across resume: a resumed run continues
from the time of the last row it keeps, so plots against time have no jump back to 0.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.config import dump_yaml, to_dict
from rlvr.runs.checkpoint import checkpoint_name, list_checkpoints
from rlvr.runs.trackers import STATE_FILE, Trackers, numeric_metrics, parse_report_to

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
        pointer = ckpt_dir / "latest"
        pointer_tmp = ckpt_dir / "latest.tmp"
        pointer_tmp.write_text(checkpoint_name(step) + "\n", encoding="utf-8")
        os.replace(pointer_tmp, pointer)  # point at the resume step before deleting anything
        for p in later:
            shutil.rmtree(p, ignore_errors=True)


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
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints_dir.mkdir(exist_ok=True)
        self._t0 = time.monotonic()
        self._time_offset = float(time_offset)
        self._metrics_f = open(self.metrics_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._samples_f = open(self.samples_path, "a", encoding="utf-8")  # noqa: SIM115
        self._tb = self._open_tensorboard(purge_step) if tensorboard else None

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
        `config` (a config dataclass or a mapping) to config.yaml. An existing non-empty run
        directory is refused unless exist_ok; then the old run's metrics, samples, events,
        checkpoints, plots and tracker files are deleted first (a fresh run must not resume from stale
        files). `report_to`: see the class."""
        path = Path(path) if path is not None else default_run_path(root, name)
        if (path / "metrics.jsonl").exists() or (path / "checkpoints").exists():
            if not exist_ok:
                raise FileExistsError(
                    f"{path} already holds a run; resume it or choose another directory (or overwrite it)"
                )
            for p in (path / "metrics.jsonl", path / "samples.jsonl", path / "config.yaml", path / STATE_FILE,
                      path / "mlflow.db"):
                p.unlink(missing_ok=True)
            for d in ("checkpoints", "tb", "plots", "wandb", "trackio", "mlartifacts"):
                shutil.rmtree(path / d, ignore_errors=True)
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
        _drop_later_checkpoints(path / "checkpoints", step)
        _truncate_jsonl(path / "metrics.jsonl", step)
        _truncate_jsonl(path / "samples.jsonl", step)
        rows = read_jsonl(path / "metrics.jsonl")
        offset = max((float(r["time"]) for r in rows if isinstance(r.get("time"), int | float)), default=0.0)
        return cls(path, tensorboard=tensorboard, time_offset=offset, purge_step=step + 1, report_to=report_to,
                   resume=True)

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
        """Write the resolved config: a config dataclass via rlvr.config.dump_yaml, or a mapping."""
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            dump_yaml(config, self.config_path)
            self.trackers.log_config(_jsonable(to_dict(config)))
            return self.config_path
        import yaml

        self.config_path.write_text(yaml.safe_dump(_jsonable(dict(config)), sort_keys=False))
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
        self.trackers.close(failed=failed)
        for f in (self._metrics_f, self._samples_f):
            if not f.closed:
                f.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

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
