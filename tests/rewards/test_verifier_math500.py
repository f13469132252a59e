"""MATH-500 test set: every reference answer is graded correct against its own solution's last
\\boxed{} (through grade_answer and the r1_zero reward), and answers of other problems are
rejected unless they are the same answer (checked independently: the same text once spaces and a
leading `x=` label are removed)."""

from __future__ import annotations

import json
import re

from helpers.shared_data import needs_shared, shared_path

from rlvr.rewards import get_reward_fn
from rlvr.rewards.extract import last_boxed
from rlvr.rewards.grader import grade_answer
from rlvr.rewards.types import SimpleExample, Status

TEST_FILE = shared_path("data", "math500", "test.jsonl")  # development data (../shared): skipped in a clone

pytestmark = needs_shared("data", "math500", "test.jsonl")


def _rows() -> list[dict]:
    return [json.loads(line) for line in TEST_FILE.read_text().splitlines() if line.strip()]


def _same_text(a: str, b: str) -> bool:
    def canon(s: str) -> str:
        return re.sub(r"^[a-z]=", "", s.replace(" ", ""))

    return canon(a) == canon(b)


def test_every_answer_matches_its_own_solution_box():
    rows = _rows()
    assert len(rows) == 500
    r1 = get_reward_fn("r1_zero")
    bad = []
    for row in rows:
        box = last_boxed(row["solution"])
        assert box is not None, row["unique_id"]
        v = grade_answer(row["answer"], box, timeout_s=30)
        if v.status is not Status.CORRECT:
            bad.append((row["unique_id"], row["answer"], box, v.status.value, v.info))
        # the whole solution as the reference: its last box is the gold answer
        r = r1(f"r </think> <answer>{row['answer']}</answer>", SimpleExample(row["solution"]))
        if r.total != 1.0:
            bad.append((row["unique_id"], "r1_zero", r.status.value, r.info))
    assert bad == []


def test_answers_of_other_problems_are_rejected():
    rows = _rows()
    accepted, wrong = [], []
    for shift in (1, 7, 250):  # 1,500 (answer, other gold) pairs, no problem against itself
        for i, row in enumerate(rows):
            other = rows[(i + shift) % len(rows)]["answer"]
            gold = last_boxed(row["solution"])
            v = grade_answer(other, gold, timeout_s=30)
            same = _same_text(other, gold)
            if v.status is Status.CORRECT:
                accepted.append((other, gold))
            if (v.status is Status.CORRECT) != same or v.status in (Status.TIMEOUT, Status.ERROR):
                wrong.append((shift, i, other, gold, v.status.value, v.info))
    assert wrong == []
    # the true equivalents among these pairs: equal numbers, and `x=5` against `5`
    assert len(accepted) == 7 and ("x=5", "5") in accepted
