"""Tolerance policy for decimal answers (documented in docs/verifier.md).

* Two exact values (integers, fractions, exact expressions) compare exactly.
* Two finite decimal literals compare exactly: 0.5 == 0.50, 3.14 != 3.1416, 1.0 == 1.
* A decimal literal PREDICTED for an exact value that it does not equal exactly is judged by the
  named tolerance (`grade_answer(..., tolerance=...)`, default "strict"):

  "strict" (default): the decimal must agree with the exact value to about six significant
    digits: a relative difference of at most 1e-6 (`STRICT_RELATIVE`), or a correct rounding of
    the value to the digits shown with at least 6 significant digits (`STRICT_MIN_SIGNIFICANT`).
    3.14159 ~ pi, 1.41421 ~ sqrt(2), 0.333333 ~ 1/3 (yes); 3.14 ~ pi, 0.333 ~ 1/3, 2.718 ~ e,
    3.1416 ~ pi (no). Rewarding three-digit roundings would teach a policy to avoid exact forms.
  "lenient": the earlier rule: a correct rounding of the value to the digits shown with at least
    3 significant digits (`LENIENT_MIN_SIGNIFICANT`): 1/3 ~ 0.333 (yes), 0.3333 (yes),
    0.33 (no: 2 digits), 0.334 (no: wrong rounding), 2/3 ~ 0.667 (yes), 0.666 (no: truncated).

* A decimal GOLD answer (a data set that rounds, "0.6667") is taken at its own precision under
  either tolerance: an exact prediction that rounds to it with at least 3 significant digits is
  accepted (`\\frac{2}{3}` for gold `0.6667`). Only the prediction's rounding is what a policy
  could learn to exploit.

Neither rule ever makes two different integers or two different decimals equal, and neither uses
an absolute tolerance (which is how 1/3^40 == 1/3^41 slips through absolute-tolerance graders).
"""

from __future__ import annotations

from fractions import Fraction

STRICT = "strict"
LENIENT = "lenient"
TOLERANCES = (STRICT, LENIENT)
DEFAULT_TOLERANCE = STRICT

STRICT_RELATIVE = Fraction(1, 10**6)
STRICT_MIN_SIGNIFICANT = 6
LENIENT_MIN_SIGNIFICANT = 3
MIN_SIGNIFICANT = LENIENT_MIN_SIGNIFICANT  # the lenient rule's digits (kept for older imports)


def check_tolerance(name: str | None) -> str:
    """The tolerance name, validated ("strict" when None); ValueError listing the known ones."""
    if name is None:
        return DEFAULT_TOLERANCE
    if name not in TOLERANCES:
        raise ValueError(f"unknown tolerance {name!r}; known: {', '.join(TOLERANCES)}")
    return name


def significant_digits(value: Fraction, quantum: Fraction) -> int:
    """Number of significant digits a decimal literal shows: |value| / quantum as an integer."""
    steps = abs(value) / quantum
    if steps.denominator != 1:
        return 0
    n = steps.numerator
    if not n:
        return 0
    # digit count without str() (Python refuses str() of ints over 4,300 digits)
    digits = max(1, int(n.bit_length() * 0.30102999566398120))
    while 10**digits <= n:
        digits += 1
    while digits > 1 and 10 ** (digits - 1) > n:
        digits -= 1
    return digits


def _rounds_to(d: Fraction, quantum: Fraction, x: Fraction, min_digits: int) -> bool:
    return significant_digits(d, quantum) >= min_digits and abs(d - x) <= quantum / 2


def decimal_matches(decimal_value, quantum: Fraction, exact, tolerance: str = DEFAULT_TOLERANCE) -> bool:
    """Is the predicted decimal `decimal_value` (a literal shown to step `quantum`) close enough
    to `exact` under the named tolerance? (See the module doc.)"""
    d = decimal_value if isinstance(decimal_value, Fraction) else Fraction(str(decimal_value))
    x = exact if isinstance(exact, Fraction) else Fraction(str(exact))
    if d == x:
        return True
    if tolerance == LENIENT:
        return _rounds_to(d, quantum, x, LENIENT_MIN_SIGNIFICANT)
    return abs(d - x) <= STRICT_RELATIVE * abs(x) or _rounds_to(d, quantum, x, STRICT_MIN_SIGNIFICANT)


def gold_decimal_matches(decimal_value, quantum: Fraction, exact) -> bool:
    """Does the exact prediction `exact` round to the gold decimal `decimal_value`? (A gold
    decimal is taken at its own precision, whatever the tolerance.)"""
    d = decimal_value if isinstance(decimal_value, Fraction) else Fraction(str(decimal_value))
    x = exact if isinstance(exact, Fraction) else Fraction(str(exact))
    return d == x or _rounds_to(d, quantum, x, LENIENT_MIN_SIGNIFICANT)
