"""MATH-style problems (Hendrycks et al. 2021): the reference is the last \\boxed{} of the
solution unless the row carries an explicit answer."""

from __future__ import annotations

import math
import numbers

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError
from rlvr.data.tasks.base import Task
from rlvr.rewards.extract import last_boxed


def answer_reference(value, where: str) -> str:
    """The reference of an explicit `answer` value: a string non-empty after strip, or a finite number (int,
    float). Anything else could never be matched by a response ("", NaN -> 'nan', Infinity -> 'inf',
    true -> 'True', {"a": 1} -> "{'a': 1}"): DataError naming `where` (file:line, or dataset[split]:row)."""
    if isinstance(value, str):
        ref = value.strip()
        if not ref:
            raise DataError(f"{where}: 'answer' is empty" + (" (only whitespace)" if value else "")
                            + "; every response would be scored wrong: give the final answer, or drop the row")
        return ref
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise DataError(f"{where}: 'answer' must be a string or a number, got {type(value).__name__} {shown}")
    if not math.isfinite(float(value)):
        raise DataError(f"{where}: 'answer' is {value!r}, not a finite number; no response can match it")
    return str(value).strip()


def parse_row(row: dict, where: str, index: int) -> Example:
    question = row.get("problem", row.get("question"))
    if question is None:
        raise DataError(f'{where}: missing key "problem" (or "question")')
    solution = row.get("solution")
    if row.get("answer") is not None:
        ref = answer_reference(row["answer"], where)
    elif solution is not None:
        ref = last_boxed(str(solution))
        if ref is None:
            raise DataError(f"{where}: solution has no \\boxed{{}} answer and the row has no 'answer'")
    else:
        raise DataError(f'{where}: missing key "answer" (or a "solution" with \\boxed{{}})')
    meta = {"source": where}
    for key in ("level", "type", "subject", "unique_id"):
        if key in row:
            meta[key] = row[key]
    return Example(
        id=str(row.get("unique_id", row.get("id", f"math:{index}"))),
        question=str(question).strip(),
        reference=ref.strip(),
        meta=meta,
        solution=str(solution) if solution is not None else None,
    )


def make_target(ex: Example, template: str) -> str:
    if template == "r1_zero":
        return f" {ex.solution or ''} </think> <answer>{ex.reference}</answer>"
    return ex.solution if ex.solution else f"\\boxed{{{ex.reference}}}"


TASK = Task(
    name="math",
    description="MATH-style problems; rows with problem/question and solution (last \\boxed{}) or answer",
    parse_row=parse_row,
    default_template="r1_zero",
    rewards={"r1_zero": "r1_zero", "question_only": "question_only", "*": "math"},
    make_target=make_target,
)
