"""The built-in code task set and the synthetic generator: every correct reference program
scores 1.0 and every wrong one < 1.0 under the sandboxed "code" reward; rows validate; the
generator is deterministic and its splits are disjoint; the task plugs into the task registry."""

from __future__ import annotations

import pytest

from rlvr.data.jsonl import DataError
from rlvr.data.tasks import get_task
from rlvr.data.tasks.code import FAMILIES, builtin, generate, parse_row
from rlvr.rewards import score_batch


def _fenced(code: str) -> str:
    return f"Here is my program.\n```python\n{code}```\n"


@pytest.fixture(scope="module")
def tasks():
    return builtin()


def test_builtin_set_size_and_kinds(tasks):
    assert len(tasks) >= 30
    kinds = {k for ex in tasks for k in ex.meta["tests"]}
    assert {"calls", "io", "asserts"} <= kinds
    assert all(ex.solution and ex.meta.get("wrong_solution") for ex in tasks)


def test_builtin_correct_score_one_wrong_below_one(tasks):
    responses = [_fenced(ex.solution) for ex in tasks] + [_fenced(ex.meta["wrong_solution"]) for ex in tasks]
    rewards = score_batch("code", responses, tasks + tasks, workers=4)
    n = len(tasks)
    bad_correct = [(tasks[i].id, r.info) for i, r in enumerate(rewards[:n]) if r.total != 1.0]
    bad_wrong = [(tasks[i].id, r.info) for i, r in enumerate(rewards[n:]) if not r.total < 1.0]
    assert not bad_correct, bad_correct
    assert not bad_wrong, bad_wrong
    assert all(r.parts["integrity"] == 1.0 for r in rewards)  # honest programs are never flagged


def test_synthetic_correct_and_wrong():
    exs = generate(8, "train", seed=3)
    assert {ex.meta["tests"]["calls"][0]["args"] is not None for ex in exs} == {True}
    responses = [_fenced(ex.solution) for ex in exs] + [_fenced(ex.meta["wrong_solution"]) for ex in exs]
    rewards = score_batch("code", responses, exs + exs, workers=4)
    assert [r.total for r in rewards[:8]] == [1.0] * 8, [r.info for r in rewards[:8]]
    assert all(r.total < 1.0 for r in rewards[8:]), [r.info for r in rewards[8:]]


def test_synthetic_hand_checked_family_values():
    # sum of multiples of k below n = k*m*(m+1)/2 with m=(n-1)//k; k=3, n=10: m=3 -> 3*3*4/2 = 18
    # (0+3+6+9 = 18).
    import random

    for seed in range(50):
        key, _, entry, calls, _, _ = FAMILIES["sum_multiples"](random.Random(seed))
        k = int(key.split(":")[1])
        for c in calls:
            n = c["args"][0]
            assert c["expected"] == sum(i for i in range(n) if i % k == 0)
    assert entry == "sum_multiples"


def test_synthetic_deterministic_and_splits_disjoint():
    a = [ex.id for ex in generate(20, "train", seed=1)]
    assert a == [ex.id for ex in generate(20, "train", seed=1)]
    test_ids = {ex.id for ex in generate(10, "test", seed=1)}
    assert not test_ids & set(a)
    with pytest.raises(ValueError, match="known"):
        generate(2, families=("nope",))


def test_bad_rows_name_file_line_and_key():
    with pytest.raises(DataError, match=r"f.jsonl:3: .*meta\['entry_point'\]"):
        parse_row({"prompt": "p", "tests": {"calls": [{"args": [], "expected": 1}]}}, "f.jsonl:3", 2)
    with pytest.raises(DataError, match='f.jsonl:1: missing key "prompt"'):
        parse_row({"tests": {}}, "f.jsonl:1", 0)


def test_registered_task():
    task = get_task("code")
    assert task.reward_name() == "code"
    ex = task.generate(1, "train", seed=0)[0]
    target = task.target(ex)
    assert target.startswith("```python\n") and ex.solution in target


def test_builtin_file_loads_through_the_task_interface():
    from importlib import resources

    path = resources.files("rlvr").joinpath("assets", "code_tasks", "tasks.jsonl")
    exs = get_task("code").load(str(path))
    assert len(exs) == len(builtin()) and exs[0].id == "code:add_two"
    assert exs[0].meta["tests"]["calls"][0] == {"args": [1, 2], "expected": 3}
