"""Issue 3: "never `eval` or `parse_expr` on model text". sympy's `parse_expr` is an `eval`. Our own
parser never calls it; the math-verify fallback (LaTeX grammar) converts each NUMBER token with
`sympy.Number(text)`, which goes through `sympify` -> `parse_expr`, but only with a token the ANTLR
grammar matched as a numeric literal. This test spies on `parse_expr` while the symbolic tier runs
in-process over every labeled pair (both orders) and fails if anything but a numeric literal
reaches it (e.g. if someone enabled math-verify's plain expression extraction)."""

from __future__ import annotations

import json
import re

import sympy.parsing.sympy_parser as sympy_parser
from helpers import REPO

from rlvr.rewards import symbolic

PAIRS_FILE = REPO / "rlvr" / "rewards" / "labeled" / "equivalence_pairs.jsonl"
NUMERIC_LITERAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")


def test_only_numeric_literals_reach_parse_expr(monkeypatch):
    pairs = [json.loads(x) for x in PAIRS_FILE.read_text().splitlines() if x.strip()]
    seen: list[str] = []
    real = sympy_parser.parse_expr

    def spy(s, *args, **kwargs):
        seen.append(s)
        return real(s, *args, **kwargs)

    monkeypatch.setattr(sympy_parser, "parse_expr", spy)
    for p in pairs:
        for a, b in ((p["pred"], p["gold"]), (p["gold"], p["pred"])):
            try:
                symbolic.equal(a, b)
            except Exception:  # noqa: BLE001 - a side the tier rejects is fine here; only parse_expr matters
                pass
    assert seen, "the spy saw nothing: the fallback path changed, update this test's premise"
    bad = sorted({s for s in seen if not (isinstance(s, str) and NUMERIC_LITERAL.fullmatch(s))})
    assert not bad, f"non-numeric text reached sympy.parse_expr: {bad[:10]}"
