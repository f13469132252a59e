"""Our own parser for math answers (plain text and the LaTeX subset answers use), in pure Python.

Model text is never `eval`-ed and never given to `sympy.parse_expr`. Instead a small tokenizer
and recursive-descent parser build a tuple AST; every resource it could blow up is bounded while
parsing and evaluating:

  * input length (`MAX_CHARS`), nesting depth (`MAX_DEPTH`), number literal length,
  * power towers (an exponent containing a power containing a power is rejected),
  * exponent size (|k| <= MAX_EXPONENT unless the base is 0 or +-1) and result size
    (`MAX_BITS` bits for exact rationals), factorial / binomial arguments.

Violations raise `Hostile` (the grader scores the pair incorrect without any algebra); syntax it
does not understand raises `ParseError` (the grader hands the strings to the symbolic tier).

AST nodes (tuples, picklable):
  ("num", Fraction, quantum)   quantum: Fraction step of a decimal literal ("0.25" -> 1/100,
                               "6.02e23" -> 10**21) or None for an exact literal (integers)
  ("sym", name)  ("const", "pi"|"e"|"i"|"oo")
  ("add", (a, b, ...))  ("mul", (a, b, ...))  ("neg", a)  ("div", a, b)  ("pow", a, b)
  ("fact", a)  ("func", name, (args...))  ("root", a, n)  ("binom", n, k)
"""

from __future__ import annotations

from fractions import Fraction
from math import isqrt

MAX_CHARS = 1_000
MAX_DEPTH = 60  # brackets + operator recursion
MAX_NUMBER_DIGITS = 400
MAX_BITS = 20_000  # ~6,000 decimal digits: far beyond any real answer, tiny for Python ints
MAX_EXPONENT = 10_000
MAX_FACTORIAL = 1_000
MAX_POWER_NESTING = 2
MAX_CHAIN = 200  # operators in one product chain (divisions nest, so this bounds AST depth)  # 2^{3^{4}} is allowed, 2^{3^{4^{5}}} is a tower


class ParseError(ValueError):
    """Syntax the parser does not support (the symbolic tier may still handle it)."""


class Hostile(ValueError):
    """Input that would cost unbounded time or memory; rejected before any algebra."""


FUNCTIONS = frozenset(
    "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp sqrt abs floor ceil".split()
)
GREEK = frozenset(
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi "
    "rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Phi Psi Omega".split()
)
_CONST_WORDS = {"pi": "pi", "infty": "oo", "infinity": "oo", "oo": "oo", "inf": "oo"}
_SPACING_CMDS = frozenset(
    "left right big Big bigg Bigg bigl bigr Bigl Bigr displaystyle textstyle , ; : ! quad qquad".split()
)
_MUL_CMDS = frozenset({"cdot", "times", "ast"})
_ATOM_START_CMDS = frozenset({"frac", "sqrt", "binom", "pi", "infty", "lfloor", "lceil"}) | FUNCTIONS | GREEK


def tokenize(text: str) -> list[tuple[str, str]]:
    """(kind, text) tokens: num, id, cmd, op. O(len)."""
    if len(text) > MAX_CHARS:
        raise Hostile(f"answer longer than {MAX_CHARS} characters")
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            j = i
            while j < n and text[j].isdigit():
                j += 1
            if j < n and text[j] == "." and j + 1 < n and text[j + 1].isdigit():
                j += 1
                while j < n and text[j].isdigit():
                    j += 1
            # scientific notation: 6.02e23, 1E-5 (an `e` not followed by digits is Euler's e)
            if j < n and text[j] in "eE":
                k = j + 1
                if k < n and text[k] in "+-":
                    k += 1
                if k < n and text[k].isdigit():
                    while k < n and text[k].isdigit():
                        k += 1
                    j = k
            if j - i > MAX_NUMBER_DIGITS:
                raise Hostile(f"number literal longer than {MAX_NUMBER_DIGITS} digits")
            out.append(("num", text[i:j]))
            i = j
        elif c.isalpha() and c.isascii():
            j = i
            while j < n and text[j].isalpha() and text[j].isascii():
                j += 1
            word = text[i:j]
            if word in FUNCTIONS or word in _CONST_WORDS:
                out.append(("id", word))
            else:
                # a run of letters is a product of one-letter symbols (xy = x*y)
                out.extend(("id", ch) for ch in word)
            i = j
        elif c == "\\":
            j = i + 1
            if j < n and not text[j].isalpha():
                out.append(("cmd", text[j]))  # \{ \} \, \; \! \%
                i = j + 1
                continue
            while j < n and text[j].isalpha():
                j += 1
            out.append(("cmd", text[i + 1 : j]))
            i = j
        elif c == "*" and i + 1 < n and text[i + 1] == "*":
            out.append(("op", "^"))
            i += 2
        elif c in "+-*/^!()[]{}_|,":
            out.append(("op", c))
            i += 1
        else:
            raise ParseError(f"unsupported character {c!r}")
    return out


def _decimal_literal(tok: str) -> tuple[Fraction, Fraction | None]:
    mant, exp = tok, 0
    for sep in ("e", "E"):
        if sep in tok:
            mant, _, e = tok.partition(sep)
            exp = int(e)
            break
    if abs(exp) > MAX_EXPONENT:
        raise Hostile("scientific exponent too large")
    if "." in mant:
        whole, _, frac = mant.partition(".")
        value = Fraction(int((whole or "0") + frac), 10 ** len(frac))
        quantum = Fraction(1, 10 ** len(frac))
    else:
        value, quantum = Fraction(int(mant)), None
    if exp:
        scale = Fraction(10) ** exp
        value *= scale
        quantum = (quantum or Fraction(1)) * scale
    return value, quantum


class _Parser:
    def __init__(self, toks: list[tuple[str, str]]):
        self.toks = toks
        self.i = 0
        self.depth = 0
        self.pow_nesting = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise ParseError("unexpected end of answer")
        self.i += 1
        return tok

    def expect(self, kind: str, text: str) -> None:
        tok = self.take()
        if tok != (kind, text):
            raise ParseError(f"expected {text!r}, got {tok[1]!r}")

    def skip_spacing(self) -> None:
        while (tok := self.peek()) is not None and tok[0] == "cmd" and tok[1] in _SPACING_CMDS:
            self.i += 1

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Hostile(f"nesting deeper than {MAX_DEPTH}")

    # expr := term (('+'|'-') term)*
    def expr(self):
        self.enter()
        terms = [self.term()]
        while True:
            self.skip_spacing()
            tok = self.peek()
            if tok in (("op", "+"), ("op", "-")):
                self.i += 1
                t = self.term()
                terms.append(t if tok[1] == "+" else ("neg", t))
            else:
                break
        self.depth -= 1
        return terms[0] if len(terms) == 1 else ("add", tuple(terms))

    def starts_atom(self, tok) -> bool:
        if tok is None:
            return False
        kind, text = tok
        if kind in ("num", "id"):
            return True
        if kind == "op":
            return text in "({|"
        return text in _ATOM_START_CMDS

    # term := unary (('*'|'/'|implicit) unary)*
    # Products are kept flat (one "mul" node with many factors) so that "5 a b c ..." does not
    # build an AST as deep as it is long; a chain of more than MAX_CHAIN operators is rejected.
    def term(self):
        factors = [self.unary()]
        ops = 0
        while True:
            self.skip_spacing()
            tok = self.peek()
            if tok in (("op", "*"),) or (tok is not None and tok[0] == "cmd" and tok[1] in _MUL_CMDS):
                self.i += 1
                factors.append(self.unary())
            elif tok == ("op", "/") or tok == ("cmd", "div"):
                self.i += 1
                left = factors[0] if len(factors) == 1 else ("mul", tuple(factors))
                factors = [("div", left, self.unary())]
            elif self.starts_atom(tok) and tok != ("op", "|"):
                factors.append(self.power())
            else:
                return factors[0] if len(factors) == 1 else ("mul", tuple(factors))
            ops += 1
            if ops > MAX_CHAIN:
                raise Hostile(f"more than {MAX_CHAIN} products in a row")

    def unary(self):
        self.skip_spacing()
        tok = self.peek()
        if tok == ("op", "-"):
            self.i += 1
            self.enter()
            node = ("neg", self.unary())
            self.depth -= 1
            return node
        if tok == ("op", "+"):
            self.i += 1
            return self.unary()
        return self.power()

    def power(self):
        base = self.postfix()
        self.skip_spacing()
        if self.peek() == ("op", "^"):
            self.i += 1
            self.pow_nesting += 1
            if self.pow_nesting > MAX_POWER_NESTING:
                raise Hostile("power tower")
            self.enter()
            self.skip_spacing()
            tok = self.peek()
            if tok == ("op", "{"):
                exp = self.group()
            elif tok in (("op", "-"), ("op", "+")):
                exp = self.unary()
            else:
                exp = self.power()  # right-associative: 2^3^2 = 2^(3^2)
            self.depth -= 1
            self.pow_nesting -= 1
            return ("pow", base, exp)
        return base

    def postfix(self):
        node = self.primary()
        while True:
            tok = self.peek()
            if tok == ("op", "!"):
                self.i += 1
                node = ("fact", node)
            elif tok == ("op", "_") and node[0] == "sym":
                # subscript: x_1, a_{n} -> one symbol named "x_1" / "a_n"
                self.i += 1
                sub = self.take()
                if sub == ("op", "{"):
                    parts = []
                    while (t := self.take()) != ("op", "}"):
                        if t[0] == "op" and t[1] in "{}":
                            raise ParseError("nested subscript")
                        parts.append(t[1])
                    name = "".join(parts)
                else:
                    name = sub[1]
                node = ("sym", f"{node[1]}_{name}")
            else:
                return node

    def group(self):
        """`{ expr }` (a LaTeX argument) or a single token argument (`\\frac12`)."""
        self.skip_spacing()
        tok = self.peek()
        if tok == ("op", "{"):
            self.i += 1
            node = self.expr()
            self.expect("op", "}")
            return node
        if tok is not None and tok[0] == "num":
            # \frac12 -> 1 and 2: a bare digit argument is one digit
            self.i += 1
            if len(tok[1]) > 1 and tok[1].isdigit():
                self.toks.insert(self.i, ("num", tok[1][1:]))
                return ("num", Fraction(int(tok[1][0])), None)
            value, q = _decimal_literal(tok[1])
            return ("num", value, q)
        return self.primary()

    def primary(self):
        self.skip_spacing()
        kind, text = self.take()
        if kind == "num":
            value, q = _decimal_literal(text)
            return ("num", value, q)
        if kind == "id":
            if text in _CONST_WORDS:
                return ("const", _CONST_WORDS[text])
            if text in FUNCTIONS:
                return self.call(text)
            if text == "e":
                return ("const", "e")
            if text == "i":
                return ("const", "i")
            return ("sym", text)
        if kind == "op":
            if text in "({[":
                self.enter()
                node = self.expr()
                closer = {"(": ")", "{": "}", "[": "]"}[text]
                self.skip_spacing()
                self.expect("op", closer)
                self.depth -= 1
                return node
            if text == "|":
                self.enter()
                node = self.expr()
                self.expect("op", "|")
                self.depth -= 1
                return ("func", "abs", (node,))
            raise ParseError(f"unexpected {text!r}")
        # LaTeX command
        if text == "frac":
            num = self.group()
            den = self.group()
            return ("div", num, den)
        if text == "sqrt":
            n = None
            if self.peek() == ("op", "["):
                self.i += 1
                n = self.expr()
                self.expect("op", "]")
            arg = self.group()
            return ("root", arg, n if n is not None else ("num", Fraction(2), None))
        if text == "binom":
            return ("binom", self.group(), self.group())
        if text == "pi":
            return ("const", "pi")
        if text == "infty":
            return ("const", "oo")
        if text in ("lfloor", "lceil"):
            self.enter()
            node = self.expr()
            self.skip_spacing()
            self.expect("cmd", "rfloor" if text == "lfloor" else "rceil")
            self.depth -= 1
            return ("func", "floor" if text == "lfloor" else "ceil", (node,))
        if text in FUNCTIONS:
            return self.call(text)
        if text in GREEK:
            return ("sym", text)
        if text == "{":
            self.enter()
            node = self.expr()
            self.expect("cmd", "}")
            self.depth -= 1
            return node
        raise ParseError(f"unsupported command \\{text}")

    def call(self, name: str):
        """f(x), f x, \\sin^2 x is not supported (ParseError), \\log_{b} x -> log(x, b)."""
        base = None
        if name == "log" and self.peek() == ("op", "_"):
            self.i += 1
            base = self.group()
        fpow = None
        if self.peek() == ("op", "^"):
            # \sin^2 x = (sin x)^2; \sin^{-1} is the inverse, which we leave to the fallback
            self.i += 1
            fpow = self.group()
            if fpow[0] == "neg":
                raise ParseError(f"inverse function notation {name}^-1")
        self.skip_spacing()
        if self.peek() == ("op", "("):
            self.i += 1
            self.enter()
            arg = self.expr()
            self.expect("op", ")")
            self.depth -= 1
        elif self.peek() == ("op", "{"):
            arg = self.group()
        else:
            arg = self.power()
        if name == "sqrt":
            node = ("root", arg, ("num", Fraction(2), None))
        else:
            node = ("func", "log" if name == "ln" else name, (arg,) if base is None else (arg, base))
        return node if fpow is None else ("pow", node, fpow)


def parse(text: str):
    """AST of one scalar math expression. Raises ParseError / Hostile."""
    toks = tokenize(text)
    if not toks:
        raise ParseError("empty answer")
    p = _Parser(toks)
    node = p.expr()
    p.skip_spacing()
    if p.peek() is not None:
        raise ParseError(f"unexpected {p.peek()[1]!r}")
    return node


# ---------------------------------------------------------------------------------------------
# Exact rational evaluation (the in-process fast tier)


def _bits(x: Fraction) -> int:
    return x.numerator.bit_length() + x.denominator.bit_length()


def _check_size(x: Fraction) -> Fraction:
    if _bits(x) > MAX_BITS:
        raise Hostile(f"intermediate value larger than {MAX_BITS} bits")
    return x


def rational_power(base: Fraction, exp: Fraction) -> Fraction | None:
    """base**exp exactly when it is rational (integer exponent, or a perfect root), bounded.
    None when the result is irrational. Raises Hostile when it would be too large,
    ZeroDivisionError for 0 to a negative power."""
    if exp.denominator != 1:
        # x^(p/q) rational only when x is a perfect q-th power; q is small in real answers
        if exp.denominator > 64 or base < 0:
            return None
        root = integer_root(base, exp.denominator)
        if root is None:
            return None
        return rational_power(root, Fraction(exp.numerator))
    k = exp.numerator
    if base in (0, 1):
        if base == 0 and k < 0:
            raise ZeroDivisionError("0 to a negative power")
        return base if k != 0 else Fraction(1)
    if base == -1:
        return Fraction(1 if k % 2 == 0 else -1)
    if abs(k) > MAX_EXPONENT or abs(k) * max(base.numerator.bit_length(), base.denominator.bit_length()) > MAX_BITS:
        raise Hostile("power too large")
    return base**k


def integer_root(x: Fraction, q: int) -> Fraction | None:
    """Exact q-th root of a non-negative rational, or None."""
    if x < 0:
        return None

    def iroot(n: int) -> int | None:
        if q == 2:
            r = isqrt(n)
        else:
            r = round(n ** (1.0 / q)) if n.bit_length() < 1000 else None
            if r is None:
                return None
            for cand in (r - 1, r, r + 1):
                if cand >= 0 and cand**q == n:
                    return cand
            return None
        return r if r * r == n else None

    a, b = iroot(x.numerator), iroot(x.denominator)
    if a is None or b is None:
        return None
    return Fraction(a, b)


def to_fraction(node) -> Fraction | None:
    """Exact rational value of an AST, or None when it is not a rational constant (symbols,
    pi, irrational roots, functions). Raises Hostile (too large) or ZeroDivisionError."""
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "neg":
        v = to_fraction(node[1])
        return None if v is None else -v
    if kind == "add":
        total = Fraction(0)
        for child in node[1]:
            v = to_fraction(child)
            if v is None:
                return None
            total = _check_size(total + v)
        return total
    if kind == "mul":
        prod = Fraction(1)
        for child in node[1]:
            v = to_fraction(child)
            if v is None:
                return None
            prod = _check_size(prod * v)
        return prod
    if kind == "div":
        a, b = to_fraction(node[1]), to_fraction(node[2])
        if a is None or b is None:
            return None
        if b == 0:
            raise ZeroDivisionError("division by zero")
        return _check_size(a / b)
    if kind == "pow":
        b, e = to_fraction(node[1]), to_fraction(node[2])
        if e is not None and abs(e) > MAX_EXPONENT and (b is None or b not in (0, 1, -1)):
            raise Hostile("exponent too large")
        if b is None or e is None:
            return None
        return rational_power(b, e)
    if kind == "root":
        a, n = to_fraction(node[1]), to_fraction(node[2])
        if a is None or n is None or n.denominator != 1 or n <= 0 or n > 64:
            return None
        return integer_root(a, int(n))
    if kind == "fact":
        v = to_fraction(node[1])
        if v is None or v.denominator != 1 or v < 0:
            return None
        if v > MAX_FACTORIAL:
            raise Hostile("factorial too large")
        from math import factorial

        return Fraction(factorial(int(v)))
    if kind == "binom":
        n, k = to_fraction(node[1]), to_fraction(node[2])
        if n is None or k is None or n.denominator != 1 or k.denominator != 1:
            return None
        if n > MAX_EXPONENT:
            raise Hostile("binomial too large")
        from math import comb

        return Fraction(comb(int(n), int(k))) if 0 <= k <= n else Fraction(0)
    return None


def check_bounds(node) -> None:
    """Raise Hostile if any exponent / factorial argument that evaluates to a rational is too
    large, even where the whole expression is symbolic (x^{10^{100}}). Walks the AST once."""
    stack = [node]
    while stack:
        n = stack.pop()
        kind = n[0]
        if kind == "pow":
            e = _safe_fraction(n[2])
            b = _safe_fraction(n[1])
            if e is not None and abs(e) > MAX_EXPONENT and (b is None or b not in (0, 1, -1)):
                raise Hostile("exponent too large")
            stack.extend((n[1], n[2]))
        elif kind == "fact":
            v = _safe_fraction(n[1])
            if v is not None and v > MAX_FACTORIAL:
                raise Hostile("factorial too large")
            stack.append(n[1])
        elif kind in ("add", "mul"):
            stack.extend(n[1])
        elif kind in ("neg",):
            stack.append(n[1])
        elif kind in ("div", "root", "binom"):
            stack.extend((n[1], n[2]))
        elif kind == "func":
            stack.extend(n[2])


def _safe_fraction(node) -> Fraction | None:
    try:
        return to_fraction(node)
    except ZeroDivisionError:
        return None


def decimal_quantum(node) -> Fraction | None:
    """The rounding step of a decimal-literal answer ("0.333" -> 1/1000, "-2.5" -> 1/10,
    "6.02e23" and "6.02 \\times 10^{23}" -> 10**21), None for anything else (exact answers)."""
    if node[0] == "neg":
        return decimal_quantum(node[1])
    if node[0] == "num":
        return node[2]
    if node[0] == "mul" and len(node[1]) == 2:
        a, b = node[1]
        if a[0] == "num" and a[2] is not None and b[0] == "pow" and b[1] == ("num", Fraction(10), None):
            e = _safe_fraction(b[2])
            if e is not None and e.denominator == 1 and abs(e) <= MAX_EXPONENT:
                return a[2] * Fraction(10) ** int(e)
    return None


def free_symbols(node) -> set[str]:
    """Names of the symbols an AST mentions."""
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        kind = n[0]
        if kind == "sym":
            out.add(n[1])
        elif kind in ("add", "mul"):
            stack.extend(n[1])
        elif kind in ("neg", "fact"):
            stack.append(n[1])
        elif kind in ("div", "pow", "root", "binom"):
            stack.extend((n[1], n[2]))
        elif kind == "func":
            stack.extend(n[2])
    return out
