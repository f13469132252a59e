"""What a run directory hands to the next command that starts from it (`model.init_from=RUN`): the run's
task (its data.* keys) and how its responses end and how long they are (sampling max_tokens / top_p / stop /
keep_stop / thinking_budget / stop_thinking_text). `rlvr eval`, `rlvr filter` and the trainers read them as
the lowest layer under a config file and overrides, so a policy is evaluated, filtered with and trained
further on the task it learned, not on the defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rlvr.config import ConfigError, read_yaml
from rlvr.train.config import DataConfig

# The sampling keys a run's config.yaml hands on. Temperature and n are not taken: evaluation and filtering
# decode their own way.
RUN_SAMPLING_KEYS = ("max_tokens", "top_p", "stop", "keep_stop", "thinking_budget", "stop_thinking_text")

# Evaluation reads no training split, so its training-set size is 0 whatever a run or the defaults say: the
# config check "data.num_train exceeds the distinct problems" must not stop an evaluation (it is the lowest
# layer; an explicit data.num_train still wins, and is unused).
NO_TRAIN = {"data": {"num_train": 0}}


def find_run_dir(init_from: str | Path) -> Path | None:
    """The run directory behind model.init_from, or None (a plain model folder / hub id): the path
    itself when it holds config.yaml, else the run of a checkpoint (RUN/checkpoints/step_N) or of a
    checkpoint's model folder (RUN/checkpoints/step_N/model)."""
    p = Path(init_from)
    candidates = [p]
    if p.parent.name == "checkpoints":
        candidates.append(p.parent.parent)
    if p.name == "model" and p.parent.parent.name == "checkpoints":
        candidates.append(p.parent.parent.parent)
    return next((c for c in candidates if (c / "config.yaml").is_file()), None)


def _read_run_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    data = read_yaml(path, "the run's config")[0]  # the loader's bounds (aliases, depth) and its errors
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: the run's config is empty or not a mapping of keys (a damaged run directory?)")
    return data


def run_settings(run_dir: Path, *, training: bool = False) -> dict[str, Any]:
    """{"data": {...}, "sampling": {...}} from a run's config.yaml (a TrainConfig or SFTConfig dump):
    the keys the commands that start from a run also have, so a run written by another trainer or an
    older version never trips the strict loader with a key they do not know. data.num_train is 0
    (NO_TRAIN) for an evaluation; training=True keeps the run's own (filtering and training read the
    training split). ConfigError when the file cannot be read."""
    raw = _read_run_config(run_dir)
    data_keys = {f.name for f in dataclasses.fields(DataConfig)}
    data = {k: v for k, v in (raw.get("data") or {}).items() if k in data_keys}
    sampling = {k: v for k, v in (raw.get("sampling") or {}).items() if k in RUN_SAMPLING_KEYS}
    if not training:
        return {"data": {**data, **NO_TRAIN["data"]}, "sampling": sampling}
    data.pop("num_train", None)  # the run's own count, if it recorded one
    if "num_train" in (raw.get("data") or {}):
        data["num_train"] = raw["data"]["num_train"]
    return {"data": data, "sampling": sampling}
