"""Batch scoring: N (response, example) pairs -> N Rewards, in input order, never raising.

    rewards = score_batch("r1_zero", responses, examples, workers=4, timeout_s=3.0)
    counters = ScoreCounters.of(rewards)          # per-status counts, timeouts, errors

Two modes, one signature:

* default (`isolate=False`): each reward function runs in the calling process, on `workers`
  threads. Its cheap parts (extraction, guard, the exact fast path) need no IPC at all; only the
  symbolic tier is sent to the shared killable worker pool (rlvr.rewards.pool), sized to at least
  `workers`, each call bounded by `timeout_s`. Pure-Python fast paths hold the GIL, so threads
  mainly overlap the symbolic waits.
* `isolate=True`: the WHOLE reward function runs in a killable worker process per call under
  `timeout_s`. For reward functions that are not ours (or the code sandbox's), which might hang in
  their own code; a hung call becomes Reward(0, status=TIMEOUT). The function must be importable
  by name: a registered name, a "module:function" string, or a picklable module-level callable.

Results are deterministic for a given input (each item is scored independently; the (pred, gold)
cache only stores verdicts that a re-run would reproduce), except that a timeout depends on the
machine's speed by nature. Timeouts and errors are counted in `ScoreCounters`, never hidden.
"""

from __future__ import annotations

import collections
import contextvars
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlvr.rewards import pool as _pool
from rlvr.rewards.grader import DEFAULT_TIMEOUT_S, verifier_timeout
from rlvr.rewards.registry import get_reward_fn
from rlvr.rewards.types import ExampleLike, Reward, RewardFn, SimpleExample, Status


@dataclass
class ScoreCounters:
    """What happened in one or more batches. `by_status` counts every status (correct,
    incorrect, unparsable, timeout, error); `seconds` is wall time spent in score_batch."""

    total: int = 0
    by_status: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in Status})
    format_ok: int = 0  # rewards with Reward.formatted (a "format" part > 0)
    with_format: int = 0  # rewards that report a "format" part at all
    seconds: float = 0.0

    @property
    def timeouts(self) -> int:
        return self.by_status.get(Status.TIMEOUT.value, 0)

    @property
    def errors(self) -> int:
        return self.by_status.get(Status.ERROR.value, 0)

    @property
    def accuracy(self) -> float:
        return self.by_status.get(Status.CORRECT.value, 0) / self.total if self.total else 0.0

    @property
    def format_rate(self) -> float:
        """rlvr.rewards.types.format_rate over the rewards added: NaN when none had a format part."""
        return self.format_ok / self.total if self.with_format else math.nan

    @property
    def per_second(self) -> float:
        return self.total / self.seconds if self.seconds > 0 else 0.0

    def add(self, rewards: Sequence[Reward], seconds: float = 0.0) -> None:
        for r in rewards:
            self.total += 1
            key = r.status.value if isinstance(r.status, Status) else str(r.status)
            self.by_status[key] = self.by_status.get(key, 0) + 1
            self.with_format += "format" in r.parts
            self.format_ok += r.formatted
        self.seconds += seconds

    @classmethod
    def of(cls, rewards: Sequence[Reward], seconds: float = 0.0) -> ScoreCounters:
        c = cls()
        c.add(rewards, seconds)
        return c

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "accuracy": self.accuracy,
            "format_rate": None if math.isnan(self.format_rate) else self.format_rate,  # JSON has no NaN
            "by_status": dict(self.by_status),
            "timeouts": self.timeouts,
            "errors": self.errors,
            "seconds": self.seconds,
            "per_second": self.per_second,
        }


def _as_example(ex: ExampleLike | str | Mapping) -> ExampleLike:
    if isinstance(ex, str):
        return SimpleExample(ex)
    if isinstance(ex, Mapping):
        return SimpleExample(str(ex["reference"]), dict(ex.get("meta") or {}))
    return ex


def resolve_reward_fn(reward_fn: str | RewardFn) -> RewardFn:
    """A RewardFn from a callable, a registered name / inline composition ("r1_zero:1,language:0.1"),
    or a "module:function" path (anything after ":" that is not a number)."""
    if callable(reward_fn):
        return reward_fn
    if not isinstance(reward_fn, str):
        raise TypeError(f"reward function must be a name or a callable, got {type(reward_fn).__name__}")
    if ":" in reward_fn and "," not in reward_fn:
        _, _, attr = reward_fn.partition(":")
        try:
            float(attr)
        except ValueError:
            return _pool.resolve(reward_fn)  # "module:function"
    return get_reward_fn(reward_fn)


def _safe(fn: RewardFn, response: str, example: ExampleLike) -> Reward:
    try:
        out = fn(response, example)
        if not isinstance(out, Reward):
            return Reward(0.0, {}, Status.ERROR, f"reward function returned {type(out).__name__}, not Reward")
        return out
    except Exception as exc:  # noqa: BLE001 - never raise into the trainer
        return Reward(0.0, {}, Status.ERROR, f"{type(exc).__name__}: {exc}"[:300])


def run_reward_in_worker(reward_fn: str | RewardFn, response: str, reference: str, meta: dict) -> Reward:
    """Worker-side entry point of isolate mode (importable by name)."""
    return _safe(resolve_reward_fn(reward_fn), response, SimpleExample(reference, meta))


def score_batch(
    reward_fn: str | RewardFn,
    responses: Sequence[str],
    examples: Sequence[ExampleLike | str | Mapping],
    *,
    workers: int = 1,
    timeout_s: float | None = None,
    isolate: bool = False,
    counters: ScoreCounters | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Reward]:
    """Score responses[i] against examples[i] for all i; returns rewards in input order.

    reward_fn: registered name ("r1_zero", "r1_zero:1,language:0.1"), "module:function", or a
      RewardFn. examples: ExampleLike objects, reference strings, or {"reference", "meta"} dicts.
    workers: threads (and at least this many verifier processes). timeout_s: deadline per
      symbolic check (isolate=False) or per whole reward call (isolate=True); default
      RLVR_VERIFIER_TIMEOUT_S or 3 s. counters: updated in place if given.
    progress: called with the number of items finished so far (from worker threads).
    An identical (response, example object) pair is scored once and its Reward shared."""
    if len(responses) != len(examples):
        raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    timeout = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    exs = [_as_example(e) for e in examples]
    t0 = time.perf_counter()
    out: list[Reward | None] = [None] * len(responses)
    done = [0]

    if isolate:
        resolve_reward_fn(reward_fn)  # fail now on an unknown name
        pool = _pool.get_pool(min_size=workers)

        def one(i: int) -> None:
            ex = exs[i]
            meta = dict(getattr(ex, "meta", None) or {})
            res = pool.call(
                "rlvr.rewards.batch:run_reward_in_worker", (reward_fn, responses[i], ex.reference, meta), timeout
            )
            if res.status == "ok":
                out[i] = res.value
            elif res.status == "timeout":
                out[i] = Reward(0.0, {}, Status.TIMEOUT, res.info)
            else:
                out[i] = Reward(0.0, {}, Status.ERROR, res.info)

    else:
        fn = resolve_reward_fn(reward_fn)
        if workers > 1:
            _pool.get_pool(min_size=workers)
        if hasattr(fn, "prepare_batch"):  # batch work first (the model judge's requests, rlvr.rewards.judge)
            fn.prepare_batch(list(responses), exs, workers=workers, timeout_s=timeout)

        def one(i: int) -> None:
            with verifier_timeout(timeout):
                out[i] = _safe(fn, responses[i], exs[i])

    # An identical (response, example) pair is scored once (a verifiable reward is a function of the two;
    # a group's samples often agree: 357 distinct of the demo's 512), the copies take its Reward.
    n = len(responses)
    first: dict[tuple[str, int], int] = {}
    source = [first.setdefault((responses[i], id(examples[i])), i) for i in range(n)]
    todo = list(first.values())
    copies = collections.Counter(source)

    def run_chunk(indices: Sequence[int]) -> None:
        for i in indices:
            one(i)
            if progress is not None:
                done[0] += copies[i]
                progress(done[0])

    m = len(todo)
    if workers == 1 or m <= 1:
        run_chunk(todo)
    else:
        # interleaved chunks keep slow items (symbolic checks) spread over the threads
        chunks = [todo[k::workers] for k in range(min(workers, m))]
        with ThreadPoolExecutor(max_workers=len(chunks), thread_name_prefix="rlvr-score") as ex:
            futures = [ex.submit(contextvars.copy_context().run, run_chunk, c) for c in chunks]
            for f in futures:
                f.result()
    rewards: list[Reward] = [out[j] if out[j] is not None else Reward(0.0, {}, Status.ERROR, "not scored")
                             for j in source]
    if counters is not None:
        counters.add(rewards, time.perf_counter() - t0)
    return rewards


def score_rollouts(rollouts, examples, reward_fn, *, workers: int = 1, timeout_s: float = 0.0,
                   isolate: bool = False) -> list[Reward]:
    """Task rewards of each rollout through rlvr.rewards.score_batch: hard deadlines, and a timeout
    or a crash becomes a TIMEOUT / ERROR status that is counted (verifier/*), never a silent 0."""
    return score_batch(reward_fn, [r.text for r in rollouts], list(examples), workers=workers,
                       timeout_s=timeout_s or None, isolate=isolate)
