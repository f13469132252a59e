"""Math answer equivalence in tiers: `grade_answer(pred, gold) -> Verdict`. Never raises, never hangs.

Tiers, cheapest first (docs/verifier.md has the labeling policy and the tables):

1. guard (string level, in-process): length, control characters, TeX/Python injection commands,
   bracket depth and balance, operator counts. Rejects hostile input before any algebra.
2. normalization (in-process): `$`/`\\(`, `\\left`/`\\right`, `\\text{}`, spacing commands,
   thousands separators (`48,000`, `48 000`, `7\\,000`, `{,}`), unicode operators.
3. structure (in-process): matrices, sets (unordered), tuples and intervals (ordered, bracket
   type matters), unions, bare comma lists (unordered solution lists), relations and labels
   (`x = 3` vs `3` equal; `x = 2` vs `y = 2` not).
4. scalar, in-process exact fast path: units/currency/percent split off (a different unit on both
   sides is unequal; a unit on one side only is ignored), text answers, then our own parser
   (rlvr.rewards.mathparse) with exact rational arithmetic and the decimal tolerance policy
   (rlvr.rewards.tolerance). Pure Python, no IPC, no sympy.
5. symbolic: anything irrational or with variables goes to rlvr.rewards.symbolic in a killable
   worker process (rlvr.rewards.pool) under a wall-clock deadline.

Results are cached per (pred, gold) pair (timeouts included: the same pair would time out again).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction

from rlvr.rewards import mathparse as mp
from rlvr.rewards import pool as _pool
from rlvr.rewards.tolerance import (
    STRICT,
    TOLERANCES,
    check_tolerance,
    decimal_matches,
    gold_decimal_matches,
)
from rlvr.rewards.types import Status


@dataclass(frozen=True)
class Verdict:
    """Outcome of comparing one predicted answer with one gold answer."""

    status: Status  # CORRECT / INCORRECT / TIMEOUT / ERROR
    info: str = ""  # short reason: what decided, or why it gave up
    tier: str = ""  # "exact", "text", "structure", "symbolic", "guard", "unit"


# ---------------------------------------------------------------------------------------------
# Settings, counters, cache

DEFAULT_TIMEOUT_S = float(os.environ.get("RLVR_VERIFIER_TIMEOUT_S", "3.0"))
_timeout_var: contextvars.ContextVar[float] = contextvars.ContextVar("rlvr_verifier_timeout", default=DEFAULT_TIMEOUT_S)


@contextlib.contextmanager
def verifier_timeout(seconds: float):
    """Deadline for symbolic checks made in this context (threads: copy the context)."""
    token = _timeout_var.set(float(seconds))
    try:
        yield
    finally:
        _timeout_var.reset(token)


# Decimal tolerance (rlvr.rewards.tolerance): "strict" (default; about six significant digits)
# or "lenient" (a correct rounding with 3+ significant digits). RLVR_VERIFIER_TOLERANCE sets the
# process default; worker processes inherit the environment.
DEFAULT_TOLERANCE = check_tolerance(os.environ.get("RLVR_VERIFIER_TOLERANCE") or STRICT)
_tolerance_var: contextvars.ContextVar[str] = contextvars.ContextVar("rlvr_verifier_tolerance", default=DEFAULT_TOLERANCE)


@contextlib.contextmanager
def verifier_tolerance(tolerance: str):
    """Decimal tolerance ("strict" | "lenient") for answers graded in this context (threads:
    copy the context). ValueError for an unknown name."""
    token = _tolerance_var.set(check_tolerance(tolerance))
    try:
        yield
    finally:
        _tolerance_var.reset(token)


class VerifierStats:
    """Thread-safe counters of what the grader did: per status, per tier, cache hits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


STATS = VerifierStats()
CACHE_SIZE = 100_000
CACHE_MAX_KEY_CHARS = 256  # longer answers are not cached (bounds the cache to tens of MB)
_cache: OrderedDict[tuple[str, str, str], Verdict] = OrderedDict()
_cache_lock = threading.Lock()
_cache_enabled = True


def set_cache(enabled: bool) -> None:
    """Turn the (pred, gold) cache on or off (benchmarks measure without it); clears it."""
    global _cache_enabled
    _cache_enabled = enabled
    with _cache_lock:
        _cache.clear()


# ---------------------------------------------------------------------------------------------
# 1. Guard

MAX_ANSWER_CHARS = 1_000
MAX_BRACKET_DEPTH = 40
MAX_POWER_OPS = 24
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_FORBIDDEN_TEX = re.compile(
    r"\\(?:input|include|def|edef|gdef|xdef|newcommand|renewcommand|providecommand|let|write|"
    r"immediate|openout|openin|read|catcode|csname|expandafter|usepackage|documentclass|loop|"
    r"repeat|special|directlua|href|url)(?![A-Za-z])"
)
_FORBIDDEN_CODE = re.compile(r"__|\bimport\b|\blambda\b|\beval\s*\(|\bexec\s*\(|\bos\.|\bsys\.|\bsubprocess\b")
_OPEN = "([{"
_CLOSE = ")]}"


def guard(text: str) -> str | None:
    """Reason to reject `text` before any parsing, or None if it may be checked. O(len)."""
    if not isinstance(text, str):
        return f"answer is {type(text).__name__}, not str"
    if len(text) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    if _CONTROL.search(text):
        return "control character"
    if _FORBIDDEN_TEX.search(text):
        return "forbidden TeX command"
    if _FORBIDDEN_CODE.search(text):
        return "code, not math"
    depth = 0
    for ch in text:
        if ch in _OPEN:
            depth += 1
            if depth > MAX_BRACKET_DEPTH:
                return f"brackets nested deeper than {MAX_BRACKET_DEPTH}"
        elif ch in _CLOSE:
            depth -= 1
            if depth < 0:
                return "unbalanced brackets"
    # intervals like [0, 1) legitimately mix bracket types, so only the count must balance
    if depth != 0:
        return "unbalanced brackets"
    if text.count("^") + text.count("**") > MAX_POWER_OPS:
        return "too many powers"
    if text.count("!") > 8:
        return "too many factorials"
    return None


# ---------------------------------------------------------------------------------------------
# 2. Normalization

_WRAPPERS = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox|operatorname|boldsymbol|mathsf)\s*\{([^{}]*)\}"
)
_REALS = re.compile(r"\\(?:mathbb|Bbb|mathbf)\s*\{?\s*R\s*\}?(?![A-Za-z^_])|\\R(?![A-Za-z])|\u211d")
_SINGLE_DIGIT_EXP = re.compile(r"\^\{\s*(\d)\s*\}")
_OVER = re.compile(r"\\over(?![A-Za-z])")
_DOUBLE_ESCAPED = re.compile(
    r"(?<!\\)\\\\(frac|dfrac|tfrac|sqrt|left|right|pi|infty|cdot|times|le|ge|leq|geq|lt|gt|neq|ne|pm|cup|cap|in|"
    r"text|mathrm|mathbf|boxed|sin|cos|tan|log|ln|begin|end|alpha|beta|gamma|theta)(?![A-Za-z])"
)
_COMMA_BANG = re.compile(r"(?<=\d),\\!\s*(?=\d{3}(?!\d))")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg|bigl|bigr|Bigl|Bigr)(?![A-Za-z])\s*")
_SPACES = re.compile(r"(?<!\\)\\[,;:> ]|\\q?quad(?![A-Za-z])|~|\\enspace|\\thinspace")
_DEGREE = re.compile(r"\^\s*+\{?+\s*+\\circ\s*+\}?+|°|\\degree(?![A-Za-z])")
_UNICODE = {
    "\u2212": "-",
    "\u2013": "-",
    "\u00d7": "*",
    "\u00b7": "*",
    "\u22c5": "*",
    "\u00f7": "/",
    "\u221a": "\\sqrt",
    "\u03c0": "\\pi ",
    "\u221e": "\\infty ",
    "\u2264": "\\le ",
    "\u2265": "\\ge ",
    "\u2260": "\\ne ",
    "\u00a0": " ",
    "\u2009": " ",
    "\u202f": " ",
    "\u2007": " ",
    "\u222a": "\\cup ",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))
_CMD_ALIASES = re.compile(r"\\(dfrac|tfrac|cfrac|dbinom|tbinom|leq|geq|neq|leqslant|geqslant|le|ge|ne|lt|gt)(?![A-Za-z])")
_CMD_MAP = {
    "dfrac": "\\frac",
    "tfrac": "\\frac",
    "cfrac": "\\frac",
    "dbinom": "\\binom",
    "tbinom": "\\binom",
    "leq": "<=",
    "le": "<=",
    "leqslant": "<=",
    "geq": ">=",
    "ge": ">=",
    "geqslant": ">=",
    "neq": "!=",
    "ne": "!=",
    "lt": "<",
    "gt": ">",
}
# thousands separators: 48,000 / 48 000 / 7{,}000 (after \, -> space)
_THOUSANDS_COMMA = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_THOUSANDS_EMBEDDED = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_THOUSANDS_SPACE = re.compile(r"(?<![\d.])(\d{1,3})((?: \d{3})+)(?![\d])")


def normalize(text: str) -> str:
    """Canonical surface form of an answer (see module docstring). Pure string work, O(len)."""
    s = text.strip()
    s = _UNICODE_RE.sub(lambda m: _UNICODE[m.group(0)], s)
    if "\\\\" in s:
        # doubly escaped commands from JSON/Python sources: \\frac -> \frac (a TeX line break
        # followed by a command name is never meant)
        s = _DOUBLE_ESCAPED.sub(r"\\\1", s)
    # math delimiters around the whole answer
    for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(a) + len(b) and s.startswith(a) and s.endswith(b):
            s = s[len(a) : len(s) - len(b)].strip()
    for box in ("\\boxed{", "\\fbox{"):
        if s.startswith(box) and s.endswith("}") and _wraps_whole(s[len(box) - 1 :]):
            s = s[len(box) : -1].strip()
    s = _COMMA_BANG.sub(",", s)  # 10,\\!000: a thousands separator (MATH style)
    s = s.replace("\\displaystyle", "").replace("\\!", "").replace("{,}", ",")
    if "\\over" in s:
        s = _tex_over(s)
    s = _REALS.sub(r"(-\\infty, \\infty)", s)
    s = _SINGLE_DIGIT_EXP.sub(r"^\1", s)
    s = _DEGREE.sub(" °", s)
    for _ in range(3):  # \text{\textbf{x}} -> x, bounded
        new = _WRAPPERS.sub(lambda m: " " + m.group(1) + " ", s)
        if new == s:
            break
        s = new
    s = _LEFT_RIGHT.sub("", s)
    s = _SPACES.sub(" ", s)
    s = _CMD_ALIASES.sub(lambda m: _CMD_MAP[m.group(1)], s)
    s = s.replace("\\%", "%").replace("\\$", "$")
    s = s.replace("\\emptyset", "\\{\\}").replace("\\varnothing", "\\{\\}")
    s = " ".join(s.split())
    s = s.rstrip(".").strip()
    if _THOUSANDS_COMMA.match(s):
        s = s.replace(",", "")
    elif "," in s and not any(c in s for c in "([{"):
        s = _THOUSANDS_EMBEDDED.sub(lambda m: m.group(0).replace(",", ""), s)
    s = _THOUSANDS_SPACE.sub(lambda m: m.group(1) + m.group(2).replace(" ", ""), s)
    return s


def _tex_over(s: str) -> str:
    """TeX's infix fraction: `{a \\over b}` -> `\\frac{a}{b}` (the innermost braces around each
    `\\over`; a bare `a \\over b` is the whole answer). At most 8 rewrites, O(len) each."""
    for _ in range(8):
        m = _OVER.search(s)
        if m is None:
            return s
        i, depth = m.start() - 1, 0
        while i >= 0:  # the unescaped "{" that encloses \over
            c = s[i]
            if c == "}" and (i == 0 or s[i - 1] != "\\"):
                depth += 1
            elif c == "{" and (i == 0 or s[i - 1] != "\\"):
                if depth == 0:
                    break
                depth -= 1
            i -= 1
        j, depth = m.end(), 0
        while j < len(s):
            c = s[j]
            if c == "{" and s[j - 1] != "\\":
                depth += 1
            elif c == "}" and s[j - 1] != "\\":
                if depth == 0:
                    break
                depth -= 1
            j += 1
        if (i < 0) != (j >= len(s)):
            return s  # unbalanced: leave it to the parser (which then fails)
        num, den = s[i + 1 : m.start()].strip(), s[m.end() : j].strip()
        if i < 0:
            return f"\\frac{{{num}}}{{{den}}}"
        s = f"{s[:i]}\\frac{{{num}}}{{{den}}}{s[j + 1:]}"
    return s


# ---------------------------------------------------------------------------------------------
# 3. Structure


@dataclass(frozen=True)
class _Seq:
    items: tuple  # parsed children
    ordered: bool
    open: str = ""  # "(" "[" or "" (bare list)
    close: str = ""


@dataclass(frozen=True)
class _Matrix:
    rows: tuple  # tuple of tuples of cell strings (a scalar factor already multiplied in)
    src: str = ""  # the answer as written (for the symbolic tier)


@dataclass(frozen=True)
class _Chain:
    parts: tuple  # "a < x <= b": ("a", "x", "b")
    ops: tuple  # ("<", "<=")


@dataclass(frozen=True)
class _In:
    name: str  # x in "x \\in S"
    value: object  # S, parsed


@dataclass(frozen=True)
class _Rel:
    lhs: str
    op: str  # "=", "<", "<=", ">", ">=", "!="
    rhs: str


@dataclass(frozen=True)
class _Label:
    name: str
    value: object  # a parsed answer


def _split_top(s: str, sep: str) -> list[str]:
    """Split on `sep` outside any brackets (and outside \\{ \\})."""
    parts, depth, start, i, n, k = [], 0, 0, 0, len(s), len(sep)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += k
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def _set_wraps_whole(s: str) -> bool:
    """Does the `\\{` at s[0] close exactly at the final `\\}` (not `\\{1\\} \\cup \\{2\\}`)?"""
    depth, i = 0, 0
    while i < len(s) - 1:
        if s[i] == "\\" and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            if depth == 0:
                return i == len(s) - 2
            i += 2
            continue
        i += 1
    return False


def _wraps_whole(s: str) -> bool:
    """Does the bracket opening at s[0] close exactly at s[-1] (any bracket types)?"""
    depth = 0
    for i, c in enumerate(s):
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                return i == len(s) - 1
    return False


_MATRIX = re.compile(
    r"^(?P<scale>.*?)\\begin\{(?P<env>[pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(?P<body>.*)\\end\{(?P=env)\}$", re.DOTALL
)
_MATRIX_FACTOR_TAIL = re.compile(r"\s*(?:\\cdot|\\times|\*)\s*$")
_IN = re.compile(r"^(?P<name>[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+)\s*\\in(?![A-Za-z])\s*(?P<rest>.+)$", re.DOTALL)
_INEQ = ("<=", ">=", "<", ">")
_REL_OPS = ("<=", ">=", "!=", "=", "<", ">")
_LABEL = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?$|^\\[A-Za-z]+$")
_WORD_SPLIT = re.compile(r"\s+(?:or|and)\s+|\\text\{\s*(?:or|and)\s*\}|(?<=[)\]])\s*or\s*(?=[(\[])")


def structure(s: str, depth: int = 0):
    """Parse a normalized answer into str (scalar) / _Seq / _Matrix / _Rel / _Label."""
    if depth > 4:
        return s
    m = _MATRIX.match(s) if "\\begin" in s else None
    if m and "\\begin" not in m.group("body"):
        body = m.group("body").strip()
        rows = tuple(tuple(c.strip() for c in r.split("&")) for r in body.split("\\\\") if r.strip())
        scale = _MATRIX_FACTOR_TAIL.sub("", m.group("scale")).strip()
        if not scale:
            return _Matrix(rows, s)
        if "\\end" in scale or "&" in scale:
            return s
        # a scalar times a matrix: 2\\begin{pmatrix}1\\\\2\\end{pmatrix} == (2, 4) entrywise
        scale = "-1" if scale == "-" else scale
        return _Matrix(tuple(tuple(f"({scale})({c})" for c in row) for row in rows), s)
    if s[:1] in "([" and s[-1:] in ")]" and _wraps_whole(s) and s[1:-1].strip().startswith("\\begin"):
        return structure(s[1:-1].strip(), depth + 1)  # (\\begin{pmatrix}...\\end{pmatrix})
    m = _IN.match(s) if "\\in" in s else None
    if m:
        return _In(m.group("name"), structure(m.group("rest").strip(), depth + 1))
    if s.startswith("\\{") and s.endswith("\\}") and _set_wraps_whole(s):
        inner = s[2:-2]
        items = [x.strip() for x in _split_top(inner, ",")] if inner.strip() else []
        return _Seq(tuple(structure(x, depth + 1) for x in items), ordered=False, open="{", close="}")
    parts = _split_top(s, "\\cup")
    if len(parts) > 1:
        return _Seq(tuple(structure(p.strip(), depth + 1) for p in parts), ordered=False, open="U", close="U")
    parts = [p for p in _WORD_SPLIT.split(s) if p.strip()] if ("or" in s or "and" in s or "\\text" in s) else [s]
    if len(parts) > 1:
        return _Seq(tuple(structure(p.strip(), depth + 1) for p in parts), ordered=False)
    pm = _split_top(s, "\\pm")
    if len(pm) == 2:
        # a \pm b -> the two answers a + b and a - b (unordered)
        a, b = pm[0].strip(), pm[1].strip()
        plus, minus = (f"{a}+({b})", f"{a}-({b})") if a else (b, f"-({b})")
        return _Seq((structure(plus, depth + 1), structure(minus, depth + 1)), ordered=False)
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _wraps_whole(s):
        inner = s[1:-1]
        items = _split_top(inner, ",")
        if len(items) == 1:
            items = _split_top(inner, ";")  # (0; -2; 6)
        if len(items) > 1:
            return _Seq(tuple(structure(x.strip(), depth + 1) for x in items), ordered=True, open=s[0], close=s[-1])
    if len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _wraps_whole(s) and len(_split_top(s[1:-1], ",")) > 1:
        s = s[1:-1].strip()  # {1, 3}: TeX braces only group; it reads as the list 1, 3
    items = _split_top(s, ",")
    if len(items) == 1:
        items = _split_top(s, ";")  # -12; -11; -10
    if len(items) > 1 and all(x.strip() for x in items):
        return _Seq(tuple(structure(x.strip(), depth + 1) for x in items), ordered=False)
    chain = _inequality_chain(s)
    if chain is not None:
        return chain
    for op in _REL_OPS:
        pieces = _split_top(s, op)
        if len(pieces) >= 2:
            if op == "=" and any(p.endswith(("<", ">", "!")) for p in pieces[:-1]):
                continue
            if op in ("<", ">") and any(p.startswith("=") for p in pieces[1:]):
                continue
            lhs, rhs = pieces[0].strip(), pieces[-1].strip()
            if op == "=" and len(pieces) > 2:
                # a chain "x = 3 + 2 = 5": the last side is the answer
                lhs = pieces[0].strip()
            if op == "=" and _is_label(lhs):
                return _Label(lhs, structure(rhs, depth + 1))
            return _Rel(lhs, op, rhs)
    ratio = _split_top(s, ":") if ":" in s else [s]
    if len(ratio) > 1 and all(x.strip() for x in ratio):
        # a ratio 7:32 compares term by term (not as a quotient: 12:00 is not 1:00 or 24:00)
        return _Seq(tuple(structure(x.strip(), depth + 1) for x in ratio), ordered=True, open=":", close=":")
    return s


_SUBSCRIPT = re.compile(r"_\{[^{}]*\}|_\w")
_NAME_FORBIDDEN = re.compile(r"[\d+\-*/^=<>!]")


def _is_label(lhs: str) -> bool:
    """Is `lhs` in `lhs = value` a name for the answer rather than one side of an equation?
    `x`, `\\theta`, `a_{n}`, `(p, q)`, `f(x)`, `|AB|`, `A:B`, `\\frac{NO}{BO}`: letters, with no
    digits (outside subscripts) and no arithmetic. `2x + z` or `a^2 + b` are equations."""
    if _LABEL.match(lhs):
        return True
    if len(lhs) > 40:
        return False
    bare = _SUBSCRIPT.sub("", lhs)
    return bool(re.search(r"[A-Za-z]", bare)) and not _NAME_FORBIDDEN.search(bare.replace("\\frac", ""))


def _inequality_chain(s: str) -> _Chain | None:
    """`a < x <= b` (two or more inequality signs at top level, no `=` alone) or None."""
    if s.count("<") + s.count(">") < 2:
        return None
    parts, ops, depth, start, i, n = [], [], 0, 0, 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0 and c in "<>=!":
            op = s[i : i + 2] if s[i : i + 2] in ("<=", ">=", "!=") else c
            if op not in _INEQ:
                return None
            parts.append(s[start:i].strip())
            ops.append(op)
            i += len(op)
            start = i
            continue
        i += 1
    parts.append(s[start:].strip())
    if len(ops) < 2 or not all(parts):
        return None
    return _Chain(tuple(parts), tuple(ops))


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
class _Quantity:
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


def quantity(s: str) -> _Quantity:
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
    return _Quantity(s, unit, percent)


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
        return decimal_matches(a, qa, b, _tolerance_var.get())
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


def _symbolic(target: str, args: tuple, tier: str = "symbolic") -> Verdict:
    """Run a symbolic check under the deadline (in a worker, or inline inside one)."""
    STATS.add("symbolic_calls")
    timeout = _timeout_var.get()
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


def _scalar(pred: str, gold: str) -> Verdict:
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
    return _symbolic("rlvr.rewards.symbolic:equal", (qp.core, qg.core, _tolerance_var.get()))


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


# ---------------------------------------------------------------------------------------------
# 3b. Comparing structures

_MIRROR = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "=": "=", "!=": "!="}


def _combine(verdicts: list[Verdict], what: str) -> Verdict:
    """All must be correct; an incorrect element decides; else a timeout/error is reported."""
    for v in verdicts:
        if v.status is Status.INCORRECT:
            return Verdict(Status.INCORRECT, f"{what}: {v.info}", v.tier or "structure")
    for v in verdicts:
        if v.status is not Status.CORRECT:
            return Verdict(v.status, f"{what}: {v.info}", v.tier)
    return Verdict(Status.CORRECT, what, "structure")


def _compare(p, g) -> Verdict:
    # subsets of the real line: unions, inequalities, "x \\in S" (before anything else)
    if _setish(p) or _setish(g):
        v = _compare_sets(p, g)
        if v is not None:
            return v
    if isinstance(p, _Chain) or isinstance(g, _Chain):
        return _compare_chain(p, g)
    if isinstance(p, _In) and isinstance(g, _In):
        if p.name.replace(" ", "") != g.name.replace(" ", ""):
            return Verdict(Status.INCORRECT, f"different variables ({p.name} vs {g.name})", "structure")
        return _compare(p.value, g.value)
    if isinstance(p, _In):
        return _compare(p.value, g)
    if isinstance(g, _In):
        return _compare(p, g.value)
    # unwrap single-element bare lists and labels against non-labels
    if isinstance(p, _Label) and not isinstance(g, _Label | _Rel):
        return _compare(p.value, g)
    if isinstance(g, _Label) and not isinstance(p, _Label | _Rel):
        return _compare(p, g.value)
    if isinstance(p, _Label) and isinstance(g, _Label):
        if p.name.replace(" ", "") != g.name.replace(" ", ""):
            return Verdict(Status.INCORRECT, f"different variables ({p.name} vs {g.name})", "structure")
        return _compare(p.value, g.value)
    if isinstance(p, _Label) and isinstance(g, _Rel) and isinstance(p.value, str):
        p = _Rel(p.name, "=", p.value)
    if isinstance(g, _Label) and isinstance(p, _Rel) and isinstance(g.value, str):
        g = _Rel(g.name, "=", g.value)
    if isinstance(p, _Rel) and isinstance(g, _Rel):
        return _compare_rel(p, g)
    if isinstance(p, _Rel) or isinstance(g, _Rel):
        return Verdict(Status.INCORRECT, "relation against non-relation", "structure")
    if isinstance(p, _Matrix) or isinstance(g, _Matrix):
        if not (isinstance(p, _Matrix) and isinstance(g, _Matrix)):
            other = g if isinstance(p, _Matrix) else p
            if isinstance(other, str) and "\\begin" in other:
                # a matrix expression (a sum, a product of matrices): the symbolic tier evaluates it
                ps, gs = (p.src if isinstance(p, _Matrix) else p), (g.src if isinstance(g, _Matrix) else g)
                return _symbolic("rlvr.rewards.symbolic:equal", (ps, gs, _tolerance_var.get()))
            return Verdict(Status.INCORRECT, "matrix against non-matrix", "structure")
        if len(p.rows) != len(g.rows) or any(len(a) != len(b) for a, b in zip(p.rows, g.rows, strict=True)):
            return Verdict(Status.INCORRECT, "matrix shape", "structure")
        return _combine([_scalar(a, b) for ra, rb in zip(p.rows, g.rows, strict=True) for a, b in zip(ra, rb, strict=True)], "matrix")
    if isinstance(p, _Seq) and len(p.items) == 1 and not isinstance(g, _Seq):
        return _compare(p.items[0], g)
    if isinstance(g, _Seq) and len(g.items) == 1 and not isinstance(p, _Seq):
        return _compare(p, g.items[0])
    if isinstance(p, _Seq) and isinstance(g, _Seq):
        return _compare_seq(p, g)
    if isinstance(p, _Seq) or isinstance(g, _Seq):
        return Verdict(Status.INCORRECT, "list against single value", "structure")
    return _scalar(p, g)


def _compare_seq(p: _Seq, g: _Seq) -> Verdict:
    if len(p.items) != len(g.items):
        return Verdict(Status.INCORRECT, f"{len(p.items)} elements vs {len(g.items)}", "structure")
    if len(g.items) > 64:
        return Verdict(Status.INCORRECT, "guard: more than 64 elements", "guard")
    if p.ordered or g.ordered:
        if p.ordered and g.ordered and (p.open, p.close) != (g.open, g.close):
            return Verdict(Status.INCORRECT, f"brackets {p.open}{p.close} vs {g.open}{g.close}", "structure")
        return _combine([_compare(a, b) for a, b in zip(p.items, g.items, strict=True)], "ordered elements")
    if (p.open == "{") != (g.open == "{") and p.open and g.open:
        return Verdict(Status.INCORRECT, "set against union", "structure")
    # unordered: greedy matching (elements of real answers are few and distinct)
    unused = list(range(len(p.items)))
    pending: Verdict | None = None
    for gi in g.items:
        for k in unused:
            v = _compare(p.items[k], gi)
            if v.status is Status.CORRECT:
                unused.remove(k)
                break
            if v.status in (Status.TIMEOUT, Status.ERROR):
                pending = v
        else:
            if pending is not None:
                return Verdict(pending.status, f"unordered elements: {pending.info}", pending.tier)
            return Verdict(Status.INCORRECT, "unordered elements differ", "structure")
    return Verdict(Status.CORRECT, "unordered elements", "structure")


def _compare_chain(p, g) -> Verdict:
    """Two inequality chains that are not subsets of the line (`0 < x < y`): the same chain, read
    either way round, with equal parts."""
    if not (isinstance(p, _Chain) and isinstance(g, _Chain)):
        return Verdict(Status.INCORRECT, "inequality chain against something else", "structure")
    if len(p.parts) != len(g.parts):
        return Verdict(Status.INCORRECT, "inequality chains of different length", "structure")
    for parts, ops in ((g.parts, g.ops), (g.parts[::-1], tuple(_MIRROR[o] for o in g.ops[::-1]))):
        if ops == p.ops:
            v = _combine([_scalar(a, b) for a, b in zip(p.parts, parts, strict=True)], "inequality chain")
            if v.status is not Status.INCORRECT:
                return v
    return Verdict(Status.INCORRECT, "different inequality chains", "structure")


# ---------------------------------------------------------------------------------------------
# 3c. Subsets of the real line: "x < 3" == "(-\\infty, 3)", "\\{1\\} \\cup \\{2\\}" == "\\{1, 2\\}"

_VARIABLE = re.compile(r"^(?![ei]$)[A-Za-z](?:_\{?\w+\}?)?$|^[A-Za-z](?:_\{?\w+\}?)?\s*\(\s*[A-Za-z]\s*\)$")
_POS_INF = float("inf")


@dataclass(frozen=True)
class _Piece:
    """One interval of the line (lo == hi with both ends closed: a point). Ends are strings as
    written; `vlo`/`vhi` their exact values (Fraction or +-inf) when known, else None."""

    lo: str
    hi: str
    lc: bool  # closed at lo
    hc: bool
    vlo: object = None
    vhi: object = None
    decimal: bool = False  # an end is a decimal literal (compared under the tolerance policy)


def _is_variable(s) -> bool:
    return isinstance(s, str) and (bool(_VARIABLE.match(s)) or (s.startswith("\\") and s[1:] in mp.GREEK))


def _end_value(s: str):
    """(value, is_decimal, has_symbols): value a Fraction, +-inf, or None when not rational."""
    t = s.replace(" ", "")
    if t in ("\\infty", "+\\infty", "\\infty", "∞", "+∞", "oo", "+oo", "inf"):
        return _POS_INF, False, False
    if t in ("-\\infty", "-∞", "-oo", "-inf"):
        return -_POS_INF, False, False
    try:
        node = mp.parse(s)
        mp.check_bounds(node)
        if mp.free_symbols(node):
            return None, False, True
        return mp.to_fraction(node), mp.decimal_quantum(node) is not None, False
    except (mp.ParseError, mp.Hostile, ZeroDivisionError, ValueError):
        return None, False, True


def _piece(lo: str, hi: str, lc: bool, hc: bool) -> _Piece | None:
    (vlo, dlo, slo), (vhi, dhi, shi) = _end_value(lo), _end_value(hi)
    if slo or shi:
        return None  # an end with variables: not a set of numbers
    if vlo == _POS_INF or vhi == -_POS_INF:
        return None
    if vlo == -_POS_INF:
        lc = False
    if vhi == _POS_INF:
        hc = False
    if vlo is not None and vhi is not None and (vlo > vhi or (vlo == vhi and not (lc and hc))):
        return None  # not an interval (a pair, or empty): leave it to the tuple rules
    return _Piece(lo, hi, lc, hc, vlo, vhi, dlo or dhi)


def _point(x: str) -> _Piece | None:
    return _piece(x, x, True, True)


def _relation_set(rel: _Rel):
    """(variable, pieces) of `x < 3`, `3 >= x`, `x != 3`; None when it is not one variable
    against a number."""
    if rel.op not in _INEQ and rel.op != "!=":
        return None
    lhs, rhs, op = rel.lhs.strip(), rel.rhs.strip(), rel.op
    if _is_variable(rhs) and not _is_variable(lhs):
        lhs, rhs, op = rhs, lhs, _MIRROR[op]
    if not _is_variable(lhs) or _is_variable(rhs):
        return None
    if op == "!=":
        pieces = [_piece("-\\infty", rhs, False, False), _piece(rhs, "\\infty", False, False)]
    elif op in ("<", "<="):
        pieces = [_piece("-\\infty", rhs, False, op == "<=")]
    else:
        pieces = [_piece(rhs, "\\infty", op == ">=", False)]
    return None if None in pieces else (lhs, pieces)


def _chain_set(ch: _Chain):
    if len(ch.parts) != 3 or not _is_variable(ch.parts[1]) or _is_variable(ch.parts[0]) or _is_variable(ch.parts[2]):
        return None
    a, var, b = ch.parts
    o1, o2 = ch.ops
    if o1 in ("<", "<=") and o2 in ("<", "<="):
        piece = _piece(a, b, o1 == "<=", o2 == "<=")
    elif o1 in (">", ">=") and o2 in (">", ">="):
        piece = _piece(b, a, o2 == ">=", o1 == ">=")
    else:
        return None
    return None if piece is None else (var, [piece])


def _setish(node) -> bool:
    """Does this answer name a subset of the line in a way other than a plain interval/set?"""
    if isinstance(node, _Seq) and node.open == "U":
        return True
    if isinstance(node, _In):
        return True
    if isinstance(node, _Chain):
        return True
    if isinstance(node, _Rel):
        return node.op in _INEQ or node.op == "!="
    if isinstance(node, _Seq) and not node.open and node.items:
        return all(isinstance(x, _Rel | _Chain) for x in node.items)
    return False


def _as_set(node, depth: int = 0):
    """(variable or None, [pieces]) for an answer that names a subset of the line, else None."""
    if depth > 4:
        return None
    if isinstance(node, _In):
        got = _as_set(node.value, depth + 1)
        return None if got is None or got[0] is not None else (node.name, got[1])
    if isinstance(node, _Rel):
        return _relation_set(node)
    if isinstance(node, _Chain):
        return _chain_set(node)
    if not isinstance(node, _Seq):
        return None
    if node.open == "{":
        if not all(isinstance(x, str) for x in node.items):
            return None
        pieces = [_point(x) for x in node.items]
        return None if None in pieces else (None, pieces)
    if node.ordered and node.open in "([" and node.close in ")]" and len(node.items) == 2:
        lo, hi = node.items
        if not (isinstance(lo, str) and isinstance(hi, str)):
            return None
        piece = _piece(lo, hi, node.open == "[", node.close == "]")
        return None if piece is None else (None, [piece])
    if node.open == "U" or (not node.open and node.items and all(isinstance(x, _Rel | _Chain) for x in node.items)):
        var, pieces = None, []
        for item in node.items:
            got = _as_set(item, depth + 1)
            if got is None:
                return None
            if got[0] is not None:
                if var is not None and var != got[0]:
                    return None
                var = got[0]
            pieces.extend(got[1])
        return var, pieces
    return None


def _merged(pieces: list[_Piece]) -> list[tuple]:
    """Canonical form of a union of pieces with known ends: sorted, overlaps and touching ends
    merged, as (lo, lo_closed, hi, hi_closed) tuples of exact values."""
    spans = sorted(((p.vlo, not p.lc, p.vhi, p.hc) for p in pieces), key=lambda t: (t[0], t[1]))
    out: list[list] = []
    for lo, lo_open, hi, hc in spans:
        if out and (lo < out[-1][2] or (lo == out[-1][2] and (out[-1][3] or not lo_open))):
            if hi > out[-1][2]:
                out[-1][2], out[-1][3] = hi, hc
            elif hi == out[-1][2]:
                out[-1][3] = out[-1][3] or hc
        else:
            out.append([lo, lo_open, hi, hc])
    return [tuple(x) for x in out]


def _compare_sets(p, g) -> Verdict | None:
    """Equal as subsets of the real line? None when either side is not one (then the ordinary
    rules decide)."""
    ps, gs = _as_set(p), _as_set(g)
    if ps is None or gs is None:
        return None
    (pv, pp), (gv, gp) = ps, gs
    if pv is not None and gv is not None and pv.replace(" ", "") != gv.replace(" ", ""):
        return Verdict(Status.INCORRECT, f"different variables ({pv} vs {gv})", "structure")
    if len(pp) + len(gp) > 64:
        return Verdict(Status.INCORRECT, "guard: more than 64 intervals", "guard")
    exact = all(x.vlo is not None and x.vhi is not None and not x.decimal for x in pp + gp)
    if exact:
        same = _merged(pp) == _merged(gp)
        return Verdict(Status.CORRECT if same else Status.INCORRECT, "same subset of the line" if same else "different subsets of the line", "structure")
    # ends we cannot order exactly (irrational, decimal): piece by piece, unordered
    if len(pp) != len(gp):
        return Verdict(Status.INCORRECT, f"{len(pp)} intervals vs {len(gp)}", "structure")
    unused = list(range(len(pp)))
    for b in gp:
        pending = None
        for k in unused:
            a = pp[k]
            if (a.lc, a.hc) != (b.lc, b.hc):
                continue
            v = _combine([_scalar(a.lo, b.lo)] + ([] if (a.lo == a.hi and b.lo == b.hi) else [_scalar(a.hi, b.hi)]), "interval ends")
            if v.status is Status.CORRECT:
                unused.remove(k)
                break
            if v.status is not Status.INCORRECT:
                pending = v
        else:
            if pending is not None:
                return pending
            return Verdict(Status.INCORRECT, "different intervals", "structure")
    return Verdict(Status.CORRECT, "same intervals", "structure")


def _compare_rel(p: _Rel, g: _Rel) -> Verdict:
    if p.op == g.op:
        first = _combine([_scalar(p.lhs, g.lhs), _scalar(p.rhs, g.rhs)], "relation sides")
        if first.status is Status.CORRECT:
            return first
    if _MIRROR[p.op] == g.op:
        swapped = _combine([_scalar(p.rhs, g.lhs), _scalar(p.lhs, g.rhs)], "relation sides (swapped)")
        if swapped.status is Status.CORRECT:
            return swapped
    if p.op == g.op:
        a, b = f"({p.lhs})-({p.rhs})", f"({g.lhs})-({g.rhs})"
    elif _MIRROR[p.op] == g.op:
        a, b = f"({p.rhs})-({p.lhs})", f"({g.lhs})-({g.rhs})"
    else:
        return Verdict(Status.INCORRECT, f"relation {p.op} vs {g.op}", "structure")
    if p.op == "!=":
        return Verdict(Status.INCORRECT, "different inequations", "structure")
    ordered = p.op not in ("=",)
    return _symbolic("rlvr.rewards.symbolic:relation_equal", (a, b, ordered))


# ---------------------------------------------------------------------------------------------
# Entry point


def _grade(pred: str, gold: str) -> Verdict:
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
    return _compare(structure(p), structure(g))


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


def _fast_path(pred: str, gold: str) -> Verdict | None:
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
        tolerance = _tolerance_var.get()
    elif tolerance not in TOLERANCES:
        return Verdict(Status.ERROR, f"unknown tolerance {tolerance!r}; known: {', '.join(TOLERANCES)}", "guard")
    try:
        fast = _fast_path(pred, gold)
    except Exception as exc:  # noqa: BLE001 - the fast path must not raise either
        fast = Verdict(Status.ERROR, f"{type(exc).__name__}: {exc}"[:300], "error")
    if fast is not None:
        STATS.add(fast.status.value)
        return fast
    key = (pred, gold, tolerance)
    use_cache = _cache_enabled and len(pred) <= CACHE_MAX_KEY_CHARS and len(gold) <= CACHE_MAX_KEY_CHARS
    if use_cache:
        with _cache_lock:
            hit = _cache.get(key)
            if hit is not None:
                _cache.move_to_end(key)
        if hit is not None:
            STATS.add("cache_hits")
            STATS.add(hit.status.value)
            return hit
    token = _timeout_var.set(float(timeout_s)) if timeout_s is not None else None
    tol_token = _tolerance_var.set(tolerance)
    try:
        verdict = _grade(pred, gold)
    except RecursionError:
        verdict = Verdict(Status.INCORRECT, "guard: nesting too deep", "guard")
    except Exception as exc:  # noqa: BLE001 - a grader bug must not reach the trainer
        verdict = Verdict(Status.ERROR, f"{type(exc).__name__}: {exc}"[:300], "error")
    finally:
        _tolerance_var.reset(tol_token)
        if token is not None:
            _timeout_var.reset(token)
    STATS.add(verdict.status.value)
    STATS.add(f"tier:{verdict.tier}")
    if use_cache and verdict.status is not Status.ERROR:
        with _cache_lock:
            _cache[key] = verdict
            if len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    return verdict


def is_equivalent(pred: str, gold: str, timeout_s: float | None = None, tolerance: str | None = None) -> bool:
    """Convenience: grade_answer(...).status is CORRECT."""
    return grade_answer(pred, gold, timeout_s, tolerance).status is Status.CORRECT
