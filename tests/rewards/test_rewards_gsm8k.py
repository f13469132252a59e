"""GSM8K test set: every reference answer graded against itself is correct, and against the
value + 1 is incorrect, both through grade_answer and through the gsm8k / r1_zero rewards."""

from __future__ import annotations

import json
from fractions import Fraction

from helpers.shared_data import needs_shared, shared_path

from rlvr.rewards import get_reward_fn
from rlvr.rewards.extract import reference_answer
from rlvr.rewards.grader import grade_answer
from rlvr.rewards.types import SimpleExample, Status

TEST_FILE = shared_path("data", "gsm8k", "test.jsonl")  # development data (../shared): skipped in a clone

pytestmark = needs_shared("data", "gsm8k", "test.jsonl")


def _rows() -> list[dict]:
    return [json.loads(line) for line in TEST_FILE.read_text().splitlines() if line.strip()]


def test_every_reference_against_itself_and_plus_one():
    rows = _rows()
    assert len(rows) == 1319
    gsm8k, r1 = get_reward_fn("gsm8k"), get_reward_fn("r1_zero")
    bad_self, bad_perturbed = [], []
    for row in rows:
        gold = reference_answer(row["answer"])  # the text after ####, e.g. "18" or "1,450,000"
        plus_one = str(Fraction(gold.replace(",", "")) + 1)
        if grade_answer(gold, gold).status is not Status.CORRECT:
            bad_self.append(gold)
        if grade_answer(plus_one, gold).status is not Status.INCORRECT:
            bad_perturbed.append(gold)
        ex = SimpleExample(row["answer"])
        # the full solution text as a response: its #### line is the answer
        assert gsm8k(row["answer"], ex).status is Status.CORRECT
        assert r1(f"r </think> <answer>{gold}</answer>", ex).total == 1.0
        assert r1(f"r </think> <answer>{plus_one}</answer>", ex).total == 0.0
    assert bad_self == [] and bad_perturbed == []


def test_separator_forms_of_the_same_reference():
    # 1,450,000 is a reference in the test set; the forms a model writes must all match
    for pred in ["1450000", "1,450,000", "1 450 000", "\\$1,450,000", "1450000.00", "1.45e6"]:
        assert grade_answer(pred, "1,450,000").status is Status.CORRECT, pred
    assert grade_answer("1,450,001", "1,450,000").status is Status.INCORRECT
