"""Rebuild cases.jsonl from a checkout of huggingface/Math-Verify (data only; no code is copied).

    git clone https://github.com/huggingface/Math-Verify && \
        python tests/data/math_verify/build_cases.py Math-Verify > tests/data/math_verify/cases.jsonl

Reads every `@pytest.mark.parametrize` list of (gold, pred, expected[, option]) tuples in its
tests/ directory with `ast` (literals only; the one f-string case is evaluated with `math`), plus
the literal `compare_strings(...) == 1` assertions inside test bodies, and records the
comparison options each test passes (match_types, precision, strict, allow_set_relation_comp).
"""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path

FILES = (
    "test_all.py",
    "test_boxed.py",
    "test_numina_cases.py",
    "test_open_thoughts.py",
    "test_strict.py",
    "test_yujianll.py",
)
DEFAULTS = {"match_types": ["latex", "expr"], "precision": 6, "strict": True, "allow_set_relation_comp": False}


def _value(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        # f"{math.sqrt(17):.15f}" and the like: evaluate with math only, no builtins
        return eval(compile(ast.Expression(node), "<case>", "eval"), {"__builtins__": {}, "math": math})  # noqa: S307


def _call_options(func: ast.FunctionDef) -> tuple[dict, bool]:
    """Keyword options of the compare_strings(...) call in a test body; whether it is plain verify."""
    opts: dict = {}
    plain = False
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "compare_strings":
                for kw in node.keywords:
                    if isinstance(kw.value, ast.Constant | ast.List):
                        opts[kw.arg] = ast.literal_eval(kw.value)
                    elif isinstance(kw.value, ast.Name):
                        opts[kw.arg] = "$" + kw.value.id  # filled from the case's own argument
            elif node.func.id == "verify":
                plain = True
    return opts, plain


def cases(root: Path):
    for fname in FILES:
        tree = ast.parse((root / "tests" / fname).read_text())
        for func in tree.body:
            if not isinstance(func, ast.FunctionDef):
                continue
            opts, plain = _call_options(func)
            found = False
            for dec in func.decorator_list:
                if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"):
                    continue
                names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
                for i, elt in enumerate(dec.args[1].elts):
                    row = dict(zip(names, (_value(e) for e in elt.elts), strict=True))
                    found = True
                    yield _record(fname, func.name, i, row, opts, plain)
            if not found:
                # literal assertions in the body: compare_strings("g", "p", ...) == 1
                for j, node in enumerate(n for n in ast.walk(func) if isinstance(n, ast.Compare)):
                    call = node.left
                    if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "compare_strings":
                        kws = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
                        row = {"gold": ast.literal_eval(call.args[0]), "pred": ast.literal_eval(call.args[1]),
                               "expected": ast.literal_eval(node.comparators[0])}
                        yield _record(fname, func.name, j, row, kws, False)


def _record(fname: str, func: str, i: int, row: dict, opts: dict, plain: bool) -> dict:
    options = dict(DEFAULTS)
    for k, v in opts.items():
        options[k] = row[v[1:]] if isinstance(v, str) and v.startswith("$") else v
    for k in ("precision", "strict", "allow_set_relation_comp"):
        if k in row:
            options[k] = row[k]
    expected = row.get("expected", row.get("result"))
    return {
        "id": f"{fname[:-3]}::{func}[{i}]",
        # test_all.py groups by test function; the other files are one group each
        "category": func.removeprefix("test_") if fname == "test_all.py" else fname[5:-3],
        "gold": row["gold"],
        "pred": row["pred"],
        "expected": bool(expected),
        "options": {"verify_defaults": True} if plain else options,
    }


if __name__ == "__main__":
    for rec in cases(Path(sys.argv[1])):
        print(json.dumps(rec, ensure_ascii=False))
