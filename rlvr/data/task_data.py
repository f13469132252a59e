"""What a trainer needs of a task, in one record: examples, the prompt contract (template, stop
strings, whether the stop string is kept), the checker and the SFT target.

`rlvr.train.tasks.load_task_data` builds it from a `DataConfig` through rlvr.data's task registry; tests
and the demo may build one directly. `rlvr.rollout.SamplingSpec.for_task(task, section, seed=...)` turns a
sampling config section and the task into a SamplingSpec, so the r1_zero template's `</answer>` stop (kept
in the text, which its reward needs) reaches every sampler with nothing to remember.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.rewards.types import RewardFn


@dataclass
class TaskData:
    """Examples and functions of one task (examples follow rlvr.data.Example: id, question,
    reference, meta)."""

    name: str
    train: Sequence[Any]  # training examples
    eval: Sequence[Any]  # held-out examples
    prompt: Callable[[Any], str]  # example -> prompt text
    reward_fn: RewardFn  # (response, example) -> Reward
    target: Callable[[Any], str]  # example -> SFT response text (the tokens after the prompt)
    stop: tuple[str, ...] = ()  # stop strings of the task's responses (besides EOS)
    keep_stop: bool = True  # the stop string stays at the end of the response text
    template: str = ""  # prompt template name (for the record; prompt() already applies it)
    env: Any = None  # data.env: an rlvr.envs.task.EnvRunner; rollouts are multi-turn episodes, rewards theirs


class TaskDataError(ValueError):
    """The data section cannot be turned into examples (unknown task, bad file, too many asked)."""
