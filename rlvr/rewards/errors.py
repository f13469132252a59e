"""Reward errors made visible: a reward function never raises into the trainer (score_batch turns an
exception into Reward(0, status=ERROR, info="Type: message")), and this module makes sure such a 0
is never silent.

    log = RewardErrorLog("my_checker:score", run_dir / "reward_errors.jsonl", key="data.reward")
    log.observe(step, rewards, examples)   # prints each new message once, appends to the file,
                                           # raises RewardErrorsStop when most rewards are errors

* The first occurrence of each distinct message is printed on stderr, one line: the reward, the
  exception type and message, the step, the example id and its index in the batch.
* Every step with errors appends one JSON line per distinct message to reward_errors.jsonl:
  {"step", "reward", "message", "count" (that step), "total" (so far), "example_id", "index"}.
* A step where more than STOP_FRACTION of the rewards are errors raises RewardErrorsStop naming the
  reward and the most frequent message. Why one half: a reward that fails on a minority of inputs
  (an edge case of its parser) still scores most of the batch, and its failures are reported; when
  most rewards of a step are errors the reward itself is broken: the step would learn from the few
  scored ones (unscored rewards are kept out of the baseline), and a reward that raises on every call
  would train to the end with no signal.
* With a model judge (`judge`: rlvr.rewards.judge.JudgeReward, data.reward=judge), its failed requests
  are said the same way: the first failure is printed on stderr, one line, naming the judge (judge.url
  or judge.model) and the reason ("cannot reach the judge: Connection refused"); a step where more than
  STOP_FRACTION of the judge requests failed, and so more than STOP_FRACTION of the judged samples got
  judge.fallback instead of a verdict, raises JudgeFailuresStop (an unreachable judge used to train on
  the fallback to the end, silently). The occasional failure keeps its fallback and is counted in
  judge/failures. The counts are peeked (JudgeReward.peek), not taken: the trainer logs them after.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlvr.rewards.judge import FAILED
from rlvr.rewards.types import Reward, Status

STOP_FRACTION = 0.5  # a step with more than this share of ERROR rewards stops the run
MAX_PRINTED = 5  # distinct messages printed; the others are written to the file only


class RewardErrorsStop(RuntimeError):
    """Most rewards of a step were errors (the reward function raised); commands print the message
    as `error: ...` (exit 1), without a traceback."""


class JudgeFailuresStop(RewardErrorsStop):
    """Most of a step's model-judge requests failed (the judge is unreachable, times out or replies
    without a verdict); printed like RewardErrorsStop: `error: ...`, exit 1."""


def _print(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def error_groups(rewards: Sequence[Reward], examples: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """The ERROR rewards grouped by message, in order of first appearance:
    {message: {"count", "example_id", "index"}} (id and index of the first example that had it).
    rewards: anything with .status and .info (Reward, rlvr.eval's EvalSample); examples: the examples
    or their ids."""
    out: dict[str, dict[str, Any]] = {}
    for i, (r, ex) in enumerate(zip(rewards, examples, strict=True)):
        if Status(r.status) is not Status.ERROR:
            continue
        msg = str(r.info) or "error (no message)"
        g = out.get(msg)
        if g is None:
            eid = ex if isinstance(ex, str) else getattr(ex, "id", "")
            out[msg] = {"count": 1, "example_id": str(eid or i), "index": i}
        else:
            g["count"] += 1
    return out


class RewardErrorLog:
    """Tracks the ERROR rewards of a run, step by step (see the module doc). reward: the reward's
    spec ("my_checker:score", "r1_zero"); key: the config key it was set by ("data.reward"; '' = the
    task's default reward); path: reward_errors.jsonl (None = not written); say: where lines are
    printed (stderr); judge: the run's model judge (rlvr.rewards.judge.find_judge of the reward; None
    without one), whose failed requests each step are checked too."""

    def __init__(self, reward: str, path: str | Path | None, *, key: str = "", say: Callable[[str], None] = _print,
                 stop_fraction: float = STOP_FRACTION, judge: Any = None):
        self.reward = reward
        self.label = f"{key}={reward!r}" if key else f"reward {reward}"
        self.path = Path(path) if path is not None else None
        self.say = say
        self.stop_fraction = stop_fraction
        self.totals: dict[str, int] = {}
        self.judge = judge
        self.judge_failures = 0  # failed judge requests seen so far (the first one is printed)

    def observe(self, step: int, rewards: Sequence[Reward], examples: Sequence[Any]) -> None:
        n = len(rewards)
        if self.judge is not None:
            self.observe_judge(step)
            # a sample whose judge request failed (judge.fallback=unscored: an ERROR) is the judge's failure,
            # said by observe_judge, not the reward raising
            kept = [(r, ex) for r, ex in zip(rewards, examples, strict=True) if FAILED not in str(r.info)]
            rewards, examples = [r for r, _ in kept], [ex for _, ex in kept]
        groups = error_groups(rewards, examples)
        if not groups:
            return
        rows = []
        for msg, g in groups.items():
            new = msg not in self.totals
            self.totals[msg] = self.totals.get(msg, 0) + g["count"]
            if new and len(self.totals) <= MAX_PRINTED:
                self.say(f"warning: reward {self.reward} raised {msg} (step {step}, example {g['example_id']}, "
                         f"index {g['index']}); the response is unscored (kept out of its group's baseline, advantage 0); further occurrences are counted in "
                         f"{self.path or 'verifier/errors'}")
            elif new and len(self.totals) == MAX_PRINTED + 1:
                self.say(f"warning: reward {self.reward}: more distinct errors; see {self.path or 'verifier/errors'}")
            rows.append({"step": step, "reward": self.reward, "message": msg, "count": g["count"],
                         "total": self.totals[msg], "example_id": g["example_id"], "index": g["index"]})
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
        n_err = sum(g["count"] for g in groups.values())
        if n and n_err / n > self.stop_fraction:
            msg, g = max(groups.items(), key=lambda kv: kv[1]["count"])
            where = f"; every message is in {self.path}" if self.path is not None else ""
            raise RewardErrorsStop(
                f"step {step}: {n_err} of {n} rewards are errors (more than {self.stop_fraction:.0%}): "
                f"{self.label} raised {msg} (example {g['example_id']}); the run stopped before updating on "
                f"this step. Fix the reward function (it must return a Reward, not raise){where}")

    def observe_judge(self, step: int) -> None:
        """The judge's requests of this step (its counts since the trainer last took them): the first failure
        of the run is printed; more than stop_fraction of the requests failed (and so more than stop_fraction
        of the judged samples got the fallback) raises JudgeFailuresStop."""
        c = self.judge.peek()
        if not c.failures:
            return
        label, fallback = self.judge.label, self.judge.fallback
        if not self.judge_failures:
            self.say(f"warning: the judge failed (step {step}, {c.failures} of {c.calls} requests; {label}): "
                     f"{c.top_reason()}; a sample without a verdict is scored by judge.fallback={fallback}; "
                     "further failures are counted in judge/failures")
        self.judge_failures += c.failures
        frac = self.stop_fraction
        if c.calls and c.failures / c.calls > frac and c.fallbacks > frac * (c.judged + c.fallbacks):
            raise JudgeFailuresStop(
                f"step {step}: {c.failures} of {c.calls} judge requests failed (more than {frac:.0%}; {label}): "
                f"{c.top_reason()}; the judge gave no verdict on {c.fallbacks} of the {c.judged + c.fallbacks} samples "
                f"it was to grade (judge.fallback={fallback} scored them), so the run stopped before updating on "
                "this step. Check that the judge answers there "
                "(a server that is down, a wrong judge.url port or path, judge.timeout_s too short, a model that "
                "replies without EQUIVALENT / DIFFERENT)")


def error_summary(rewards: Sequence[Reward], examples: Sequence[Any]) -> str | None:
    """One line for an evaluation's summary: how many responses the reward failed on and the first
    message; None when there was no error."""
    groups = error_groups(rewards, examples)
    if not groups:
        return None
    msg, g = next(iter(groups.items()))
    n_err = sum(x["count"] for x in groups.values())
    more = f" ({len(groups)} distinct messages)" if len(groups) > 1 else ""
    return (f"reward errors: {n_err} of {len(rewards)} responses scored 0 because the reward raised{more}; "
            f"first: {msg} (example {g['example_id']})")
