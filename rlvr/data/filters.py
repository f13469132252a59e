"""Difficulty filtering by pass rate (Kimi k1.5, DAPO-style offline filtering): sample each
problem a few times with the current policy and keep the ones it neither always nor never
solves, where a group of samples carries a learning signal (a group with identical rewards has
zero advantage under every group baseline).

The generator is passed in (anything with `generate(prompts, spec) -> list[Rollout]`), so this
module does not import the rollout layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlvr.rewards.types import Status


def pass_rates(
    generator, examples: Sequence[Any], prompts: Sequence[str], reward_fn: Callable, spec
) -> list[float]:
    """Share of spec.n samples per example whose reward status is CORRECT. Returns one float in
    [0, 1] per example. Timeouts and errors count as not passed (and are not hidden: they are
    in the rewards the caller can recompute)."""
    if len(examples) != len(prompts):
        raise ValueError(f"{len(examples)} examples but {len(prompts)} prompts")
    if not examples:
        return []
    rollouts = generator.generate(list(prompts), spec)
    if len(rollouts) != len(examples) * spec.n:
        raise ValueError(f"generator returned {len(rollouts)} rollouts for {len(examples)} x n={spec.n}")
    solved = [0] * len(examples)
    for r in rollouts:
        if reward_fn(r.text, examples[r.group]).status is Status.CORRECT:
            solved[r.group] += 1
    return [s / spec.n for s in solved]


def filter_by_pass_rate(
    examples: Sequence[Any], rates: Sequence[float], *, low: float = 0.0, high: float = 1.0
) -> list[Any]:
    """Examples whose pass rate is strictly between `low` and `high` (defaults: drop the ones
    never and always solved)."""
    if len(examples) != len(rates):
        raise ValueError(f"{len(examples)} examples but {len(rates)} pass rates")
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"need 0 <= low < high <= 1, got low={low}, high={high}")
    return [ex for ex, r in zip(examples, rates, strict=True) if low < r < high]
