"""Typed reward records shared by every verifier, reward function and the trainers."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class Status(StrEnum):
    """Outcome of checking one response. Timeouts and errors are counted, never hidden as 0."""

    CORRECT = "correct"
    INCORRECT = "incorrect"
    UNPARSABLE = "unparsable"  # no answer could be extracted (format failure)
    TIMEOUT = "timeout"  # the check ran past its deadline; the worker was killed
    ERROR = "error"  # the checker itself failed (bug, crash, memory cap)


@dataclass(frozen=True)
class Reward:
    """Score of one response: `total` is what the trainer optimizes, `parts` its named terms
    (e.g. {"format": 1.0, "answer": 0.0}), `status` the typed verdict, `info` a short reason,
    `answer` the extracted answer that was graded (None: none found, or not reported)."""

    total: float
    parts: Mapping[str, float] = field(default_factory=dict)
    status: Status = Status.INCORRECT
    info: str = ""
    # Majority voting (maj@k in rlvr.eval) groups samples by this answer; reward functions that
    # do not report it are voted on with rlvr.rewards.extract.final_answer instead.
    answer: str | None = None
    # Process supervision (algo.advantage=process, rlvr.train.pg.process): the reward of each step of the
    # response, in order, and the index in the response text of each step's last character (strictly
    # increasing, one per step); the index len(response) stands for the end of the response, i.e. the
    # token that stopped it (a reward that charges stopping early puts a step there). Both empty: the
    # reward does not judge steps (every outcome reward).
    steps: tuple[float, ...] = ()
    step_ends: tuple[int, ...] = ()

    def __post_init__(self):
        if not isinstance(self.steps, tuple):
            object.__setattr__(self, "steps", tuple(float(x) for x in self.steps))
        if not isinstance(self.step_ends, tuple):
            object.__setattr__(self, "step_ends", tuple(int(x) for x in self.step_ends))
        if len(self.steps) != len(self.step_ends):
            raise ValueError(f"Reward: {len(self.steps)} step rewards but {len(self.step_ends)} step ends")
        ends = self.step_ends
        if (ends and ends[0] < 0) or any(b <= a for a, b in zip(ends, ends[1:], strict=False)):
            raise ValueError(f"Reward: step ends must be >= 0 and strictly increasing, got {list(ends)}")

    @property
    def formatted(self) -> bool:
        """The one format predicate behind every format rate (training metric, plots, `rlvr eval`,
        the demo table, `rlvr grade`): the reward reports a "format" part and it is > 0. A reward
        without a format part (e.g. `arithmetic`, or an error/timeout reward with no parts) is not
        formatted; see format_rate for the rate, which is NaN ("n/a") when no reward has the part."""
        return float(self.parts.get("format", 0.0)) > 0


def format_rate(parts: Iterable[Mapping[str, float]]) -> float:
    """The one format rate: the share of responses whose reward's "format" part is > 0
    (Reward.formatted), over all responses. NaN when no response's reward reports a "format" part:
    such a reward says nothing about format, and tables print "n/a" (an extracted answer is not a
    format; the status counts say how many were unparsable). `parts`: one Reward.parts per response."""
    n = with_part = ok = 0
    for p in parts:
        n += 1
        if "format" in p:
            with_part += 1
            ok += float(p["format"]) > 0
    return ok / n if with_part else math.nan


class ExampleLike(Protocol):
    """What a reward function needs of an example (rlvr.data.Example satisfies it): the reference
    answer and free-form metadata (countdown numbers, code tests, ...). Defined here so that the
    rewards layer does not import the data layer."""

    reference: str
    meta: Mapping[str, Any]


class RewardFn(Protocol):
    """A reward function is plain Python: (response text, example) -> Reward. It never raises."""

    def __call__(self, response: str, example: ExampleLike) -> Reward: ...


@dataclass(frozen=True)
class SimpleExample:
    """A plain, picklable ExampleLike: what batch scoring sends to worker processes and what
    `rlvr grade` builds from a JSONL line."""

    reference: str
    meta: Mapping[str, Any] = field(default_factory=dict)
