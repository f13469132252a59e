"""Code tasks: write a Python program, scored by running it against hidden tests in the sandbox
(rlvr.rewards.code; reward "code" = fraction of tests passed, integrity flags zero it).

Two sources:
  * the built-in set, rlvr/assets/code_tasks/tasks.jsonl (31 short problems, hand-written
    expected values, each with a correct and a wrong reference program): `builtin(split)`;
  * a synthetic generator over parametrized families whose expected values come from the
    generator's own closed forms: `generate(n, split, seed, families=...)`.

A row is {task_id, prompt, tests, entry_point?, time_limit_s?, memory_limit_mb?, solution?,
wrong_solution?}; everything the checker needs goes to `Example.meta` (validated by
rlvr.rewards.code.task.task_from_meta, so a bad row fails naming file:line and key).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from importlib import resources

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError
from rlvr.data.tasks.base import Task
from rlvr.data.tasks.synthetic import check_capacity, sample_unique, split_capacities, split_of, split_share
from rlvr.rewards.code.task import CodeTaskError, task_from_meta

ANSWER_INSTRUCTION = "\nAnswer with the complete program in a ```python code block."
META_KEYS = (
    "language",
    "entry_point",
    "tests",
    "time_limit_s",
    "memory_limit_mb",
    "code_format",
    "public_examples",
)


def parse_row(row: dict, where: str, index: int) -> Example:
    if "prompt" not in row and "question" not in row:
        raise DataError(f'{where}: missing key "prompt"')
    meta = {k: row[k] for k in META_KEYS if k in row}
    try:
        task_from_meta(meta)
    except CodeTaskError as e:
        raise DataError(f"{where}: {e}") from None
    tid = str(row.get("task_id", row.get("id", f"code:{index}")))
    meta["task_id"] = tid
    if "wrong_solution" in row:
        meta["wrong_solution"] = row["wrong_solution"]
    return Example(
        id=f"code:{tid}",
        question=str(row.get("prompt", row.get("question"))),
        reference="",
        meta=meta,
        solution=row.get("solution"),
    )


def builtin(split: str | None = None, heldout_fraction: float = 0.2) -> list[Example]:
    """The built-in task set; `split` ("train"/"test") selects by a hash of the task id."""
    text = resources.files("rlvr").joinpath("assets", "code_tasks", "tasks.jsonl").read_text(encoding="utf-8")
    import json

    out = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise DataError(f"rlvr/assets/code_tasks/tasks.jsonl:{i + 1}: bad JSON: {e}") from None
        ex = parse_row(row, f"rlvr/assets/code_tasks/tasks.jsonl:{i + 1}", i)
        if split is None or split_of(ex.id, heldout_fraction) == split:
            out.append(ex)
    return out


# ---- synthetic families: (rng) -> (key, prompt, entry_point, calls, solution, wrong_solution) ----


def _affine(rng: random.Random):
    a, b = rng.randint(2, 9), rng.randint(-20, 20)
    xs = rng.sample(range(-50, 51), 5)
    calls = [{"args": [x], "expected": a * x + b} for x in xs]
    sol = f"def f(x):\n    return {a} * x + ({b})\n"
    wrong = f"def f(x):\n    return {a} * x\n" if b else f"def f(x):\n    return {a} * x + 1\n"
    return (
        f"affine:{a}:{b}",
        f"Write `f(x)` returning {a}*x + ({b}) for an integer x.",
        "f",
        calls,
        sol,
        wrong,
    )


def _sum_multiples(rng: random.Random):
    k = rng.randint(2, 9)
    ns = rng.sample(range(1, 200), 4) + [k * rng.randint(2, 20)]  # a multiple: the wrong one counts n
    # sum of multiples of k strictly below n: k * m (m + 1) / 2 with m = (n - 1) // k
    calls = [{"args": [n], "expected": k * ((n - 1) // k) * ((n - 1) // k + 1) // 2} for n in ns]
    sol = f"def sum_multiples(n):\n    return sum(i for i in range(n) if i % {k} == 0)\n"
    wrong = f"def sum_multiples(n):\n    return sum(i for i in range(n + 1) if i % {k} == 0)\n"
    return (
        f"summult:{k}",
        f"Write `sum_multiples(n)` returning the sum of the non-negative multiples of {k} strictly below n.",
        "sum_multiples",
        calls,
        sol,
        wrong,
    )


def _count_char(rng: random.Random):
    c = rng.choice("abcde")
    words = ["".join(rng.choice("abcde") for _ in range(rng.randint(0, 12))) for _ in range(5)]
    calls = [{"args": [w], "expected": w.count(c)} for w in words]
    sol = f"def count_char(s):\n    return s.count({c!r})\n"
    wrong = f"def count_char(s):\n    return s.count({c!r}) + 1\n"
    return (
        f"countchar:{c}:{'|'.join(words)}",
        f"Write `count_char(s)` returning how many times the letter {c!r} occurs in s.",
        "count_char",
        calls,
        sol,
        wrong,
    )


def _rotate(rng: random.Random):
    k = rng.randint(1, 5)
    # The last list has k + 2 distinct items, so rotating by k (mod k + 2, never 0) changes it.
    lists = [[rng.randint(0, 9) for _ in range(rng.randint(1, 8))] for _ in range(3)] + [list(range(k + 2))]
    calls = [{"args": [xs], "expected": xs[k % len(xs) :] + xs[: k % len(xs)]} for xs in lists]
    sol = f"def rotate(xs):\n    k = {k} % len(xs)\n    return xs[k:] + xs[:k]\n"
    wrong = "def rotate(xs):\n    return list(xs)\n"
    return (
        f"rotate:{k}:{lists}",
        f"Write `rotate(xs)` rotating a non-empty list left by {k} positions (k modulo the length).",
        "rotate",
        calls,
        sol,
        wrong,
    )


FAMILIES: dict[str, Callable[[random.Random], tuple]] = {
    "affine": _affine,
    "sum_multiples": _sum_multiples,
    "count_char": _count_char,
    "rotate": _rotate,
}

# Every key a family can draw, for the families with few enough to count (the others draw random
# words and lists: far more than anyone asks for). Must follow the draws above; a test checks it.
FAMILY_KEYS: dict[str, Callable[[], Iterable[str]]] = {
    "affine": lambda: (f"affine:{a}:{b}" for a in range(2, 10) for b in range(-20, 21)),
    "sum_multiples": lambda: (f"summult:{k}" for k in range(2, 10)),
}


def capacity(split: str = "train", heldout_fraction: float = 0.1, *,
             families: tuple[str, ...] | None = None) -> int | None:
    """How many distinct tasks of `split` generate() can produce from `families`; None when a family
    that draws random words or lists (count_char, rotate) is among them."""
    names = _families(families)
    split_share(split, heldout_fraction)  # rejects an unknown split
    if any(f not in FAMILY_KEYS for f in names):
        return None
    keys = [k for f in names for k in FAMILY_KEYS[f]()]
    return split_capacities(heldout_fraction, len(keys), lambda: keys)[split]


def _families(families: tuple[str, ...] | None) -> tuple[str, ...]:
    names = tuple(families or FAMILIES)
    unknown = [f for f in names if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown code task families {unknown}; known: {', '.join(FAMILIES)}")
    return names


def generate(
    n: int,
    split: str = "train",
    seed: int = 0,
    *,
    families: tuple[str, ...] | None = None,
    heldout_fraction: float = 0.1,
    time_limit_s: float = 1.0,
) -> list[Example]:
    """n distinct synthetic code tasks of `split` (deterministic in seed/split/families)."""
    names = _families(families)
    check_capacity(n, split, capacity(split, heldout_fraction, families=names), "code",
                   f"families={','.join(names)}")

    def draw(rng: random.Random):
        item = FAMILIES[rng.choice(names)](rng)
        return item[0], item

    out = []
    for key, prompt, entry, calls, sol, wrong in sample_unique(
        n, split, seed, heldout_fraction, draw, "code"
    ):
        meta = {
            "entry_point": entry,
            "tests": {"calls": calls},
            "time_limit_s": time_limit_s,
            "task_id": key,
            "wrong_solution": wrong,
            "split": split,
        }
        out.append(
            Example(
                id=f"code:{key}", question=prompt + ANSWER_INSTRUCTION, reference="", meta=meta, solution=sol
            )
        )
    return out


def make_target(ex: Example, template: str) -> str:
    if ex.solution is None:
        raise ValueError(f"{ex.id}: no reference solution to build an SFT target from")
    block = f"```python\n{ex.solution}```"
    return f" {block} </think> <answer>{block}</answer>" if template == "r1_zero" else block


TASK = Task(
    name="code",
    description="code: write a Python program; scored by hidden tests in the sandbox (reward 'code')",
    parse_row=parse_row,
    required_keys=("prompt",),
    default_template="question_only",
    rewards={"*": "code"},
    make_target=make_target,
    generate=generate,
    capacity=capacity,
)
