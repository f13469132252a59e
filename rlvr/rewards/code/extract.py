"""Strict extraction of the program from a model response.

Rules for code_format="fenced" (the default):
  * the response is cut to its last `MAX_RESPONSE_CHARS` characters first (hostile input);
  * a block is a line that starts with three backticks and a language tag, the code, and a line
    that is exactly three backticks (trailing spaces allowed). The opening fence must start a line;
  * only blocks tagged `python`, `py` or `python3` (case-insensitive) count; if there are none,
    an untagged block (a bare fence) counts; blocks tagged with another language never do;
  * the LAST qualifying block wins (models show a draft, then the final program);
  * an opening fence without a closing one yields no code (truncated generations do not run);
  * code longer than `MAX_CODE_CHARS` yields no code.
code_format="raw": the whole (capped) response is the program.

`is_empty_program` detects programs with no statement that does anything (only comments,
docstrings, `pass`, `...`, or an empty block): they are scored as failing every test without
being run (incorrect, not unparsable: a block was there), so an empty program can never pass a
test whose expected output is empty. No block at all is the format failure (unparsable).
"""

from __future__ import annotations

import ast

MAX_RESPONSE_CHARS = 65_536
MAX_CODE_CHARS = 32_768
PYTHON_TAGS = ("python", "py", "python3")


def _blocks(text: str) -> list[tuple[str, str]]:
    """(tag, code) of every closed fenced block, one linear pass over the lines (no regex
    backtracking on hostile input)."""
    out: list[tuple[str, str]] = []
    tag: str | None = None
    body: list[str] = []
    for line in text.split("\n"):
        if tag is None:
            if line.startswith("```"):
                rest = line[3:].strip()
                if "`" not in rest and " " not in rest:
                    tag, body = rest.lower(), []
        elif line.rstrip() == "```":
            out.append((tag, "\n".join(body) + "\n"))
            tag = None
        else:
            body.append(line)
    return out


def extract_code(response: str, code_format: str = "fenced", tags: tuple[str, ...] = PYTHON_TAGS, *,
                 allow_empty: bool = False) -> str | None:
    """-> the program text, or None when the response holds no qualifying code. allow_empty: a
    qualifying fenced block with nothing in it gives "" (an empty program) instead of None."""
    if not isinstance(response, str):
        return None
    text = response[-MAX_RESPONSE_CHARS:].replace("\r\n", "\n")
    if code_format == "raw":
        code = text
    else:
        tagged, untagged = None, None
        for tag, body in _blocks(text):
            if tag in tags:
                tagged = body
            elif not tag:
                untagged = body
        code = tagged if tagged is not None else untagged
    if code is None or len(code) > MAX_CODE_CHARS:
        return None
    if not code.strip():
        return "" if allow_empty and code_format != "raw" else None
    return code


def is_empty_program(code: str) -> bool:
    """True when the program does nothing (see module docstring). A syntax error is not
    "empty": it is a program that fails every test."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    for node in tree.body:
        if isinstance(node, ast.Pass):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        return False
    return True
