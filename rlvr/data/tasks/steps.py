"""Synthetic step-by-step sums whose every step can be checked: "3+5+7=" -> "3+5=08\\n08+7=15".

The task of process supervision (docs/process_rewards.md): the response writes one step per line,
each continuing from the result of the line before, and the last line's result is the answer.
The reward `sum_steps` (rlvr/rewards/steps.py) scores every line (Reward.steps) besides the
outcome, which `algo.advantage=process` turns into per-token advantages.

Compact on purpose, like `arithmetic`: a character-level tiny model sees 6 prompt and 14 response
tokens with the defaults (three single-digit terms, two steps). Prompt = the question (template
"question_only"); SFT target = the worked steps (the trainer appends EOS), every result zero-padded
to the digits of the largest sum the knobs allow ("08", two digits for three single-digit terms),
so each character of a step sits at the same position in every response: the tiny model of the
tests then reaches 41% held-out greedy accuracy after 200 SFT steps instead of 18.5% unpadded.
The reward reads numbers with or without the padding.

Knobs of generate(): `digits` (per term, or a (lo, hi) range), `operands` (terms per problem,
>= 2: operands - 1 steps), `ops` ("+" and/or "-"; results may go negative, steps are read left to
right, which is the usual order for + and -), `max_result` (every step's result in [0, max_result];
9 keeps every number one digit). The split of a problem is a hash of its question, the
same as the `arithmetic` task's for the same question, so the two tasks' splits agree.
"""

from __future__ import annotations

import functools
import itertools
import random

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError
from rlvr.data.tasks.arithmetic import operand_knobs as arithmetic_knobs
from rlvr.data.tasks.base import Task
from rlvr.data.tasks.synthetic import check_capacity, sample_unique, split_capacities, split_share
from rlvr.rewards.steps import problem_terms

OPS = ("+", "-")


def result_width(terms: list[int], digits: int | None = None) -> int:
    """Digits every result of a problem is padded to: those of the largest sum its knobs allow
    (len(terms) terms of `digits` digits; default: as many digits as its largest term)."""
    d = digits if digits is not None else max(len(str(abs(t))) for t in terms)
    return len(str(len(terms) * (10**d - 1)))


def _fmt(v: int, width: int) -> str:
    return ("-" if v < 0 else "") + f"{abs(v):0{width}d}"


def worked_steps(terms: list[int], ops: list[str], width: int = 0) -> tuple[list[str], int]:
    """(["3+5=08", "08+7=15"], 15): the step lines of terms/ops (results zero-padded to `width`
    digits; 0 = none) and the final result."""
    lines, acc, prev = [], terms[0], str(terms[0])
    for op, t in zip(ops, terms[1:], strict=True):
        acc = acc + t if op == "+" else acc - t
        lines.append(f"{prev}{op}{t}={_fmt(acc, width)}")
        prev = _fmt(acc, width)
    return lines, acc


def _knobs(digits, ops, operands: int, max_result: int = 0) -> tuple[tuple[int, int], tuple[str, ...]]:
    dig, ops = arithmetic_knobs(digits, ops, operands, known=OPS)
    if max_result < 0:
        raise ValueError(f"max_result must be >= 0 (0 = no bound), got {max_result}")
    return dig, ops


def _values(dig: tuple[int, int]) -> list[int]:
    return [v for d in range(dig[0], dig[1] + 1) for v in range(0 if d == 1 else 10 ** (d - 1), 10**d)]


def _running(terms: list[int], ops: list[str]) -> list[int]:
    """The results of the steps: [3+5, 3+5+7] for 3+5+7."""
    out, acc = [], terms[0]
    for op, t in zip(ops, terms[1:], strict=True):
        acc = acc + t if op == "+" else acc - t
        out.append(acc)
    return out


def _bounded(terms: list[int], ops: list[str], max_result: int) -> bool:
    return not max_result or all(0 <= v <= max_result for v in _running(terms, ops))


def _example(q: str, terms: list[int], ops: list[str], meta: dict, digits: int | None = None,
             max_result: int = 0) -> Example:
    width = len(str(max_result)) if max_result else result_width(terms, digits)
    lines, value = worked_steps(terms, ops, width)
    return Example(id=f"sum_steps:{q}", question=q, reference=str(value),
                   meta={**meta, "terms": list(terms), "ops": list(ops)}, solution="\n".join(lines))


def generate(
    n: int,
    split: str = "train",
    seed: int = 0,
    *,
    digits: int | tuple[int, int] = 1,
    operands: int = 3,
    ops: tuple[str, ...] | str = ("+",),
    max_result: int = 0,
    heldout_fraction: float = 0.1,
) -> list[Example]:
    """n distinct problems of `split` ("train" or "test"), deterministic in (seed, split, knobs).
    max_result > 0: only problems whose every step result lies in [0, max_result] (9: every number
    of a response is one digit, the easiest problems for a tiny model); 0 = any."""
    dig, ops = _knobs(digits, ops, operands, max_result)
    available = capacity(split, heldout_fraction, digits=dig, operands=operands, ops=ops, max_result=max_result)
    check_capacity(n, split, available, "sum_steps",
                   f"digits={digits}, operands={operands}, ops={''.join(ops)}, max_result={max_result}")
    values = _values(dig)

    def draw(rng: random.Random):
        while True:
            terms = [rng.choice(values) for _ in range(operands)]
            op_list = [rng.choice(ops) for _ in range(operands - 1)]
            if _bounded(terms, op_list, max_result):
                break
        q = "".join(f"{t}{o}" for t, o in zip(terms, [*op_list, "="], strict=True))
        return q, (q, terms, op_list)

    items = sample_unique(n, split, seed, heldout_fraction, draw, "sum_steps")
    meta = {"digits": list(dig), "operands": operands, "split": split, "max_result": max_result}
    return [_example(q, terms, op_list, meta, dig[1], max_result) for q, terms, op_list in items]


def capacity(
    split: str = "train",
    heldout_fraction: float = 0.1,
    *,
    digits: int | tuple[int, int] = 1,
    operands: int = 3,
    ops: tuple[str, ...] | str = ("+",),
    max_result: int = 0,
) -> int:
    """Distinct problems of `split` with these knobs (exact up to synthetic.ENUMERATE_LIMIT; above it
    the split's share of the whole space, an upper bound when max_result excludes problems)."""
    dig, ops = _knobs(digits, ops, operands, max_result)
    split_share(split, heldout_fraction)
    return _capacities(dig, ops, operands, max_result, heldout_fraction)[split]


@functools.cache
def _capacities(dig: tuple[int, int], ops: tuple[str, ...], operands: int, max_result: int,
                heldout_fraction: float) -> dict:
    values = _values(dig)
    total = len(values) ** operands * len(ops) ** (operands - 1)

    def keys():
        for seq in itertools.product(ops, repeat=operands - 1):
            for terms in itertools.product(values, repeat=operands):
                if _bounded(list(terms), list(seq), max_result):
                    yield "".join(f"{t}{o}" for t, o in zip(terms, [*seq, "="], strict=True))

    return split_capacities(heldout_fraction, total, keys)


def parse_row(row: dict, where: str, index: int) -> Example:
    """{"question": "3+5+7="} (a reference, if given, must be the sum) -> Example with its worked steps."""
    q = str(row["question"]).strip()
    try:
        terms, ops = problem_terms(q)
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from None
    ex = _example(q, terms, ops, dict(row.get("meta", {})))
    ref = str(row.get("reference", row.get("answer", ex.reference))).strip()
    if ref != ex.reference:
        raise DataError(f'{where}: reference {ref!r} is not the value of {q!r} ({ex.reference})')
    if "id" in row:
        ex.id = str(row["id"])
    return ex


def make_target(ex: Example, template: str) -> str:
    if ex.solution:
        return ex.solution
    terms = [int(t) for t in ex.meta["terms"]]
    mr = int(ex.meta.get("max_result") or 0)
    lines, _ = worked_steps(terms, list(ex.meta["ops"]), len(str(mr)) if mr else result_width(terms))
    return "\n".join(lines)


TASK = Task(
    name="sum_steps",
    description="step-by-step sums, one checkable step per line: '3+5+7=' -> '3+5=08\\n08+7=15' (process rewards)",
    parse_row=parse_row,
    required_keys=("question",),
    default_template="question_only",
    # the steps are read line by line from the bare response: no other template has a step checker
    rewards={"question_only": "sum_steps"},
    make_target=make_target,
    generate=generate,
    capacity=capacity,
)
