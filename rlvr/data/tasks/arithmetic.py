"""Synthetic arithmetic: "12+345=" -> "357".

Compact on purpose so a character-level tiny model sees ~10-20 tokens per example (the CPU
demo's SFT + GRPO task). Prompt = the question itself (template "question_only"); the SFT target
is just the number (the trainer appends EOS); the reward is rlvr.rewards' "arithmetic" (explicit
answer marker, else the last number). With the r1_zero template the target is
" <question><answer> </think> <answer><answer></answer>" and the reward "r1_zero".

Difficulty knobs: `digits` (exact digit count per operand, or a (lo, hi) range), `ops` (any of
"+", "-", "*", "/"), `operands` (terms per problem; usual precedence, no parentheses). Division
is exact integer division and only for two operands. With allow_negative=False, "-" problems
with a negative result are redrawn.
"""

from __future__ import annotations

import random

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError
from rlvr.data.tasks.base import Task
from rlvr.data.tasks.synthetic import sample_unique

OPS = ("+", "-", "*", "/")


def _operand(rng: random.Random, digits: tuple[int, int]) -> int:
    d = rng.randint(*digits)
    lo = 0 if d == 1 else 10 ** (d - 1)
    return rng.randint(lo, 10**d - 1)


def evaluate(terms: list[int], ops: list[str]) -> int:
    """Value of terms[0] ops[0] terms[1] ... with * and / before + and - (exact integers)."""
    vals, pending = [terms[0]], []
    for op, t in zip(ops, terms[1:], strict=True):
        if op == "*":
            vals[-1] = vals[-1] * t
        elif op == "/":
            if t == 0 or vals[-1] % t:
                raise ValueError("inexact division")
            vals[-1] = vals[-1] // t
        else:
            pending.append(op)
            vals.append(t)
    total = vals[0]
    for op, v in zip(pending, vals[1:], strict=True):
        total = total + v if op == "+" else total - v
    return total


def generate(
    n: int,
    split: str = "train",
    seed: int = 0,
    *,
    digits: int | tuple[int, int] = 2,
    ops: tuple[str, ...] | str = ("+",),
    operands: int = 2,
    allow_negative: bool = False,
    heldout_fraction: float = 0.1,
) -> list[Example]:
    """n distinct problems of `split` ("train" or "test"), deterministic in (seed, split, knobs).
    A problem's split depends only on its text, so train and test never share a problem."""
    dig = (digits, digits) if isinstance(digits, int) else tuple(digits)
    if not 1 <= dig[0] <= dig[1]:
        raise ValueError(f"digits must be >= 1 (or a (lo, hi) range with lo <= hi), got {digits}")
    ops = tuple(ops)
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ValueError(f"unknown ops {bad or ops}; known: {' '.join(OPS)}")
    if operands < 2:
        raise ValueError(f"operands must be >= 2, got {operands}")
    if "/" in ops and operands != 2:
        raise ValueError("'/' is only supported with operands=2 (exact integer division)")

    def draw(rng: random.Random):
        while True:
            op_list = [rng.choice(ops) for _ in range(operands - 1)]
            terms = [_operand(rng, dig) for _ in range(operands)]
            if op_list == ["/"]:
                if terms[1] == 0:
                    continue
                terms[0] = terms[1] * _operand(rng, dig)  # exact quotient of the same size
            value = evaluate(terms, op_list)
            if value < 0 and not allow_negative:
                continue
            q = "".join(f"{t}{o}" for t, o in zip(terms, [*op_list, "="], strict=True))
            return q, (q, value)

    items = sample_unique(n, split, seed, heldout_fraction, draw, "arithmetic")
    meta = {"digits": list(dig), "ops": list(ops), "operands": operands, "split": split}
    return [
        Example(id=f"arithmetic:{q}", question=q, reference=str(v), meta=dict(meta), solution=str(v))
        for q, v in items
    ]


def parse_row(row: dict, where: str, index: int) -> Example:
    q = str(row["question"]).strip()
    ref = str(row.get("reference", row.get("answer", ""))).strip()
    if not ref:
        raise DataError(f'{where}: missing key "reference" (or "answer")')
    return Example(
        id=str(row.get("id", f"arithmetic:{q}")),
        question=q,
        reference=ref,
        meta=dict(row.get("meta", {})),
        solution=ref,
    )


def make_target(ex: Example, template: str) -> str:
    if template == "r1_zero":
        return f" {ex.question}{ex.reference} </think> <answer>{ex.reference}</answer>"
    return ex.reference


TASK = Task(
    name="arithmetic",
    description="synthetic integer arithmetic '12+345=' -> '357' (digits, ops, operands knobs)",
    parse_row=parse_row,
    required_keys=("question",),
    default_template="question_only",
    rewards={"r1_zero": "r1_zero", "*": "arithmetic"},
    make_target=make_target,
    generate=generate,
)
