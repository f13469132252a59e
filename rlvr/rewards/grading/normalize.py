"""Tiers 1 and 2 of the grader: the string-level guard and normalization. Pure string work,
O(len) each, no parsing: the guard rejects hostile input before any algebra, normalization
gives an answer its canonical surface form (`$`/`\\(`, `\\boxed{}`, `\\left`/`\\right`,
`\\text{}`, spacing commands, thousands separators, unicode operators, ...)."""

from __future__ import annotations

import re

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
OPEN = "([{"
CLOSE = ")]}"


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
        if ch in OPEN:
            depth += 1
            if depth > MAX_BRACKET_DEPTH:
                return f"brackets nested deeper than {MAX_BRACKET_DEPTH}"
        elif ch in CLOSE:
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
        if s.startswith(box) and s.endswith("}") and wraps_whole(s[len(box) - 1 :]):
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
# Brackets (the structure tier splits on them too)


def wraps_whole(s: str) -> bool:
    """Does the bracket opening at s[0] close exactly at s[-1] (any bracket types)?"""
    depth = 0
    for i, c in enumerate(s):
        if c in OPEN:
            depth += 1
        elif c in CLOSE:
            depth -= 1
            if depth == 0:
                return i == len(s) - 1
    return False
