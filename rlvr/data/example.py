"""The one record every task produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Example:
    """A problem with a checkable answer. Satisfies rlvr.rewards.types.ExampleLike.

    id: stable identifier ("gsm8k:train:17", "arithmetic:test:3+4=") used for de-duplication,
    held-out checks and logging. question: the problem text inserted into a prompt template.
    reference: the gold answer a reward function compares against ("72", "\\frac{1}{2}").
    meta: task-specific data a checker needs (countdown numbers and target, code tests, ...).
    solution: an optional worked response (GSM8K rationale, MATH solution, synthetic target),
    used to build SFT targets; never shown to reward functions.
    """

    id: str
    question: str
    reference: str
    meta: dict[str, Any] = field(default_factory=dict)
    solution: str | None = None
