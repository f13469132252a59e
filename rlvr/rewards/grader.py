"""Math answer equivalence in tiers: `grade_answer(pred, gold) -> Verdict`. Never raises, never hangs.

This module is the public entry and the map; each stage lives in rlvr.rewards.grading, whose
modules import one way only (normalize <- structure <- compare <- grader, state <- scalar <-
compare; nothing imports grader) and none imports sympy.
Tiers, cheapest first (docs/verifier.md has the labeling policy and the tables):

0. fast path (`grading.scalar.fast_path`): two plain numbers (most GSM8K answers: sign, digits,
   thousands separators, decimals, a leading `$`) compare exactly, before any other work.
1. guard (`grading.normalize.guard`, string level, in-process): length, control characters,
   TeX/Python injection commands, bracket depth and balance, operator counts. Rejects hostile
   input before any algebra; a rejected gold is an ERROR, a rejected prediction INCORRECT.
2. normalization (`grading.normalize.normalize`, in-process): `$`/`\\(`, `\\left`/`\\right`,
   `\\text{}`, spacing commands, thousands separators (`48,000`, `48 000`, `7\\,000`, `{,}`),
   unicode operators. Equal strings after it are CORRECT.
3. structure, in-process: parsing (`grading.structure.structure`: matrices, sets (unordered),
   tuples and intervals (ordered, bracket type matters), unions, bare comma lists (unordered
   solution lists), relations and labels) and comparing (`grading.compare.compare`: subsets of
   the real line, relations (`x = 3` vs `3` equal; `x = 2` vs `y = 2` not), element by element).
4. scalar, in-process exact (`grading.scalar.compare_scalars`): units/currency/percent split off
   (a different unit on both sides is unequal; a unit on one side only is ignored), text
   answers, then our own parser (rlvr.rewards.mathparse) with exact rational arithmetic and the
   decimal tolerance policy (rlvr.rewards.tolerance). Pure Python, no IPC, no sympy.
5. symbolic (`grading.scalar.run_symbolic`): anything irrational or with variables goes to
   rlvr.rewards.symbolic in a killable worker process (rlvr.rewards.pool) under a wall-clock
   deadline. sympy is imported there only, never by this layer.

State (`grading.state`, each object created once there): the settings per context (`TIMEOUT`
via `verifier_timeout`, `TOLERANCE` via `verifier_tolerance`, or per call), `STATS` (the one
`VerifierStats`) and `CACHE` (the one `VerdictCache`): results are cached per (pred, gold,
tolerance), timeouts included (the same pair would time out again), errors not.
"""

from __future__ import annotations

from rlvr.rewards.grading.compare import compare
from rlvr.rewards.grading.normalize import (
    MAX_ANSWER_CHARS,
    MAX_BRACKET_DEPTH,
    MAX_POWER_OPS,
    guard,
    normalize,
)
from rlvr.rewards.grading.scalar import Quantity, fast_path, quantity
from rlvr.rewards.grading.state import (
    CACHE,
    CACHE_MAX_KEY_CHARS,
    CACHE_SIZE,
    DEFAULT_TIMEOUT_S,
    DEFAULT_TOLERANCE,
    STATS,
    TIMEOUT,
    TOLERANCE,
    Verdict,
    VerdictCache,
    VerifierStats,
    verifier_timeout,
    verifier_tolerance,
)
from rlvr.rewards.grading.structure import structure
from rlvr.rewards.tolerance import TOLERANCES
from rlvr.rewards.types import Status

__all__ = [
    "CACHE",
    "CACHE_MAX_KEY_CHARS",
    "CACHE_SIZE",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_TOLERANCE",
    "MAX_ANSWER_CHARS",
    "MAX_BRACKET_DEPTH",
    "MAX_POWER_OPS",
    "STATS",
    "Quantity",
    "Verdict",
    "VerdictCache",
    "VerifierStats",
    "grade_answer",
    "guard",
    "is_equivalent",
    "normalize",
    "quantity",
    "set_cache",
    "structure",
    "verifier_timeout",
    "verifier_tolerance",
]


def set_cache(enabled: bool) -> None:
    """Turn the (pred, gold) cache on or off (benchmarks measure without it); clears it."""
    CACHE.set_enabled(enabled)


def _grade(pred: str, gold: str) -> Verdict:
    """Tiers 1 to 5 (see the module docstring) for a pair the fast path did not decide."""
    why = guard(gold)
    if why is not None:
        return Verdict(Status.ERROR, f"gold answer rejected by guard: {why}", "guard")
    why = guard(pred)
    if why is not None:
        return Verdict(Status.INCORRECT, f"guard: {why}", "guard")
    p, g = normalize(pred), normalize(gold)
    if not p:
        return Verdict(Status.INCORRECT, "empty answer", "exact")
    if p == g:
        return Verdict(Status.CORRECT, "identical after normalization", "exact")
    return compare(structure(p), structure(g))


def grade_answer(pred: str, gold: str, timeout_s: float | None = None, tolerance: str | None = None) -> Verdict:
    """Is the predicted answer `pred` the same as the `gold` answer? Never raises.

    `timeout_s` bounds the symbolic tier (default: the `verifier_timeout` context, else
    RLVR_VERIFIER_TIMEOUT_S, else 3 s). `tolerance` names the decimal rule, "strict" (about six
    significant digits) or "lenient" (a correct rounding with 3+ significant digits); default:
    the `verifier_tolerance` context, else RLVR_VERIFIER_TOLERANCE, else "strict".
    Status CORRECT / INCORRECT / TIMEOUT / ERROR."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return Verdict(Status.ERROR, "answers must be strings", "guard")
    if tolerance is None:
        tolerance = TOLERANCE.get()
    elif tolerance not in TOLERANCES:
        return Verdict(Status.ERROR, f"unknown tolerance {tolerance!r}; known: {', '.join(TOLERANCES)}", "guard")
    try:
        fast = fast_path(pred, gold)
    except Exception as exc:  # noqa: BLE001 - the fast path must not raise either
        fast = Verdict(Status.ERROR, f"{type(exc).__name__}: {exc}"[:300], "error")
    if fast is not None:
        STATS.add(fast.status.value)
        return fast
    key = (pred, gold, tolerance)
    use_cache = CACHE.accepts(pred, gold)
    if use_cache:
        hit = CACHE.get(key)
        if hit is not None:
            STATS.add("cache_hits")
            STATS.add(hit.status.value)
            return hit
    token = TIMEOUT.set(float(timeout_s)) if timeout_s is not None else None
    tol_token = TOLERANCE.set(tolerance)
    try:
        verdict = _grade(pred, gold)
    except RecursionError:
        verdict = Verdict(Status.INCORRECT, "guard: nesting too deep", "guard")
    except Exception as exc:  # noqa: BLE001 - a grader bug must not reach the trainer
        verdict = Verdict(Status.ERROR, f"{type(exc).__name__}: {exc}"[:300], "error")
    finally:
        TOLERANCE.reset(tol_token)
        if token is not None:
            TIMEOUT.reset(token)
    STATS.add(verdict.status.value)
    STATS.add(f"tier:{verdict.tier}")
    if use_cache and verdict.status is not Status.ERROR:
        CACHE.put(key, verdict)
    return verdict


def is_equivalent(pred: str, gold: str, timeout_s: float | None = None, tolerance: str | None = None) -> bool:
    """Convenience: grade_answer(...).status is CORRECT."""
    return grade_answer(pred, gold, timeout_s, tolerance).status is Status.CORRECT
