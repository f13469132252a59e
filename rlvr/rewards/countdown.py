"""Countdown checker: does an arithmetic expression use each given number exactly once, only
`+ - * /` and parentheses, and evaluate exactly (rational arithmetic) to the target?

Our own tiny recursive-descent parser; model text is never `eval`-ed. Integers only (no unary
minus, no decimals, no concatenation of given digits), as in the TinyZero countdown task: a
solution must use every given number exactly once. An optional trailing `= target` is allowed.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

MAX_EXPR_CHARS = 200  # a countdown expression over ~6 numbers is far shorter
MAX_DEPTH = 32  # parenthesis nesting


class CountdownError(ValueError):
    """The expression is not a valid countdown expression (reason in the message)."""


def _tokens(expr: str) -> list[str]:
    out: list[str] = []
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c in " \t":
            i += 1
        elif c.isdigit():
            j = i
            while j < n and expr[j].isdigit():
                j += 1
            out.append(expr[i:j])
            i = j
        elif c in "+-*/()":
            out.append(c)
            i += 1
        elif c in "×xX·":  # common spellings of multiplication
            out.append("*")
            i += 1
        elif c == "÷":
            out.append("/")
            i += 1
        else:
            raise CountdownError(f"character {c!r} is not allowed")
    return out


class _Parser:
    def __init__(self, toks: list[str]):
        self.toks, self.i, self.numbers = toks, 0, []

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise CountdownError("expression ends early")
        self.i += 1
        return tok

    def expr(self, depth: int) -> Fraction:
        val = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term(depth)
            val = val + rhs if op == "+" else val - rhs
        return val

    def term(self, depth: int) -> Fraction:
        val = self.atom(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.atom(depth)
            if op == "*":
                val = val * rhs
            else:
                if rhs == 0:
                    raise CountdownError("division by zero")
                val = val / rhs
        return val

    def atom(self, depth: int) -> Fraction:
        tok = self.take()
        if tok == "(":
            if depth >= MAX_DEPTH:
                raise CountdownError("parentheses nested too deeply")
            val = self.expr(depth + 1)
            if self.take() != ")":
                raise CountdownError("unbalanced parentheses")
            return val
        if tok.isdigit():
            if len(tok) > 12:
                raise CountdownError("number too long")
            self.numbers.append(int(tok))
            return Fraction(int(tok))
        raise CountdownError(f"unexpected {tok!r}")


def evaluate(expr: str) -> tuple[Fraction, list[int]]:
    """Exact value of a countdown expression and the numbers it uses, in order.
    Raises CountdownError on anything that is not `+ - * /`, parentheses and integers."""
    if len(expr) > MAX_EXPR_CHARS:
        raise CountdownError(f"expression longer than {MAX_EXPR_CHARS} characters")
    parser = _Parser(_tokens(expr))
    value = parser.expr(0)
    if parser.peek() is not None:
        raise CountdownError(f"unexpected {parser.peek()!r} after the expression")
    return value, parser.numbers


def check(expr: str, numbers: list[int], target: int | Fraction) -> tuple[bool, str]:
    """(is the expression a correct countdown solution, reason)."""
    expr = expr.strip().rstrip(".")
    if "=" in expr:
        left, _, right = expr.partition("=")
        try:
            stated = Fraction(right.strip())
        except (ValueError, ZeroDivisionError):
            return False, "text after '=' is not a number"
        if stated != Fraction(target):
            return False, "stated result differs from the target"
        expr = left
    try:
        value, used = evaluate(expr)
    except CountdownError as exc:
        return False, str(exc)
    if Counter(used) != Counter(int(n) for n in numbers):
        return False, f"uses {sorted(used)}, must use each of {sorted(numbers)} exactly once"
    if value != Fraction(target):
        return False, f"evaluates to {value}, target {target}"
    return True, "ok"
