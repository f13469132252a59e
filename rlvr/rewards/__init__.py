"""Verifiable rewards: answer extraction, math equivalence that never hangs and never lies,
task checkers, reward composition and batch scoring with hard timeouts.

    from rlvr.rewards import get_reward_fn
    reward = get_reward_fn("r1_zero")(response, example)   # Reward(total, parts, status, info)

A composition can be named inline: "r1_zero:1.0,language:0.1" (name:weight, comma separated).
"""

from __future__ import annotations

from rlvr.rewards.batch import ScoreCounters, score_batch
from rlvr.rewards.grader import Verdict, grade_answer, is_equivalent, verifier_timeout
from rlvr.rewards.pool import WorkerPool, get_pool
from rlvr.rewards.registry import REWARD_FUNCTIONS, ComposedReward, compose, get_reward_fn, with_tolerance
from rlvr.rewards.types import ExampleLike, Reward, RewardFn, SimpleExample, Status

__all__ = [
    "REWARD_FUNCTIONS",
    "ComposedReward",
    "ScoreCounters",
    "WorkerPool",
    "ExampleLike",
    "Reward",
    "RewardFn",
    "SimpleExample",
    "Status",
    "Verdict",
    "compose",
    "get_pool",
    "get_reward_fn",
    "grade_answer",
    "is_equivalent",
    "score_batch",
    "verifier_timeout",
    "with_tolerance",
]
