"""Math answer equivalence: `grade_answer(pred, gold) -> Verdict` (placeholder tier, deepened below)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from rlvr.rewards.types import Status


@dataclass(frozen=True)
class Verdict:
    """Outcome of comparing one predicted answer with one gold answer."""

    status: Status  # CORRECT / INCORRECT / TIMEOUT / ERROR (UNPARSABLE is the extractor's)
    info: str = ""  # short reason: which tier decided, or why it gave up
    tier: str = ""  # "exact", "text", "structure", "symbolic", "guard", "cache"


def _num(s: str) -> Fraction | None:
    try:
        return Fraction(s.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def grade_answer(pred: str, gold: str, timeout_s: float | None = None) -> Verdict:
    """Is `pred` the same answer as `gold`? Never raises."""
    if pred.strip() == gold.strip():
        return Verdict(Status.CORRECT, "identical", "exact")
    a, b = _num(pred), _num(gold)
    if a is not None and b is not None:
        return Verdict(Status.CORRECT if a == b else Status.INCORRECT, "numbers", "exact")
    return Verdict(Status.INCORRECT, "differs", "exact")
