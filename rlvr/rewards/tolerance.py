"""Tolerance policy for decimal answers (documented in docs/verifier.md).

* Two exact values (integers, fractions, exact expressions) compare exactly.
* Two finite decimal literals compare exactly: 0.5 == 0.50, 3.14 != 3.1416, 1.0 == 1.
* A decimal literal against an exact value that it does not equal exactly is accepted only as
  a correct rounding of that value to the digits shown, with at least `MIN_SIGNIFICANT` significant
  digits: 1/3 ~ 0.333 (yes), 0.3333 (yes), 0.33 (no: 2 digits), 0.334 (no: wrong rounding),
  2/3 ~ 0.667 (yes), 0.666 (no: truncated, not rounded). sqrt(2) ~ 1.414 (yes).
  This never makes two different integers or two different decimals equal, and never accepts
  a tolerance relative to the size of the number (which is how 1/3^40 == 1/3^41 slips through
  relative-tolerance graders).
"""

from __future__ import annotations

from fractions import Fraction

MIN_SIGNIFICANT = 3


def significant_digits(value: Fraction, quantum: Fraction) -> int:
    """Number of significant digits a decimal literal shows: |value| / quantum as an integer."""
    steps = abs(value) / quantum
    if steps.denominator != 1:
        return 0
    return len(str(steps.numerator)) if steps else 0


def decimal_matches(decimal_value, quantum: Fraction, exact) -> bool:
    """Is `decimal_value` (a literal shown to step `quantum`) a correct rounding of `exact`?"""
    d = decimal_value if isinstance(decimal_value, Fraction) else Fraction(str(decimal_value))
    x = exact if isinstance(exact, Fraction) else Fraction(str(exact))
    if d == x:
        return True
    if significant_digits(d, quantum) < MIN_SIGNIFICANT:
        return False
    return abs(d - x) <= quantum / 2
