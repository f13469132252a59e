"""Kimi's multiple-choice rule (rlvr.data.filters.multiple_choice) and the reflection-phrase metric
(rlvr.eval.reflection, text/reflection_rate in training and evaluation)."""

from __future__ import annotations

import json
import math

import pytest
from helpers.shared_data import needs_shared, shared_path

from rlvr.data.filters import multiple_choice
from rlvr.eval.evaluate import EvalSample, summarize
from rlvr.eval.reflection import has_reflection, reflection_phrases, reflection_rate
from rlvr.rewards.types import Reward, Status
from rlvr.rollout.types import Rollout
from rlvr.train.session import sample_metrics

DATA = shared_path("data")  # ../shared/data: development data a clone does not have


@pytest.mark.parametrize("question, reference, why", [
    ("Which shape?\n(A) Line\n(B) Circle\n(C) Plane", None, "options (A)-(C)"),
    (r"Which is largest? $\textbf{(A)}\ 1\qquad\textbf{(B)}\ 2\qquad\textbf{(C)}\ 3\qquad\textbf{(D)}\ 4$", None,
     "options (A)-(D)"),
    ("Pick one.\nA. red\nB. blue\nC. green", None, "options (A)-(C)"),
    ("Which of the following is even? (A) 3 (B) 4", None, "options (A)-(B) and 'which of the following'"),
    ("Is it (A) 3 or (B) 4?", r"\text{(B)}", r"options (A)-(B) and the answer '\\text{(B)}'"),
    ("Is it (A) 3 or (B) 4?", "4", None),  # two labels, no cue, a numeric answer: parts, not options
    ("draw(A--B); dot(A); dot(B); dot(C); label(\"$A$\", A);", None, None),  # Asymptote, not options
    ("Find x in (a) the first case, (b) the second, (c) the third.", None, None),  # lower case: parts
    ("Points (A), (C) and (D) lie on a line.", None, None),  # no (B): not a run of options
])
def test_multiple_choice_detects_option_runs_only(question, reference, why):
    assert multiple_choice(question, reference) == why


@needs_shared("data", "math500", "test.jsonl")
@needs_shared("data", "gsm8k", "train.jsonl")
def test_multiple_choice_finds_exactly_the_three_option_questions_of_math500_and_none_in_gsm8k():
    found = []
    for line in (DATA / "math500" / "test.jsonl").read_text().splitlines():
        row = json.loads(line)
        if multiple_choice(row["problem"], row["answer"]):
            found.append(row["answer"])
    assert found == [r"\text{(C)}", r"\text{(E)}", r"\text{(B)}"]  # answers of the 3 option questions
    gsm = [json.loads(x)["question"] for x in (DATA / "gsm8k" / "train.jsonl").read_text().splitlines()[:2000]]
    assert not [q for q in gsm if multiple_choice(q)]


def test_reflection_phrases_are_whole_words_case_insensitive():
    assert reflection_phrases("Wait, 2+2=4. Hmm, let me check: yes. Actually, fine; double-check done.") == [
        "wait", "hmm", "let me check", "actually,", "double-check"]
    assert not has_reflection("The result was awaited; it is actually correct, a hmmm")  # inside words; no comma
    assert reflection_rate(["wait.", "no", "Let me verify", "42"]) == 0.5
    assert math.isnan(reflection_rate([]))


def _rollout(text: str) -> Rollout:
    return Rollout(prompt="q", prompt_ids=[1], response_ids=[2, 3], text=text, logprobs=[0.0, 0.0], group=0,
                   finish_reason="stop")


def test_training_and_evaluation_log_the_reflection_rate():
    texts = ["Wait, that is wrong: 5", "5", "Hmm. 6", "let me check 7", "7"]
    rewards = [Reward(total=1.0, parts={}, status=Status.CORRECT) for _ in texts]
    m = sample_metrics(rewards, [_rollout(t) for t in texts])
    assert m["text/reflection_rate"] == pytest.approx(3 / 5)
    samples = [EvalSample(example_index=i // 2, example_id=str(i // 2), sample_index=i % 2, prompt="q", response=t,
                          reference="5", reward=1.0, parts={}, status="correct", num_tokens=2, finish_reason="stop")
               for i, t in enumerate(texts[:4])]
    assert summarize(samples, n=2, temperature=1.0).metrics("eval/")["eval/text/reflection_rate"] == 0.75
