"""Verifiable rewards: answer extraction, math equivalence that never hangs and never lies,
task checkers, reward composition and batch scoring with hard timeouts.

    from rlvr.rewards import get_reward_fn
    reward = get_reward_fn("r1_zero")(response, example)   # Reward(total, parts, status, info)

A composition can be named inline: "r1_zero:1.0,language:0.1" (name:weight, comma separated).
"""

from __future__ import annotations

from rlvr.rewards import functions as _f
from rlvr.rewards.batch import ScoreCounters, score_batch
from rlvr.rewards.format import answer_reward, format_reward
from rlvr.rewards.functions import ComposedReward, compose
from rlvr.rewards.grader import Verdict, grade_answer, is_equivalent, verifier_timeout
from rlvr.rewards.pool import WorkerPool, get_pool
from rlvr.rewards.steps import sum_steps
from rlvr.rewards.types import ExampleLike, Reward, RewardFn, SimpleExample, Status

REWARD_FUNCTIONS: dict[str, RewardFn] = {
    "r1_zero": _f.r1_zero,
    "question_only": _f.question_only,
    "gsm8k": _f.gsm8k,
    "arithmetic": _f.arithmetic,
    "math": _f.math,
    "final": _f.final,
    "countdown": _f.countdown,
    "multiple_choice": _f.multiple_choice,
    "language": _f.language,
    # R1's rewards as separate terms, to ADD ("answer:1,format:0.5") where r1_zero GATES (rlvr.rewards.format)
    "format": format_reward,
    "answer": answer_reward,
    # one reward per step line besides the outcome (process supervision, rlvr.rewards.steps)
    "sum_steps": sum_steps,
}


def get_reward_fn(name: str) -> RewardFn:
    """Reward function by registered name, or an inline composition "a:w1,b:w2".
    Unknown name -> KeyError listing the known ones."""
    if not isinstance(name, str):
        raise TypeError(f"reward name must be a string, got {type(name).__name__}")
    if ":" in name or "," in name:
        weights: dict[str, float] = {}
        for item in name.split(","):
            key, _, w = item.strip().partition(":")
            try:
                weights[key.strip()] = float(w) if w else 1.0
            except ValueError:
                raise ValueError(f"bad weight {w!r} for {key!r} in reward spec {name!r}") from None
        return compose(weights)
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    extra = _code_reward_fns()
    if name in extra:
        return extra[name]
    known = sorted(set(REWARD_FUNCTIONS) | set(extra))
    raise KeyError(f"unknown reward function {name!r}; known: {', '.join(known)}")


def _code_reward_fns() -> dict[str, RewardFn]:
    """The code-sandbox rewards (rlvr.rewards.code), imported only when asked for by name."""
    try:
        from rlvr.rewards.code.rewards import CODE_REWARD_FUNCTIONS
    except ImportError:
        return {}
    return dict(CODE_REWARD_FUNCTIONS)


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
]
