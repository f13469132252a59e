"""Countdown (as in TinyZero): combine the given numbers, each exactly once, with + - * / and
parentheses to reach the target. Every generated problem is solvable by construction: the
target is the value of a random expression over the numbers (the expression is kept as the
example's solution). The reward is rlvr.rewards' "countdown" (reads meta numbers/target).

Difficulty knobs: `count` (numbers per problem), `max_number`, `max_target`. Intermediate
results stay positive integers (subtraction ordered, division exact), so the solution is valid
under the checker's rules.
"""

from __future__ import annotations

import functools
import itertools
import math
import random

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError
from rlvr.data.tasks.base import Task
from rlvr.data.tasks.synthetic import check_capacity, sample_unique, split_capacities, split_share

STYLES = {
    "text": lambda nums, target: (
        f"Using the numbers {nums}, create an equation that equals {target}. You can use basic arithmetic "
        "operations (+, -, *, /) and each number must be used exactly once."
    ),
    "compact": lambda nums, target: f"{' '.join(map(str, nums))}->{target}:",
}


def _random_solution(rng: random.Random, numbers: list[int]) -> tuple[int, str] | None:
    pool = [(v, str(v), True) for v in numbers]  # (value, expression, is_atom)
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        (a, ea, ta), (b, eb, tb) = pool[i], pool[j]
        pool = [p for k, p in enumerate(pool) if k not in (i, j)]
        op = rng.choice("+-*/")
        if op == "-" and a < b:
            (a, ea, ta), (b, eb, tb) = (b, eb, tb), (a, ea, ta)
        if op == "/" and (b == 0 or a % b):
            op = rng.choice("+*")
        if op == "-" and a == b:
            op = "+"
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
        wrap = lambda e, atom: e if atom else f"({e})"
        pool.append((value, f"{wrap(ea, ta)}{op}{wrap(eb, tb)}", False))
    value, expr, _ = pool[0]
    return value, expr


def generate(
    n: int,
    split: str = "train",
    seed: int = 0,
    *,
    count: int = 3,
    max_number: int = 20,
    max_target: int = 100,
    style: str = "text",
    heldout_fraction: float = 0.1,
) -> list[Example]:
    """n distinct solvable problems of `split`, deterministic in (seed, split, knobs). The split
    is a hash of the sorted numbers and the target, so train and test never share a problem."""
    if style not in STYLES:
        raise ValueError(f"unknown countdown style {style!r}; known: {', '.join(STYLES)}")
    available = capacity(split, heldout_fraction, count=count, max_number=max_number, max_target=max_target)
    check_capacity(n, split, available, "countdown",
                   f"count={count}, max_number={max_number}, max_target={max_target}")

    def draw(rng: random.Random):
        while True:
            nums = [rng.randint(1, max_number) for _ in range(count)]
            target, expr = _random_solution(rng, nums)
            if 1 <= target <= max_target:
                key = f"{sorted(nums)}->{target}"
                return key, (nums, target, expr)

    items = sample_unique(n, split, seed, heldout_fraction, draw, "countdown")
    out = []
    for nums, target, expr in items:
        out.append(
            Example(
                id=f"countdown:{sorted(nums)}->{target}",
                question=STYLES[style](nums, target),
                reference=str(target),
                meta={"numbers": nums, "target": target, "split": split},
                solution=expr,
            )
        )
    return out


_COUNT_LIMIT = 1_000_000


def _check_knobs(count: int, max_number: int, max_target: int) -> None:
    if count < 2:
        raise ValueError(f"count must be >= 2, got {count}")
    if max_number < 1 or max_target < 1:
        raise ValueError("max_number and max_target must be >= 1")


def _combine(a: int, b: int) -> set[int]:
    """Every value _random_solution can make of the pair a, b (drawn in either order), by its own
    rules: '-' takes the larger first (equal -> '+'), an inexact '/' turns into '+' or '*'."""
    out = {a + b, a * b}
    if a != b:
        out.add(abs(a - b))
    if a % b == 0:
        out.add(a // b)
    if b % a == 0:
        out.add(b // a)
    return out


@functools.cache
def _reachable(pool: tuple[int, ...]) -> frozenset[int]:
    """Values _random_solution can end with from the sorted multiset `pool` (intermediates stay
    positive integers, so every pool value is >= 1)."""
    if len(pool) == 1:
        return frozenset(pool)
    out: set[int] = set()
    for i, j in itertools.combinations(range(len(pool)), 2):
        rest = [v for k, v in enumerate(pool) if k not in (i, j)]
        for v in _combine(pool[i], pool[j]):
            out |= _reachable(tuple(sorted([*rest, v])))
    return frozenset(out)


def capacity(
    split: str = "train", heldout_fraction: float = 0.1, *, count: int = 3, max_number: int = 20,
    max_target: int = 100,
) -> int | None:
    """How many distinct problems (sorted numbers, target) of `split` generate() can produce: every
    multiset of `count` numbers in 1..max_number with each target in 1..max_target that it reaches.
    None when there are too many multisets to enumerate (then nothing is refused up front)."""
    _check_knobs(count, max_number, max_target)
    split_share(split, heldout_fraction)  # rejects an unknown split
    # Enumeration cost ~ multisets x (pairs x 4 ops) per merge level: 0.2 s for the defaults, 0.4 s
    # for count=4, max_number=10; beyond ~1M such steps (seconds) the space is left uncounted.
    steps = math.comb(max_number + count - 1, count) * math.prod(4 * math.comb(k, 2) for k in range(2, count + 1))
    if steps > _COUNT_LIMIT:
        return None
    return _capacities(count, max_number, max_target, heldout_fraction)[split]


@functools.cache
def _capacities(count: int, max_number: int, max_target: int, heldout_fraction: float) -> dict[str, int]:
    problems = [
        (list(nums), t)
        for nums in itertools.combinations_with_replacement(range(1, max_number + 1), count)
        for t in sorted(_reachable(nums))
        if 1 <= t <= max_target
    ]
    # The key is generate()'s: f"{sorted(nums)}->{target}"
    return split_capacities(heldout_fraction, len(problems), lambda: (f"{nums}->{t}" for nums, t in problems))


def parse_row(row: dict, where: str, index: int) -> Example:
    nums = row.get("numbers", row.get("nums", (row.get("meta") or {}).get("numbers")))
    target = row.get("target", (row.get("meta") or {}).get("target"))
    if nums is None:
        raise DataError(f'{where}: missing key "numbers" (or "nums")')
    if target is None:
        raise DataError(f'{where}: missing key "target"')
    try:
        nums = [int(x) for x in nums]
        target = int(target)
    except (TypeError, ValueError):
        raise DataError(f"{where}: numbers and target must be integers") from None
    return Example(
        id=str(row.get("id", f"countdown:{sorted(nums)}->{target}")),
        question=str(row.get("question") or STYLES["text"](nums, target)),
        reference=str(target),
        meta={"numbers": nums, "target": target},
        solution=row.get("solution"),
    )


def make_target(ex: Example, template: str) -> str:
    if ex.solution is None:
        raise ValueError(f"{ex.id}: no solution to build an SFT target from")
    if template == "r1_zero":
        return f" {ex.solution} = {ex.reference} </think> <answer>{ex.solution}</answer>"
    return f"<answer>{ex.solution}</answer>"


TASK = Task(
    name="countdown",
    description="countdown: reach the target with each number once and + - * / (always solvable)",
    parse_row=parse_row,
    default_template="question_only",
    rewards={"*": "countdown"},
    make_target=make_target,
    generate=generate,
    capacity=capacity,
)
