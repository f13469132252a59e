"""GSM8K (Cobbe et al. 2021): grade-school word problems; the final answer follows `#### `."""

from __future__ import annotations

import re

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError
from rlvr.data.tasks.base import Task

_CALC = re.compile(r"<<[^<>]*>>")  # calculator annotations "<<48/2=24>>" inside rationales


def gsm8k_reference(answer: str, where: str = "") -> str:
    """Final answer of a GSM8K answer field: the text after the last "####", commas stripped
    ("1,234" -> "1234"), surrounding spaces removed."""
    if "####" not in answer:
        raise DataError(f"{where}: GSM8K answer has no '####' final-answer marker" if where else "no '####'")
    ref = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not ref:
        raise DataError(f"{where}: GSM8K answer is empty after '####'")
    return ref


def parse_row(row: dict, where: str, index: int) -> Example:
    answer = str(row["answer"])
    ref = gsm8k_reference(answer, where)
    rationale = _CALC.sub("", answer.rsplit("####", 1)[0]).strip()
    return Example(
        id=str(row.get("id", f"gsm8k:{index}")),
        question=str(row["question"]).strip(),
        reference=ref,
        meta={"source": where},
        solution=rationale,
    )


def make_target(ex: Example, template: str) -> str:
    """r1_zero: rationale in the think block, answer in tags (the prompt ends with "<think>").
    Otherwise the GSM8K style: rationale then "#### answer"."""
    if template == "r1_zero":
        return f" {ex.solution or ''} </think> <answer>{ex.reference}</answer>"
    return f"{ex.solution}\n#### {ex.reference}" if ex.solution else f"#### {ex.reference}"


TASK = Task(
    name="gsm8k",
    description="GSM8K word problems; JSONL rows with question and answer (final answer after ####)",
    parse_row=parse_row,
    required_keys=("question", "answer"),
    default_template="r1_zero",
    rewards={"r1_zero": "r1_zero", "*": "gsm8k"},
    make_target=make_target,
)
