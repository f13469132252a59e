"""Tier 3 of the grader, comparing: two parsed structures (rlvr.rewards.grading.structure) ->
a Verdict. Subsets of the real line first (an inequality, a union, `x \\in S` and an interval
name the same set however written), then inequality chains, `x \\in` / labels unwrapped,
relations (sides equal, swapped, or left to the symbolic tier), matrices (shape, then cell by
cell), ordered tuples and intervals (bracket types must match), unordered sets and lists
(greedy matching), and finally two scalars (rlvr.rewards.grading.scalar)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlvr.rewards import mathparse as mp
from rlvr.rewards.grading.scalar import compare_scalars, run_symbolic
from rlvr.rewards.grading.state import TOLERANCE, Verdict
from rlvr.rewards.grading.structure import INEQ, Chain, In, Label, Matrix, Rel, Seq
from rlvr.rewards.types import Status

# ---------------------------------------------------------------------------------------------
# Structures: one rule per kind, elements compared recursively, scalars by compare_scalars

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


def compare(p, g) -> Verdict:
    """Verdict for two parsed answers (str / Seq / Matrix / Chain / In / Rel / Label)."""
    # subsets of the real line: unions, inequalities, "x \\in S" (before anything else)
    if _setish(p) or _setish(g):
        v = _compare_sets(p, g)
        if v is not None:
            return v
    if isinstance(p, Chain) or isinstance(g, Chain):
        return _compare_chain(p, g)
    if isinstance(p, In) and isinstance(g, In):
        if p.name.replace(" ", "") != g.name.replace(" ", ""):
            return Verdict(Status.INCORRECT, f"different variables ({p.name} vs {g.name})", "structure")
        return compare(p.value, g.value)
    if isinstance(p, In):
        return compare(p.value, g)
    if isinstance(g, In):
        return compare(p, g.value)
    # unwrap single-element bare lists and labels against non-labels
    if isinstance(p, Label) and not isinstance(g, Label | Rel):
        return compare(p.value, g)
    if isinstance(g, Label) and not isinstance(p, Label | Rel):
        return compare(p, g.value)
    if isinstance(p, Label) and isinstance(g, Label):
        if p.name.replace(" ", "") != g.name.replace(" ", ""):
            return Verdict(Status.INCORRECT, f"different variables ({p.name} vs {g.name})", "structure")
        return compare(p.value, g.value)
    if isinstance(p, Label) and isinstance(g, Rel) and isinstance(p.value, str):
        p = Rel(p.name, "=", p.value)
    if isinstance(g, Label) and isinstance(p, Rel) and isinstance(g.value, str):
        g = Rel(g.name, "=", g.value)
    if isinstance(p, Rel) and isinstance(g, Rel):
        return _compare_rel(p, g)
    if isinstance(p, Rel) or isinstance(g, Rel):
        return Verdict(Status.INCORRECT, "relation against non-relation", "structure")
    if isinstance(p, Matrix) or isinstance(g, Matrix):
        if not (isinstance(p, Matrix) and isinstance(g, Matrix)):
            other = g if isinstance(p, Matrix) else p
            if isinstance(other, str) and "\\begin" in other:
                # a matrix expression (a sum, a product of matrices): the symbolic tier evaluates it
                ps, gs = (p.src if isinstance(p, Matrix) else p), (g.src if isinstance(g, Matrix) else g)
                return run_symbolic("rlvr.rewards.symbolic:equal", (ps, gs, TOLERANCE.get()))
            return Verdict(Status.INCORRECT, "matrix against non-matrix", "structure")
        if len(p.rows) != len(g.rows) or any(len(a) != len(b) for a, b in zip(p.rows, g.rows, strict=True)):
            return Verdict(Status.INCORRECT, "matrix shape", "structure")
        return _combine([compare_scalars(a, b) for ra, rb in zip(p.rows, g.rows, strict=True) for a, b in zip(ra, rb, strict=True)], "matrix")
    if isinstance(p, Seq) and len(p.items) == 1 and not isinstance(g, Seq):
        return compare(p.items[0], g)
    if isinstance(g, Seq) and len(g.items) == 1 and not isinstance(p, Seq):
        return compare(p, g.items[0])
    if isinstance(p, Seq) and isinstance(g, Seq):
        return _compare_seq(p, g)
    if isinstance(p, Seq) or isinstance(g, Seq):
        return Verdict(Status.INCORRECT, "list against single value", "structure")
    return compare_scalars(p, g)


def _compare_seq(p: Seq, g: Seq) -> Verdict:
    if len(p.items) != len(g.items):
        return Verdict(Status.INCORRECT, f"{len(p.items)} elements vs {len(g.items)}", "structure")
    if len(g.items) > 64:
        return Verdict(Status.INCORRECT, "guard: more than 64 elements", "guard")
    if p.ordered or g.ordered:
        if p.ordered and g.ordered and (p.open, p.close) != (g.open, g.close):
            return Verdict(Status.INCORRECT, f"brackets {p.open}{p.close} vs {g.open}{g.close}", "structure")
        return _combine([compare(a, b) for a, b in zip(p.items, g.items, strict=True)], "ordered elements")
    if (p.open == "{") != (g.open == "{") and p.open and g.open:
        return Verdict(Status.INCORRECT, "set against union", "structure")
    # unordered: greedy matching (elements of real answers are few and distinct)
    unused = list(range(len(p.items)))
    pending: Verdict | None = None
    for gi in g.items:
        for k in unused:
            v = compare(p.items[k], gi)
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
    if not (isinstance(p, Chain) and isinstance(g, Chain)):
        return Verdict(Status.INCORRECT, "inequality chain against something else", "structure")
    if len(p.parts) != len(g.parts):
        return Verdict(Status.INCORRECT, "inequality chains of different length", "structure")
    for parts, ops in ((g.parts, g.ops), (g.parts[::-1], tuple(_MIRROR[o] for o in g.ops[::-1]))):
        if ops == p.ops:
            v = _combine([compare_scalars(a, b) for a, b in zip(p.parts, parts, strict=True)], "inequality chain")
            if v.status is not Status.INCORRECT:
                return v
    return Verdict(Status.INCORRECT, "different inequality chains", "structure")


# ---------------------------------------------------------------------------------------------
# Subsets of the real line: "x < 3" == "(-\\infty, 3)", "\\{1\\} \\cup \\{2\\}" == "\\{1, 2\\}"

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


def _relation_set(rel: Rel):
    """(variable, pieces) of `x < 3`, `3 >= x`, `x != 3`; None when it is not one variable
    against a number."""
    if rel.op not in INEQ and rel.op != "!=":
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


def _chain_set(ch: Chain):
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
    if isinstance(node, Seq) and node.open == "U":
        return True
    if isinstance(node, In):
        return True
    if isinstance(node, Chain):
        return True
    if isinstance(node, Rel):
        return node.op in INEQ or node.op == "!="
    if isinstance(node, Seq) and not node.open and node.items:
        return all(isinstance(x, Rel | Chain) for x in node.items)
    return False


def _as_set(node, depth: int = 0):
    """(variable or None, [pieces]) for an answer that names a subset of the line, else None."""
    if depth > 4:
        return None
    if isinstance(node, In):
        got = _as_set(node.value, depth + 1)
        return None if got is None or got[0] is not None else (node.name, got[1])
    if isinstance(node, Rel):
        return _relation_set(node)
    if isinstance(node, Chain):
        return _chain_set(node)
    if not isinstance(node, Seq):
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
    if node.open == "U" or (not node.open and node.items and all(isinstance(x, Rel | Chain) for x in node.items)):
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
            v = _combine([compare_scalars(a.lo, b.lo)] + ([] if (a.lo == a.hi and b.lo == b.hi) else [compare_scalars(a.hi, b.hi)]), "interval ends")
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


# ---------------------------------------------------------------------------------------------
# Relations


def _compare_rel(p: Rel, g: Rel) -> Verdict:
    if p.op == g.op:
        first = _combine([compare_scalars(p.lhs, g.lhs), compare_scalars(p.rhs, g.rhs)], "relation sides")
        if first.status is Status.CORRECT:
            return first
    if _MIRROR[p.op] == g.op:
        swapped = _combine([compare_scalars(p.rhs, g.lhs), compare_scalars(p.lhs, g.rhs)], "relation sides (swapped)")
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
    return run_symbolic("rlvr.rewards.symbolic:relation_equal", (a, b, ordered))
