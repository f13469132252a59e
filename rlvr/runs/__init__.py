"""Run directories: resolved config, metrics/samples JSONL, TensorBoard, atomic checkpoints with
resume, progress bars and plots. See docs/runs.md for the layout and the metric schema."""

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

__all__ = [
    "Progress",
    "RunDir",
    "checkpoint_name",
    "default_run_path",
    "format_fields",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "metric_series",
    "plot_run",
    "read_jsonl",
    "save_checkpoint",
]
