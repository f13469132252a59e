"""Reward functions by name: the registry (`REWARD_FUNCTIONS`, `get_reward_fn`), the weighted sums named
inline ("r1_zero:1.0,language:0.1" -> `compose` -> `ComposedReward`) and a reward graded under a named decimal
tolerance (`with_tolerance`). The code-sandbox rewards (rlvr.rewards.code) join the registry when first named."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlvr.rewards.format import answer_reward, format_reward
from rlvr.rewards.functions import (
    arithmetic,
    countdown,
    final,
    gsm8k,
    language,
    math,
    multiple_choice,
    question_only,
    r1_zero,
)
from rlvr.rewards.grader import verifier_tolerance
from rlvr.rewards.judge import UNCONFIGURED_JUDGE
from rlvr.rewards.reasoning_gym import reasoning_gym, reasoning_gym_r1_zero
from rlvr.rewards.steps import sum_steps
from rlvr.rewards.tolerance import check_tolerance
from rlvr.rewards.types import ExampleLike, Reward, RewardFn, Status

REWARD_FUNCTIONS: dict[str, RewardFn] = {
    "r1_zero": r1_zero,
    "question_only": question_only,
    "gsm8k": gsm8k,
    "arithmetic": arithmetic,
    "math": math,
    "final": final,
    "countdown": countdown,
    "multiple_choice": multiple_choice,
    "language": language,
    # R1's rewards as separate terms, to ADD ("answer:1,format:0.5") where r1_zero GATES (rlvr.rewards.format)
    "format": format_reward,
    "answer": answer_reward,
    # one reward per step line besides the outcome (process supervision, rlvr.rewards.steps)
    "sum_steps": sum_steps,
    # a model judge of answer equivalence (rlvr.rewards.judge): an ERROR until a run binds the judge section's
    # judge to it (bind_reward, at load_task_data)
    "judge": UNCONFIGURED_JUDGE,
    # reasoning-gym's own score_answer (data.task=reasoning_gym:<dataset>; rlvr.rewards.reasoning_gym)
    "reasoning_gym": reasoning_gym,
    "reasoning_gym_r1_zero": reasoning_gym_r1_zero,
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
        from rlvr.rewards.code.rewards import (
            CODE_REWARD_FUNCTIONS,  # lazy: the sandbox is loaded only when named
        )
    except ImportError:
        return {}
    return dict(CODE_REWARD_FUNCTIONS)


# Worst statuses first: a composed reward reports a timeout or error of any term.
_STATUS_PRIORITY = (Status.ERROR, Status.TIMEOUT)


@dataclass(frozen=True)
class ComposedReward:
    """Weighted sum of named reward functions. total = sum_i w_i * total_i; parts hold every
    term's total under its name and its own parts as "name/part"; status is the first term's
    unless any term timed out or errored (then that, so it is counted)."""

    weights: tuple[tuple[str, float], ...]  # ((name, weight), ...), order kept
    # terms bound to an object instead of the registry's (the run's configured judge: bind_reward)
    bound: tuple[tuple[str, RewardFn], ...] = ()

    def _fn(self, name: str) -> RewardFn:
        for key, fn in self.bound:
            if key == name:
                return fn
        return get_reward_fn(name)

    def prepare_batch(self, responses, examples, **kw) -> None:
        """Batch work of the terms that have any (the judge's requests), before the per-sample calls."""
        for name, _ in self.weights:
            fn = self._fn(name)
            if hasattr(fn, "prepare_batch"):
                fn.prepare_batch(responses, examples, **kw)

    def __call__(self, response: str, example: ExampleLike) -> Reward:
        total = 0.0
        parts: dict[str, float] = {}
        statuses: list[Status] = []
        infos: list[str] = []
        for name, weight in self.weights:
            r = self._fn(name)(response, example)
            total += weight * r.total
            parts[name] = r.total
            for k, v in r.parts.items():
                parts[f"{name}/{k}"] = v
            statuses.append(r.status)
            if r.info:
                infos.append(f"{name}: {r.info}")
        status = statuses[0] if statuses else Status.ERROR
        for bad in _STATUS_PRIORITY:
            if bad in statuses:
                status = bad
                break
        return Reward(total, parts, status, "; ".join(infos)[:500])


@dataclass(frozen=True)
class WithTolerance:
    """A reward function whose answers are graded under a named decimal tolerance:
    "strict" (the default: about six significant digits) or "lenient" (a correct rounding with
    3+ significant digits; see rlvr.rewards.tolerance). Picklable when `fn` is (a registered
    reward is), so it works in `score_batch(..., isolate=True)` workers too."""

    fn: RewardFn
    tolerance: str

    def __call__(self, response: str, example: ExampleLike) -> Reward:
        with verifier_tolerance(self.tolerance):
            return self.fn(response, example)

    def prepare_batch(self, responses, examples, **kw) -> None:
        if hasattr(self.fn, "prepare_batch"):
            with verifier_tolerance(self.tolerance):
                self.fn.prepare_batch(responses, examples, **kw)


def bind_reward(fn: RewardFn, name: str, impl: RewardFn) -> RewardFn:
    """`fn` with its registered term `name` replaced by `impl` (a run's configured judge for "judge"): the
    registry's own function itself, a composition's term, inside a tolerance wrapper; else `fn` unchanged."""
    if fn is REWARD_FUNCTIONS.get(name):
        return impl
    if isinstance(fn, ComposedReward) and any(k == name for k, _ in fn.weights):
        return ComposedReward(fn.weights, tuple((k, f) for k, f in fn.bound if k != name) + ((name, impl),))
    if isinstance(fn, WithTolerance):
        return WithTolerance(bind_reward(fn.fn, name, impl), fn.tolerance)
    return fn


def with_tolerance(fn: RewardFn | str, tolerance: str | None) -> RewardFn:
    """`fn` (a RewardFn or a registered name) graded under `tolerance` ("strict" | "lenient");
    None returns it unchanged (the process default applies). ValueError for an unknown name."""
    if isinstance(fn, str):
        fn = get_reward_fn(fn)
    if tolerance is None:
        return fn
    return WithTolerance(fn, check_tolerance(tolerance))


def compose(weights: Mapping[str, float]) -> RewardFn:
    """`compose({"r1_zero": 1.0, "language": 0.1})` -> one RewardFn. Names are checked now."""
    if not weights:
        raise ValueError("compose() needs at least one reward name")
    for name in weights:
        get_reward_fn(name)  # fails early, listing the known names
    return ComposedReward(tuple((str(k), float(v)) for k, v in weights.items()))
