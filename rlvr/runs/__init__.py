"""Run directories: resolved config, metrics/samples JSONL, TensorBoard, atomic checkpoints with
resume, progress bars and plots. See docs/runs.md for the layout and the metric schema.

Names are imported lazily, so `rlvr plot` and other light users do not pay for importing torch
(only rlvr.runs.checkpoint needs it)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "checkpoint_name": "rlvr.runs.checkpoint",
    "latest_checkpoint": "rlvr.runs.checkpoint",
    "list_checkpoints": "rlvr.runs.checkpoint",
    "load_checkpoint": "rlvr.runs.checkpoint",
    "save_checkpoint": "rlvr.runs.checkpoint",
    "plot_run": "rlvr.runs.plots",
    "Progress": "rlvr.runs.progress",
    "format_fields": "rlvr.runs.progress",
    "RunDir": "rlvr.runs.rundir",
    "default_run_path": "rlvr.runs.rundir",
    "metric_series": "rlvr.runs.rundir",
    "read_jsonl": "rlvr.runs.rundir",
}

__all__ = [  # noqa: RUF022 - same order as _EXPORTS
    "checkpoint_name",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
    "plot_run",
    "Progress",
    "format_fields",
    "RunDir",
    "default_run_path",
    "metric_series",
    "read_jsonl",
]
assert set(__all__) == set(_EXPORTS)

if TYPE_CHECKING:
    from rlvr.runs.checkpoint import (
        checkpoint_name,
        latest_checkpoint,
        list_checkpoints,
        load_checkpoint,
        save_checkpoint,
    )
    from rlvr.runs.plots import plot_run
    from rlvr.runs.progress import Progress, format_fields
    from rlvr.runs.rundir import RunDir, default_run_path, metric_series, read_jsonl


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlvr.runs' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
