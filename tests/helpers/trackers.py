"""`rlvr train` with the real experiment trackers, offline (marker trackers: tests/runs/test_trackers_backends.py,
test_trackers_secrets.py): the run's sizes, every backend at once, and the environment of its subprocess."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import REPO

TINY = [
    "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
    "data.num_train=40", "data.num_eval=4", "data.digits=1", "sampling.n_prompts=2", "sampling.group_size=2",
    "sampling.max_tokens=3", "run.log_samples_every=0", "run.eval_every=2",
]
ALL = "tensorboard,wandb,trackio,mlflow"


def tracker_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The test's environment without the user's tracker settings (so the run dir defaults apply) and with
    wandb's own config and cache folders in tmp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TRACKIO_"))}
    env |= {"RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off", "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
            "WANDB_CACHE_DIR": str(tmp / "wandb-cache"), "WANDB_DATA_DIR": str(tmp / "wandb-data"),
            "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "PYTHONPATH": str(REPO)}
    return env | extra
