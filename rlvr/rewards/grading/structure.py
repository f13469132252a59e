"""Tier 3 of the grader, parsing: a normalized answer -> its structure. A scalar stays a str;
matrices become `Matrix`, sets / unions / tuples / intervals / solution lists / ratios `Seq`
(ordered or not, with their brackets), `a < x <= b` a `Chain`, `x \\in S` an `In`, relations a
`Rel`, and `x = 3` a `Label` (a name for the answer, not an equation). Comparing the parsed
structures is rlvr.rewards.grading.compare's work."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlvr.rewards.grading.normalize import CLOSE, OPEN, wraps_whole


@dataclass(frozen=True)
class Seq:
    items: tuple  # parsed children
    ordered: bool
    open: str = ""  # "(" "[" or "" (bare list)
    close: str = ""


@dataclass(frozen=True)
class Matrix:
    rows: tuple  # tuple of tuples of cell strings (a scalar factor already multiplied in)
    src: str = ""  # the answer as written (for the symbolic tier)


@dataclass(frozen=True)
class Chain:
    parts: tuple  # "a < x <= b": ("a", "x", "b")
    ops: tuple  # ("<", "<=")


@dataclass(frozen=True)
class In:
    name: str  # x in "x \\in S"
    value: object  # S, parsed


@dataclass(frozen=True)
class Rel:
    lhs: str
    op: str  # "=", "<", "<=", ">", ">=", "!="
    rhs: str


@dataclass(frozen=True)
class Label:
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
        if c in OPEN:
            depth += 1
        elif c in CLOSE:
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


_MATRIX = re.compile(
    r"^(?P<scale>.*?)\\begin\{(?P<env>[pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(?P<body>.*)\\end\{(?P=env)\}$", re.DOTALL
)
_MATRIX_FACTOR_TAIL = re.compile(r"\s*(?:\\cdot|\\times|\*)\s*$")
_IN = re.compile(r"^(?P<name>[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+)\s*\\in(?![A-Za-z])\s*(?P<rest>.+)$", re.DOTALL)
INEQ = ("<=", ">=", "<", ">")
_REL_OPS = ("<=", ">=", "!=", "=", "<", ">")
_LABEL = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?$|^\\[A-Za-z]+$")
_WORD_SPLIT = re.compile(r"\s+(?:or|and)\s+|\\text\{\s*(?:or|and)\s*\}|(?<=[)\]])\s*or\s*(?=[(\[])")


def structure(s: str, depth: int = 0):
    """Parse a normalized answer into str (scalar) / Seq / Matrix / Chain / In / Rel / Label."""
    if depth > 4:
        return s
    m = _MATRIX.match(s) if "\\begin" in s else None
    if m and "\\begin" not in m.group("body"):
        body = m.group("body").strip()
        rows = tuple(tuple(c.strip() for c in r.split("&")) for r in body.split("\\\\") if r.strip())
        scale = _MATRIX_FACTOR_TAIL.sub("", m.group("scale")).strip()
        if not scale:
            return Matrix(rows, s)
        if "\\end" in scale or "&" in scale:
            return s
        # a scalar times a matrix: 2\\begin{pmatrix}1\\\\2\\end{pmatrix} == (2, 4) entrywise
        scale = "-1" if scale == "-" else scale
        return Matrix(tuple(tuple(f"({scale})({c})" for c in row) for row in rows), s)
    if s[:1] in "([" and s[-1:] in ")]" and wraps_whole(s) and s[1:-1].strip().startswith("\\begin"):
        return structure(s[1:-1].strip(), depth + 1)  # (\\begin{pmatrix}...\\end{pmatrix})
    m = _IN.match(s) if "\\in" in s else None
    if m:
        return In(m.group("name"), structure(m.group("rest").strip(), depth + 1))
    if s.startswith("\\{") and s.endswith("\\}") and _set_wraps_whole(s):
        inner = s[2:-2]
        items = [x.strip() for x in _split_top(inner, ",")] if inner.strip() else []
        return Seq(tuple(structure(x, depth + 1) for x in items), ordered=False, open="{", close="}")
    parts = _split_top(s, "\\cup")
    if len(parts) > 1:
        return Seq(tuple(structure(p.strip(), depth + 1) for p in parts), ordered=False, open="U", close="U")
    parts = [p for p in _WORD_SPLIT.split(s) if p.strip()] if ("or" in s or "and" in s or "\\text" in s) else [s]
    if len(parts) > 1:
        return Seq(tuple(structure(p.strip(), depth + 1) for p in parts), ordered=False)
    pm = _split_top(s, "\\pm")
    if len(pm) == 2:
        # a \pm b -> the two answers a + b and a - b (unordered)
        a, b = pm[0].strip(), pm[1].strip()
        plus, minus = (f"{a}+({b})", f"{a}-({b})") if a else (b, f"-({b})")
        return Seq((structure(plus, depth + 1), structure(minus, depth + 1)), ordered=False)
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and wraps_whole(s):
        inner = s[1:-1]
        items = _split_top(inner, ",")
        if len(items) == 1:
            items = _split_top(inner, ";")  # (0; -2; 6)
        if len(items) > 1:
            return Seq(tuple(structure(x.strip(), depth + 1) for x in items), ordered=True, open=s[0], close=s[-1])
    if len(s) >= 2 and s[0] == "{" and s[-1] == "}" and wraps_whole(s) and len(_split_top(s[1:-1], ",")) > 1:
        s = s[1:-1].strip()  # {1, 3}: TeX braces only group; it reads as the list 1, 3
    items = _split_top(s, ",")
    if len(items) == 1:
        items = _split_top(s, ";")  # -12; -11; -10
    if len(items) > 1 and all(x.strip() for x in items):
        return Seq(tuple(structure(x.strip(), depth + 1) for x in items), ordered=False)
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
                return Label(lhs, structure(rhs, depth + 1))
            return Rel(lhs, op, rhs)
    ratio = _split_top(s, ":") if ":" in s else [s]
    if len(ratio) > 1 and all(x.strip() for x in ratio):
        # a ratio 7:32 compares term by term (not as a quotient: 12:00 is not 1:00 or 24:00)
        return Seq(tuple(structure(x.strip(), depth + 1) for x in ratio), ordered=True, open=":", close=":")
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


def _inequality_chain(s: str) -> Chain | None:
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
        if c in OPEN:
            depth += 1
        elif c in CLOSE:
            depth -= 1
        elif depth == 0 and c in "<>=!":
            op = s[i : i + 2] if s[i : i + 2] in ("<=", ">=", "!=") else c
            if op not in INEQ:
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
    return Chain(tuple(parts), tuple(ops))
