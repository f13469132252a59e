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

import functools
import itertools
import random

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError
from rlvr.data.tasks.base import Task
from rlvr.data.tasks.synthetic import check_capacity, sample_unique, split_capacities, split_share

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
    A problem's split depends only on its text, so train and test never share a problem.
    Asking for more than `capacity` allows raises ProblemSpaceError at once."""
    dig, ops = operand_knobs(digits, ops, operands)
    available = capacity(split, heldout_fraction, digits=dig, ops=ops, operands=operands,
                         allow_negative=allow_negative)
    check_capacity(n, split, available, "arithmetic",
                   f"digits={digits}, operands={operands}, ops={''.join(ops)}")

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


def operand_knobs(digits, ops, operands: int, known: tuple[str, ...] = OPS) -> tuple[tuple[int, int], tuple[str, ...]]:
    """Checked (digits range, ops) of generate/capacity; `known`: the operators the task has."""
    dig = (digits, digits) if isinstance(digits, int) else tuple(digits)
    if len(dig) != 2 or not 1 <= dig[0] <= dig[1]:
        raise ValueError(f"digits must be >= 1 (or a (lo, hi) range with lo <= hi), got {digits}")
    ops = tuple(ops)
    bad = [o for o in ops if o not in known]
    if bad or not ops:
        raise ValueError(f"unknown ops {bad or ops}; known: {' '.join(known)}")
    if operands < 2:
        raise ValueError(f"operands must be >= 2, got {operands}")
    if "/" in ops and operands != 2:
        raise ValueError("'/' is only supported with operands=2 (exact integer division)")
    return dig, ops


def capacity(
    split: str = "train",
    heldout_fraction: float = 0.1,
    *,
    digits: int | tuple[int, int] = 2,
    ops: tuple[str, ...] | str = ("+",),
    operands: int = 2,
    allow_negative: bool = False,
) -> int:
    """How many distinct problems of `split` generate() can produce with these knobs: exact for
    spaces up to synthetic.ENUMERATE_LIMIT, else the split's share of the space (an upper bound when
    "-" problems with a negative result are excluded)."""
    dig, ops = operand_knobs(digits, ops, operands)
    split_share(split, heldout_fraction)  # rejects an unknown split
    return _capacities(dig, ops, operands, allow_negative, heldout_fraction)[split]


@functools.cache
def _capacities(dig: tuple[int, int], ops: tuple[str, ...], operands: int, allow_negative: bool,
                heldout_fraction: float) -> dict[str, int]:
    # Operand values as _operand draws them: 0-9 for one digit, no leading zeros above.
    values = [v for d in range(dig[0], dig[1] + 1) for v in range(0 if d == 1 else 10 ** (d - 1), 10**d)]
    nonzero = [v for v in values if v]
    seqs = [tuple(s) for s in itertools.product(ops, repeat=operands - 1)]
    # Division draws divisor t1 != 0 and quotient q, so "t1*q/t1=" is distinct per (t1, q).
    total = sum(len(nonzero) * len(values) if seq == ("/",) else len(values) ** operands for seq in seqs)

    def keys():
        for seq in seqs:
            if seq == ("/",):
                yield from (f"{t1 * q}/{t1}=" for t1 in nonzero for q in values)
                continue
            check = "-" in seq and not allow_negative
            for terms in itertools.product(values, repeat=operands):
                if check and evaluate(list(terms), list(seq)) < 0:
                    continue
                yield "".join(f"{t}{o}" for t, o in zip(terms, [*seq, "="], strict=True))

    return split_capacities(heldout_fraction, total, keys)


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
    capacity=capacity,
)
