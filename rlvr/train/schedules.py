"""Learning-rate schedules: plain math, no torch (config validation imports LR_SCHEDULES to name
the known schedules without paying for a torch import)."""

from __future__ import annotations

import math
from collections.abc import Callable


def _constant(progress: float, min_ratio: float) -> float:
    return 1.0


def _linear(progress: float, min_ratio: float) -> float:
    return 1.0 - (1.0 - min_ratio) * progress


def _cosine(progress: float, min_ratio: float) -> float:
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# Learning-rate multiplier after warmup as a function of progress in [0, 1] (0 = end of warmup,
# 1 = last optimizer step).
LR_SCHEDULES: dict[str, Callable[[float, float], float]] = {
    "constant": _constant,
    "linear": _linear,
    "cosine": _cosine,
}


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warmup over
    warmup_steps (step 0 gets 1/warmup_steps, never 0), then the named schedule until total_steps - 1."""
    if schedule not in LR_SCHEDULES:
        raise KeyError(f"unknown lr schedule {schedule!r}; known: {', '.join(sorted(LR_SCHEDULES))}")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - 1 - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    return LR_SCHEDULES[schedule](progress, min_lr_ratio)
