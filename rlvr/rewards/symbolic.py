"""The symbolic tier: runs INSIDE a killable worker process (see rlvr.rewards.pool).

Entry points take plain strings (picklable, importable by name as
"rlvr.rewards.symbolic:equal" etc.). Each side is parsed by our own parser
(`rlvr.rewards.mathparse`, bounded) and converted to sympy; only if our parser does not
understand a side do we fall back to math-verify's LaTeX parser, with the side wrapped in `$...$`
so it is read as math, and with math-verify's own signal-based timeouts switched off (the
deadline is enforced by killing this process instead, which also stops C-level hangs).

Equality of two expressions a, b:
  1. both numeric constants: evaluate a - b to 60 significant digits; |a-b| <= 1e-40 * max(1,|a|)
     is equal (then confirmed exactly by sympy when cheap). A decimal literal on one side is
     compared with the rounding policy of `rlvr.rewards.tolerance`.
  2. with free symbols: a - b is evaluated at 8 seeded random rational points of both signs
     (30 digits); any difference beyond 1e-20 (relative) is unequal; agreement at 3 or more valid
     points is equal. Only when fewer than 3 points are valid (poles, branch points) does sympy's
     expand/simplify decide, and failing that the pair is unequal.
"""

from __future__ import annotations

import logging
import random
from fractions import Fraction

import sympy

from rlvr.rewards import mathparse as mp
from rlvr.rewards.tolerance import STRICT, decimal_matches, gold_decimal_matches

# math-verify warns on every call that its own timeout is off; it is off on purpose here.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_FUNCS = {
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "cot": sympy.cot,
    "sec": sympy.sec,
    "csc": sympy.csc,
    "arcsin": sympy.asin,
    "arccos": sympy.acos,
    "arctan": sympy.atan,
    "sinh": sympy.sinh,
    "cosh": sympy.cosh,
    "tanh": sympy.tanh,
    "exp": sympy.exp,
    "abs": sympy.Abs,
    "floor": sympy.floor,
    "ceil": sympy.ceiling,
}
_CONSTS = {"pi": sympy.pi, "e": sympy.E, "i": sympy.I, "oo": sympy.oo}


def to_sympy(node):
    """sympy expression of a mathparse AST. Bounds were checked by mathparse.check_bounds."""
    kind = node[0]
    if kind == "num":
        return sympy.Rational(node[1].numerator, node[1].denominator)
    if kind == "sym":
        return sympy.Symbol(node[1])
    if kind == "const":
        return _CONSTS[node[1]]
    if kind == "neg":
        return -to_sympy(node[1])
    if kind == "add":
        return sympy.Add(*[to_sympy(c) for c in node[1]])
    if kind == "mul":
        return sympy.Mul(*[to_sympy(c) for c in node[1]])
    if kind == "div":
        return to_sympy(node[1]) / to_sympy(node[2])
    if kind == "pow":
        return sympy.Pow(to_sympy(node[1]), to_sympy(node[2]))
    if kind == "root":
        n = to_sympy(node[2])
        arg = to_sympy(node[1])
        return sympy.sqrt(arg) if n == 2 else sympy.root(arg, n)
    if kind == "fact":
        return sympy.factorial(to_sympy(node[1]))
    if kind == "binom":
        return sympy.binomial(to_sympy(node[1]), to_sympy(node[2]))
    if kind == "func":
        name, args = node[1], [to_sympy(a) for a in node[2]]
        if name == "log":
            return sympy.log(*args)
        return _FUNCS[name](*args)
    raise ValueError(f"unknown AST node {kind!r}")


def _mv_parse(text: str):
    """math-verify fallback parser: first sympy object it extracts from `$text$`, or None."""
    from math_verify import LatexExtractionConfig, parse

    try:
        got = parse(
            f"${text}$",
            extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
            fallback_mode="no_fallback",
            extraction_mode="first_match",
            parsing_timeout=None,  # our process is killed on deadline; no signals off-main-thread
        )
    except Exception:  # noqa: BLE001
        return None
    for item in got:
        if isinstance(item, sympy.Basic | sympy.MatrixBase):
            return item
    return None


def _side(text: str):
    """(sympy expr or None, AST or None)."""
    try:
        node = mp.parse(text)
        mp.check_bounds(node)
        return to_sympy(node), node
    except mp.Hostile:
        raise
    except (mp.ParseError, ValueError, TypeError, KeyError, ZeroDivisionError):
        return _mv_parse(text), None


def _numeric(expr, digits: int):
    val = sympy.N(expr, digits)
    if not val.is_number:
        return None
    return val


def _close(d, scale) -> bool:
    try:
        return bool(abs(d) <= sympy.Float("1e-40", 60) * max(1, abs(scale)))
    except TypeError:
        return False


def _infinite(x) -> bool:
    """Definitely not a finite number (oo, -oo, zoo, nan, or contains one)."""
    return x.is_finite is False or x.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan)


def _sample_points(syms, seed: int, count: int = 8):
    """`count` seeded random points {symbol: rational} for numeric equality checks. Both signs:
    positive-only points would make x and |x| (or sqrt(x^2)) look equal."""
    rng = random.Random(seed)
    for _ in range(count):
        yield {s: sympy.Rational(rng.choice((-1, 1)) * rng.randint(1, 97), rng.randint(1, 89)) for s in syms}


def expr_equal(a, b, a_node=None, b_node=None, tolerance: str = STRICT) -> tuple[bool, str]:
    """Are two sympy expressions equal (a predicted, b gold)? (bool, which check decided).
    `tolerance` is the decimal rule for a decimal literal on the predicted side (tolerance.py)."""
    if a == b:
        return True, "structurally equal"
    # unevaluated matrix sums and products (from the LaTeX fallback): evaluate them
    a, b = (x.doit().as_explicit() if isinstance(x, sympy.MatrixExpr) else x for x in (a, b))
    try:
        if sympy.srepr(a) == sympy.srepr(b):  # equal trees whose == differs (sums over indexed names)
            return True, "structurally equal"
    except Exception:  # noqa: BLE001
        pass
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        if not (isinstance(a, sympy.MatrixBase) and isinstance(b, sympy.MatrixBase)) or a.shape != b.shape:
            return False, "matrix shape"
        for x, y in zip(a, b, strict=True):
            ok, why = expr_equal(x, y, tolerance=tolerance)
            if not ok:
                return False, f"matrix entry: {why}"
        return True, "matrix entries equal"
    if not isinstance(a, sympy.Expr) or not isinstance(b, sympy.Expr):
        return False, "not comparable expressions"
    fa = a.free_symbols | b.free_symbols
    if not fa:
        # unevaluated sums, products, integrals, limits (from the math-verify fallback): evaluate
        # them; this runs under the worker's deadline like everything here
        if a.has(sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit):
            a = a.doit()
        if b.has(sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit):
            b = b.doit()
        if a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan):
            return False, "undefined value (division by zero)"  # 1/0 is not equal to 2/0
        if _infinite(a) or _infinite(b):
            # oo, -oo: numeric closeness is meaningless (oo <= 1e-40 * oo holds)
            return a == b, "infinite value"
        va, vb = _numeric(a, 60), _numeric(b, 60)
        if va is None or vb is None:
            return False, "not numeric"
        if not (va.is_real and vb.is_real):
            d = sympy.N(a - b, 60)
            return _close(d, va), "complex values"
        # decimal-literal policy: the prediction's decimal under the named tolerance; a gold
        # decimal at its own precision
        q = mp.decimal_quantum(a_node) if a_node is not None else None
        if q is not None:
            return decimal_matches(Fraction(str(va)), q, Fraction(str(vb)), tolerance), f"decimal ({tolerance})"
        q = mp.decimal_quantum(b_node) if b_node is not None else None
        if q is not None:
            return gold_decimal_matches(Fraction(str(vb)), q, Fraction(str(va))), "gold decimal at its precision"
        return _close(va - vb, va), "numeric (60 digits)"
    if a.has(sympy.oo, sympy.zoo, sympy.nan) or b.has(sympy.oo, sympy.zoo, sympy.nan):
        return False, "infinite value in an expression"
    syms = sorted(fa, key=lambda s: s.name)
    diff = a - b
    agreed = 0
    for point in _sample_points(syms, seed=0):
        try:
            dv = sympy.N(diff.subs(point), 30)
            av = sympy.N(a.subs(point), 30)
        except (ZeroDivisionError, TypeError, ValueError):
            continue
        if not (dv.is_number and av.is_number and dv.is_finite and av.is_finite):
            continue  # a pole or branch point: this sample says nothing
        if abs(dv) > sympy.Float("1e-20") * max(1, abs(av)):
            return False, "differs at a sample point"
        agreed += 1
    if agreed >= 3:
        # Agreement to 20 digits at several random points of both signs. Simplification would
        # only confirm it (and costs 10-100x more), so it is not attempted.
        return True, f"equal at {agreed} random points"
    try:
        if sympy.expand(diff) == 0 or sympy.simplify(diff) == 0:
            return True, "simplify (too few valid sample points)"
    except Exception:  # noqa: BLE001
        pass
    return False, "could not establish equality"


def equal(pred: str, gold: str, tolerance: str = STRICT) -> tuple[bool, str]:
    """Symbolic equality of two scalar answers (strings). Returns (equal, reason).
    Raises mathparse.Hostile for bounded-resource violations found while parsing."""
    a, a_node = _side(pred)
    b, b_node = _side(gold)
    if a is None or b is None:
        return False, "could not parse " + ("prediction" if a is None else "gold")
    return expr_equal(a, b, a_node, b_node, tolerance)


def relation_equal(pred_diff: str, gold_diff: str, ordered: bool) -> tuple[bool, str]:
    """Equations / inequalities given as (lhs)-(rhs) strings: equal when one difference is a
    constant multiple of the other (positive multiple for inequalities, `ordered`). Checked like
    expressions: the ratio at 8 seeded random points of both signs must be one nonzero constant."""
    a, _ = _side(pred_diff)
    b, _ = _side(gold_diff)
    if a is None or b is None:
        return False, "could not parse relation"
    if not isinstance(a, sympy.Expr) or not isinstance(b, sympy.Expr):
        return False, "not comparable relations"
    if b == 0 or a == 0:
        return a == b, "degenerate relation"
    syms = sorted(a.free_symbols | b.free_symbols, key=lambda s: s.name)
    ratio = None
    agreed = 0
    for point in _sample_points(syms, seed=1):
        try:
            av = sympy.N(a.subs(point), 30)
            bv = sympy.N(b.subs(point), 30)
        except (ZeroDivisionError, TypeError, ValueError):
            continue
        if not (av.is_number and bv.is_number and av.is_finite and bv.is_finite) or bv == 0:
            continue
        r = av / bv
        if ratio is None:
            if r == 0:
                return False, "not proportional"
            ratio = r
        elif abs(r - ratio) > sympy.Float("1e-20") * max(1, abs(ratio)):
            return False, "not proportional"
        agreed += 1
    if agreed < 3 or ratio is None:
        return False, "could not establish proportionality"
    if ordered and not (ratio.is_real and ratio > 0):
        return False, "inequality direction"
    return True, f"proportional at {agreed} random points"
