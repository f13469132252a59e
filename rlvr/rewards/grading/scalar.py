"""Tiers 4 and 5 of the grader, for one pair of scalars (also each element of a structure):
units, currency and percent split off (`quantity`), choice letters and text answers, then our
own parser (rlvr.rewards.mathparse) with exact rational arithmetic and the decimal tolerance
policy (rlvr.rewards.tolerance), in-process, no IPC, no sympy. What that cannot decide (an
irrational value, variables) goes to rlvr.rewards.symbolic in a worker (`run_symbolic`).
Before all tiers, `fast_path` compares two plain numbers with no normalization at all."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from rlvr.rewards import mathparse as mp
from rlvr.rewards import pool as _pool
from rlvr.rewards.grading.state import STATS, TIMEOUT, TOLERANCE, Verdict
from rlvr.rewards.tolerance import decimal_matches, gold_decimal_matches
from rlvr.rewards.types import Status

# ---------------------------------------------------------------------------------------------
# 0. Fast path: two plain numbers

_FAST_MAX_CHARS = 64
_SIMPLE_INT = re.compile(r"^-?\d{1,30}$")
# Plain numbers as models write GSM8K answers: optional "$"/"\$", sign, digits with "," or " "
# thousands separators, optional decimals. Two such numbers compare exactly (the tolerance policy
# cannot apply: both are terminating decimals), with no normalization pass at all.
_PLAIN_NUMBER = re.compile(r"^(?:\\?\$ ?)?(-?)(\d{1,3}(?:,\d{3})+|\d{1,3}(?: \d{3})+|\d{1,30})(?:\.(\d{1,30}))?$")


def _plain_number(s: str) -> Fraction | None:
    m = _PLAIN_NUMBER.match(s)
    if m is None:
        return None
    whole = int(m.group(2).replace(",", "").replace(" ", ""))
    frac = m.group(3)
    value = Fraction(whole) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    return -value if m.group(1) else value


def fast_path(pred: str, gold: str) -> Verdict | None:
    """Two plain numbers (most GSM8K answers) compared exactly, with no normalization at all;
    None when either side is anything else. Only short strings qualify: a number of hundreds of
    thousands of digits goes to the guard (Python refuses int() on more than 4,300 digits)."""
    if len(pred) > _FAST_MAX_CHARS or len(gold) > _FAST_MAX_CHARS:
        return None
    ps, gs = pred.strip(), gold.strip()
    if _SIMPLE_INT.match(ps) and _SIMPLE_INT.match(gs):
        ok = int(ps) == int(gs)
        return Verdict(Status.CORRECT if ok else Status.INCORRECT, "integers", "exact")
    a, b = _plain_number(ps), _plain_number(gs)
    if a is not None and b is not None:
        ok = a == b
        return Verdict(Status.CORRECT if ok else Status.INCORRECT, "plain numbers", "exact")
    return None


# ---------------------------------------------------------------------------------------------
# 4. Scalars: units, text, exact numbers

_CURRENCY_PREFIX = re.compile(r"^(?P<sign>-?)\s*(?P<cur>\$|€|£|¥|₹|USD|EUR|GBP|Rs\.?|INR)\s*")
_CURRENCY_WORDS = {
    "$": "usd",
    "usd": "usd",
    "dollar": "usd",
    "dollars": "usd",
    "€": "eur",
    "eur": "eur",
    "euro": "eur",
    "euros": "eur",
    "£": "gbp",
    "gbp": "gbp",
    "¥": "jpy",
    "yen": "jpy",
    "₹": "inr",
    "rs": "inr",
    "rs.": "inr",
    "inr": "inr",
    "rupee": "inr",
    "rupees": "inr",
    "cent": "cent",
    "cents": "cent",
}
# canonical unit per spelling; single letters are units only when listed here
_UNITS = {
    "m": "m", "meter": "m", "meters": "m", "metre": "m", "metres": "m",
    "cm": "cm", "centimeter": "cm", "centimeters": "cm", "centimetre": "cm",
    "mm": "mm", "millimeter": "mm", "millimeters": "mm",
    "km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km",
    "in": "in", "inch": "in", "inches": "in",
    "ft": "ft", "foot": "ft", "feet": "ft",
    "yd": "yd", "yard": "yd", "yards": "yd",
    "mi": "mi", "mile": "mi", "miles": "mi",
    "g": "g", "gram": "g", "grams": "g", "kg": "kg", "kilogram": "kg", "kilograms": "kg",
    "mg": "mg", "lb": "lb", "lbs": "lb", "pound": "lb", "pounds": "lb", "oz": "oz", "ounce": "oz", "ounces": "oz",
    "s": "s", "sec": "s", "second": "s", "seconds": "s",
    "min": "min", "minute": "min", "minutes": "min",
    "h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "day": "day", "days": "day", "week": "week", "weeks": "week",
    "month": "month", "months": "month", "year": "year", "years": "year",
    "l": "l", "liter": "l", "liters": "l", "litre": "l", "litres": "l", "ml": "ml",
    "°": "deg", "deg": "deg", "degree": "deg", "degrees": "deg", "rad": "rad", "radian": "rad", "radians": "rad",
    "mph": "mph", "kph": "km/h", "km/h": "km/h", "m/s": "m/s",
    "percent": "%", "%": "%",
}  # fmt: skip
_NUM_THEN_UNIT = re.compile(
    # unit words are separated by mandatory whitespace, so a run of letters has one parse (no
    # exponential backtracking on "5 aaaa...a!")
    r"^(?P<num>[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?)\s*"
    r"(?P<unit>[A-Za-z°%$€£¥₹][A-Za-z°%./^\d]*(?:\s+[A-Za-z°%$€£¥₹^][A-Za-z°%./^\d]*){0,3})\s*$"
)
_FUNCTION_WORDS = mp.FUNCTIONS | {"pi", "infty", "inf", "oo", "frac", "sqrt", "cdot", "times", "binom"}
_TEXT_WORD = re.compile(r"[A-Za-z]{3,}")
_ARTICLES = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)
_LETTER_CHOICE = re.compile(r"^\(?([A-Ja-j])\)?[.:]?$")


@dataclass(frozen=True)
class Quantity:
    core: str  # the math part
    unit: str  # canonical unit ("" when none)
    percent: bool


def _canonical_unit(raw: str) -> str | None:
    """Canonical form of a unit phrase, or None if it is not a unit (then it is math)."""
    words = raw.replace("^", " ^").split()
    out = []
    for w in words:
        lw = w.lower().rstrip(".")
        if lw in _UNITS:
            out.append(_UNITS[lw])
        elif lw in _CURRENCY_WORDS:
            out.append(_CURRENCY_WORDS[lw])
        elif lw.startswith("^") and lw[1:].isdigit():
            out.append(lw)
        elif len(lw) >= 3 and lw.isalpha() and lw not in _FUNCTION_WORDS:
            # a noun ("apples", "students"): plural folded
            out.append(lw[:-1] if lw.endswith("s") and len(lw) > 3 else lw)
        else:
            return None
    return " ".join(out) if out else None


def quantity(s: str) -> Quantity:
    """Split currency, percent and a trailing unit off a scalar answer."""
    unit, percent = "", False
    m = _CURRENCY_PREFIX.match(s)
    if m:
        unit = _CURRENCY_WORDS[m.group("cur").lower()] if m.group("cur").lower() in _CURRENCY_WORDS else "usd"
        s = (m.group("sign") + s[m.end() :]).strip()
    if s.endswith("%"):
        percent = True
        s = s[:-1].strip()
    m = _NUM_THEN_UNIT.match(s)
    if m:
        canon = _canonical_unit(m.group("unit"))
        if canon is not None:
            if canon == "%":
                percent = True
            elif canon.startswith("%"):
                percent, canon = True, canon[1:].strip()
                unit = unit or canon
            else:
                unit = canon if not unit or unit == canon else unit + " " + canon
            s = m.group("num").strip()
    elif " " in s:
        # a unit after a math expression: "\frac{\pi}{2} radians", "2\sqrt{3} cm". Only known
        # unit words or words of 3+ letters count (single letters after a space stay variables).
        words = s.rsplit(None, 3)
        for k in range(min(3, len(words) - 1), 0, -1):
            tail = words[-k:]
            if tail[0][:1].isalpha() and all(
                (w.isalpha() and (w.lower() in _UNITS or w.lower() in _CURRENCY_WORDS or len(w) >= 3))
                or (len(w) == 2 and w[0] == "^" and w[1].isdigit())  # cm ^2
                for w in tail
            ):
                canon = _canonical_unit(" ".join(tail))
                core = " ".join(words[:-k])
                # only after something that looks like math ("the triangle" is text, not a unit)
                if canon is not None and any(ch.isdigit() or ch in "\\+-*/^()" for ch in core):
                    if canon == "%":
                        percent = True
                    else:
                        unit = canon if not unit or unit == canon else unit + " " + canon
                    s = core
                    break
    return Quantity(s, unit, percent)


def _is_text(s: str) -> bool:
    """A words answer ("Monday", "no solution") rather than math."""
    for w in _TEXT_WORD.findall(s):
        if w.lower() not in _FUNCTION_WORDS and w not in mp.GREEK and f"\\{w}" not in s:
            return True
    return False


def _canonical_text(s: str) -> str:
    s = s.lower().replace("\\", " ")
    s = re.sub(r"[{}()\[\].,;:!?\"'`*]", " ", s)
    s = _ARTICLES.sub("", " ".join(s.split()))
    return s


def _exact_verdict(a: Fraction, qa, b: Fraction, qb) -> bool:
    """Prediction a (decimal step qa or None) against gold b (step qb or None)."""
    if a == b:
        return True
    if qa is not None and qb is not None:
        return False  # two finite decimals compare exactly
    if qa is not None:
        return decimal_matches(a, qa, b, TOLERANCE.get())
    if qb is not None:
        return gold_decimal_matches(b, qb, a)
    return False


_MIXED = re.compile(r"^(?P<sign>-?)(?P<whole>\d+)\s+(?P<num>\d+)\s*/\s*(?P<den>\d+)$")
_MIXED_TEX = re.compile(r"^(?P<sign>-?)(?P<whole>\d+)\s*\\frac\s*\{(?P<num>\d+)\}\s*\{(?P<den>\d+)\}$")


def _mixed_number(s: str) -> Fraction | None:
    """`2 1/2` and `2\\frac{1}{2}` are mixed numbers (5/2), the convention in answers;
    departure from LaTeX juxtaposition, which would read 2 * 1/2."""
    m = _MIXED.match(s) or _MIXED_TEX.match(s)
    if not m:
        return None
    den = int(m.group("den"))
    if den == 0 or int(m.group("num")) >= den:
        return None
    v = int(m.group("whole")) + Fraction(int(m.group("num")), den)
    return -v if m.group("sign") else v


def _parse_scalar(s: str):
    """(AST or None, exact value or None, quantum). Raises Hostile, ZeroDivisionError."""
    mixed = _mixed_number(s)
    if mixed is not None:
        return ("num", mixed, None), mixed, None
    try:
        node = mp.parse(s)
    except mp.ParseError:
        return None, None, None
    mp.check_bounds(node)
    return node, mp.to_fraction(node), mp.decimal_quantum(node)


# ---------------------------------------------------------------------------------------------
# 5. Symbolic: a check in a killable worker process (rlvr.rewards.pool) under the deadline


def run_symbolic(target: str, args: tuple, tier: str = "symbolic") -> Verdict:
    """Run a symbolic check under the deadline (in a worker, or inline inside one)."""
    STATS.add("symbolic_calls")
    timeout = TIMEOUT.get()
    if _pool.IN_WORKER:
        try:
            ok, why = _pool.resolve(target)(*args)
        except mp.Hostile as exc:
            return Verdict(Status.INCORRECT, f"guard: {exc}", "guard")
        except Exception as exc:  # noqa: BLE001
            return Verdict(Status.ERROR, f"{type(exc).__name__}: {exc}"[:300], tier)
        return Verdict(Status.CORRECT if ok else Status.INCORRECT, why, tier)
    try:
        res = _pool.get_pool().call(target, args, timeout)
    except Exception as exc:  # noqa: BLE001 - no worker could be started: a verdict, not a raise
        return Verdict(Status.ERROR, f"verifier worker: {type(exc).__name__}: {exc}"[:300], tier)
    if res.status == "ok":
        ok, why = res.value
        return Verdict(Status.CORRECT if ok else Status.INCORRECT, why, tier)
    if res.status == "timeout":
        return Verdict(Status.TIMEOUT, res.info, tier)
    if res.info.startswith(("Hostile", "RecursionError")):
        return Verdict(Status.INCORRECT, "guard: " + res.info, "guard")
    return Verdict(Status.ERROR, res.info, tier)


# ---------------------------------------------------------------------------------------------
# Two scalars: choice letters, units, text, exact rationals, else the symbolic tier


def compare_scalars(pred: str, gold: str) -> Verdict:
    if pred == gold or pred.replace(" ", "") == gold.replace(" ", ""):
        return Verdict(Status.CORRECT, "identical after normalization", "exact")
    lp, lg = _LETTER_CHOICE.match(pred), _LETTER_CHOICE.match(gold)
    if lp and lg and (lp.group(1).isupper() or lg.group(1).isupper()):
        # choice letters in either case (`b` == `B`); two lower-case letters are symbols
        same = lp.group(1).upper() == lg.group(1).upper()
        return Verdict(Status.CORRECT if same else Status.INCORRECT, "choice letter", "text")
    qp, qg = quantity(pred), quantity(gold)
    if qp.unit and qg.unit and qp.unit != qg.unit:
        return Verdict(Status.INCORRECT, f"different units ({qp.unit} vs {qg.unit})", "unit")
    if _is_text(qp.core) or _is_text(qg.core):
        same = _canonical_text(qp.core) == _canonical_text(qg.core)
        return Verdict(Status.CORRECT if same else Status.INCORRECT, "text", "text")
    if not qp.core or not qg.core:
        return Verdict(Status.INCORRECT, "empty after removing units", "exact")
    try:
        np_, vp, quant_p = _parse_scalar(qp.core)
        ng, vg, quant_g = _parse_scalar(qg.core)
    except mp.Hostile as exc:
        return Verdict(Status.INCORRECT, f"guard: {exc}", "guard")
    except ZeroDivisionError:
        return Verdict(Status.INCORRECT, "undefined (division by zero)", "exact")
    if vp is not None and vg is not None:
        candidates = [(vp, vg)]
        # percent on one side only: "25%" matches 25 and 0.25 (documented policy)
        if qp.percent != qg.percent:
            if qp.percent:
                candidates.append((vp / 100, vg))
            else:
                candidates.append((vp, vg / 100))
        for a, b in candidates:
            if _exact_verdict(a, quant_p, b, quant_g):
                return Verdict(Status.CORRECT, "exact rational", "exact")
        return Verdict(Status.INCORRECT, "exact rational", "exact")
    if np_ is not None and ng is not None:
        fp, fg = mp.free_symbols(np_), mp.free_symbols(ng)
        if fp != fg and (not fp or not fg):
            # a constant against an expression in variables (`3 + 2d` vs `5`): unequal without
            # algebra, since a non-constant expression cannot equal a constant identically
            # unless its variables cancel, which we then leave to the symbolic tier
            if not _may_cancel(np_ if fp else ng):
                return Verdict(Status.INCORRECT, "variables on one side only", "exact")
    return run_symbolic("rlvr.rewards.symbolic:equal", (qp.core, qg.core, TOLERANCE.get()))


def _may_cancel(node) -> bool:
    """Could the variables of this AST cancel out (a symbol occurring twice)? Cheap check."""
    seen: dict[str, int] = {}
    stack = [node]
    while stack:
        n = stack.pop()
        if n[0] == "sym":
            seen[n[1]] = seen.get(n[1], 0) + 1
        elif n[0] in ("add", "mul"):
            stack.extend(n[1])
        elif n[0] in ("neg", "fact"):
            stack.append(n[1])
        elif n[0] in ("div", "pow", "root", "binom"):
            stack.extend((n[1], n[2]))
        elif n[0] == "func":
            stack.extend(n[2])
    return any(c > 1 for c in seen.values())
