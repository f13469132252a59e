"""Evaluation metrics on plain numbers: pass@k, maj@k, format rate, length statistics.

Definitions (docs/runs.md repeats them):

- accuracy: fraction of all samples whose reward status is `correct`. With n samples per problem
  this is the unbiased pass@1 estimate, averaged over problems (every problem has the same n).
- pass@k: per problem with n samples of which c are correct, the unbiased estimator of Chen et
  al. (2021) 1 - C(n-c, k) / C(n, k), averaged over problems. Needs k <= n.
- maj@k (majority vote over k samples): per problem, the n samples are cut in order into
  floor(n/k) disjoint groups of k ([0, k), [k, 2k), ...; the n mod k left over are unused). In a
  group, every sample the reward graded (status correct or incorrect) votes for its answer;
  unparsable, timed-out and errored samples abstain. All correct answers count as one answer
  (each is equivalent to the reference); an incorrect answer is its extracted text
  (Reward.answer, else rlvr.rewards.extract.final_answer of the response) after
  rlvr.rewards.grader.normalize. The answer with the most votes wins; a tie goes to the tied
  answer whose first vote came earliest in the group (sample order), so the result is
  deterministic. A group scores 1 when the winner is the correct answer, 0 otherwise (also when
  nobody voted). maj@k of a problem is the mean over its groups, and the reported maj@k the mean
  over problems. Each group is k independent samples, so every group's score is an unbiased
  estimate of "a k-sample majority vote is right"; averaging disjoint groups only lowers the
  variance (pass@k's all-subsets average has no closed form for a vote). maj@1 = accuracy.
  Merging the correct answers but comparing wrong ones as text tilts slightly towards the
  correct answer when the model writes one wrong value in several forms ("12" vs "12.0").
- format rate: fraction of samples whose reward has a "format" part > 0 (Reward.formatted,
  rlvr.rewards.types.format_rate: the one definition behind eval, the demo table, the training
  metric, the plots and `rlvr grade`). When no sample's reward reports a "format" part (the
  reward has none), the format rate is NaN and tables show "n/a" (the training metric is then
  not logged): a reward without a format term says nothing about format, and counting
  extractable answers as "formatted" would print a number that means something else (the
  unparsable count says how many had no answer).
- lengths are response lengths in tokens the policy sampled (EOS/stop tokens included, prompt excluded;
  a thinking budget's forced "stop thinking" text is not counted: rlvr.rollout.types.sampled_length);
  `truncated_rate` is the fraction that hit max_tokens (finish_reason == "length").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.rewards.grader import normalize
from rlvr.rewards.types import Status


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials (exact
    in exact arithmetic; the product form is how Chen et al. evaluate it stably). n samples,
    c of them correct, 1 <= k <= n.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or int(v) != v:
            raise ValueError(f"pass_at_k: {name} must be an integer, got {v!r}")
    n, c, k = int(n), int(c), int(k)
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Average of pass_at_k(n, c, k) over problems given as (n, c) pairs."""
    if not counts:
        raise ValueError("mean_pass_at_k: no problems")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


# What a sample votes for in maj@k: ("correct", "") for every correct sample, ("incorrect", text)
# for a wrong answer. A tuple, so no answer text can collide with the correct class.
VoteKey = tuple[str, str]
CORRECT_VOTE: VoteKey = ("correct", "")
_MAX_ANSWER_CHARS = 1000  # model output is hostile: cap before normalize()'s regexes


def vote_key(correct: bool, answer: str | None) -> VoteKey | None:
    """What a sample votes for in maj@k (see the module docstring): CORRECT_VOTE for a correct
    sample, ("incorrect", normalized answer) for an incorrect one, None (abstain) for an incorrect
    one without an answer."""
    if correct:
        return CORRECT_VOTE
    if answer is None:
        return None

    return ("incorrect", normalize(answer[:_MAX_ANSWER_CHARS]))


def majority_vote(keys: Sequence[VoteKey | None]) -> VoteKey | None:
    """The most frequent non-None key; a tie goes to the tied key that appears first. None when
    every sample abstained."""
    counts: dict[VoteKey, int] = {}
    for key in keys:
        if key is not None:
            counts[key] = counts.get(key, 0) + 1  # dict keeps first-appearance order
    if not counts:
        return None
    best = max(counts.values())
    return next(key for key, c in counts.items() if c == best)


def maj_at_k(keys: Sequence[VoteKey | None], k: int) -> float:
    """maj@k of one problem from its n samples' vote keys (vote_key), in sample order: the mean
    over the floor(n/k) disjoint groups of k consecutive samples of [the group's vote is correct].
    1 <= k <= n."""
    n = len(keys)
    if isinstance(k, bool) or int(k) != k or not 1 <= k <= n:
        raise ValueError(f"maj_at_k: need 1 <= k <= n, got k={k!r}, n={n}")
    k = int(k)
    groups = n // k
    wins = sum(majority_vote(keys[g * k:(g + 1) * k]) == CORRECT_VOTE for g in range(groups))
    return wins / groups


def mean_maj_at_k(per_problem: Sequence[Sequence[VoteKey | None]], k: int) -> float:
    """Average of maj_at_k over problems (each given as its samples' vote keys)."""
    if not per_problem:
        raise ValueError("mean_maj_at_k: no problems")
    return sum(maj_at_k(keys, k) for keys in per_problem) / len(per_problem)


def default_ks(n: int) -> list[int]:
    """k values reported for n samples per problem: 1, 2, 4, 8, ... below n, and n itself."""
    ks = [1]
    while ks[-1] * 2 < n:
        ks.append(ks[-1] * 2)
    if n > 1:
        ks.append(n)
    return ks


def is_formatted(parts: Mapping[str, float], status: Status | str | None = None) -> bool:
    """The format predicate (see module doc, Reward.formatted): parts["format"] > 0. `status` is
    accepted for old callers and plays no part."""
    return float(parts.get("format", 0.0)) > 0


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def length_stats(lengths: Sequence[int], correct: Sequence[bool] | None = None) -> dict[str, float]:
    """mean / median / max response length in tokens, and the means over correct and incorrect
    samples (NaN when there are none)."""
    if not lengths:
        return {"len/mean": math.nan, "len/median": math.nan, "len/max": math.nan,
                "len/correct": math.nan, "len/incorrect": math.nan}
    s = sorted(lengths)
    mid = len(s) // 2
    median = float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
    out = {"len/mean": _mean(lengths), "len/median": median, "len/max": float(s[-1])}
    if correct is not None:
        if len(correct) != len(lengths):
            raise ValueError(f"length_stats: {len(correct)} flags for {len(lengths)} lengths")
        out["len/correct"] = _mean([n for n, ok in zip(lengths, correct, strict=True) if ok])
        out["len/incorrect"] = _mean([n for n, ok in zip(lengths, correct, strict=True) if not ok])
    return out


def status_counts(statuses: Sequence[Status | str]) -> dict[str, int]:
    """Count per reward status, every status present (0 when absent), in Status order."""
    counts = {s.value: 0 for s in Status}
    for st in statuses:
        counts[Status(st).value] += 1
    return counts


def is_fraction_metric(name: str) -> bool:
    """Whether a metric is a fraction in [0, 1] shown as a percentage in tables."""
    base = name.rsplit("/", 1)[-1].lower()
    return any(t in base for t in ("accuracy", "rate", "pass@", "maj@", "frac"))


def is_format_metric(name: str) -> bool:
    """format_rate, eval/format_rate, "format rate (greedy)", ...: NaN there means "n/a"."""
    return "format" in name.rsplit("/", 1)[-1].lower()


def format_metric(name: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        # A format rate is NaN when the reward has no format part (see the module docstring):
        # "n/a", not a missing value.
        return "n/a" if is_format_metric(name) else "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if is_fraction_metric(name):
        return f"{100 * float(value):.1f}%"
    return f"{float(value):.2f}" if abs(float(value)) < 100 else f"{float(value):.1f}"


def format_delta(name: str, before: Any, after: Any) -> str:
    try:
        b, a = float(before), float(after)
    except (TypeError, ValueError):
        return "-"
    if math.isnan(a) or math.isnan(b):
        return "-"
    if is_fraction_metric(name):
        return f"{100 * (a - b):+.1f} pts"
    return f"{a - b:+.2f}"
