"""Step-checked arithmetic: a reward for every step of the response (process supervision).

The task `sum_steps` (rlvr/data/tasks/steps.py) asks for a sum written one step per line, each
step continuing from the result of the line before:

    prompt    "3+5+7="
    response  "3+5=8\\n8+7=15"

`sum_steps(response, example)` judges every line on its own: a step is correct when it reads
"a<op>b=c" with a = the result written on the previous line (the first term for the first line),
<op> b = the next operator and term of the problem, and c = a <op> b. An error is therefore charged
once, to the step that made it: "3+5=9\\n9+7=16" has steps (0, 1) (the second line computes right
from what it was given), although its answer is wrong. A line that is not of the form "a<op>b=c"
scores 0 and breaks the chain: no later line can continue from it. Lines beyond the problem's
number of steps score 0. Blank lines are not steps. A response that stops before writing every
step gets one more step of reward 0 at its end (step end len(response): the token that stopped it),
so stopping early is no cheaper than writing a wrong step.

The Reward it returns:
- total / status: the outcome: the result written on the last line equals the reference (correct /
  incorrect; unparsable when the last line is not a step);
- parts: {"answer": outcome, "steps_correct": correct steps / max(steps the problem needs, lines
  written)}: missing and extra steps both lower it (logged as reward/steps_correct);
- steps, step_ends: one reward (1.0 / 0.0) per written step and the index in the response of the
  step's last character (the trainer maps those to tokens, rlvr.train.pg.process), plus the 0 of
  stopping early at index len(response).

Stdlib only; the response is capped in length before any parsing (model output is hostile input).
"""

from __future__ import annotations

import re

from rlvr.rewards.types import ExampleLike, Reward, Status

SEPARATOR = "\n"
MAX_CHARS = 4096  # longer responses are judged on their first MAX_CHARS characters
MAX_DIGITS = 12  # a number with more digits is not a step (bounds int() on hostile input)

_STEP = re.compile(rf"(-?\d{{1,{MAX_DIGITS}}})\s*([+-])\s*(\d{{1,{MAX_DIGITS}}})\s*=\s*(-?\d{{1,{MAX_DIGITS + 1}}})")
_QUESTION = re.compile(r"\s*(\d+(?:\s*[+-]\s*\d+)+)\s*=\s*")
_TERM = re.compile(r"([+-]?)\s*(\d+)")


def problem_terms(question: str) -> tuple[list[int], list[str]]:
    """("3+5-7=") -> ([3, 5, 7], ["+", "-"]). ValueError when the question is not such a sum."""
    m = _QUESTION.fullmatch(question[:MAX_CHARS])
    if m is None:
        raise ValueError(f"not a step problem (terms joined by + or -, then '='): {question[:80]!r}")
    parts = _TERM.findall(m.group(1))
    return [int(d) for _, d in parts], [op for op, _ in parts[1:]]


def step_spans(text: str, separator: str = SEPARATOR) -> list[tuple[int, int]]:
    """[start, end) character spans of the non-blank lines of `text`, surrounding whitespace excluded:
    the steps. The last character of step j is text[end_j - 1]."""
    out, pos = [], 0
    for line in text.split(separator):
        stripped = line.strip()
        if stripped:
            start = pos + (len(line) - len(line.lstrip()))
            out.append((start, start + len(stripped)))
        pos += len(line) + len(separator)
    return out


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def check_steps(response: str, terms: list[int], ops: list[str]) -> tuple[list[float], list[tuple[int, int]],
                                                                            int | None]:
    """(reward per step line, the lines' spans, the result written on the last line or None when the
    last line is not a step)."""
    spans = step_spans(response[:MAX_CHARS])
    rewards: list[float] = []
    prev: int | None = terms[0]
    last: int | None = None
    for j, (s, e) in enumerate(spans):
        m = _STEP.fullmatch(response[s:e])
        last = None
        if m is None:
            rewards.append(0.0)
            prev = None  # nothing to continue from
            continue
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        ok = j < len(ops) and prev == a and op == ops[j] and b == terms[j + 1] and c == _apply(a, op, b)
        rewards.append(1.0 if ok else 0.0)
        prev = last = c
    return rewards, spans, last


def sum_steps(response: str, example: ExampleLike) -> Reward:
    """Per-step rewards of a step-by-step sum (module doc); total = the outcome. Never raises."""
    try:
        return _sum_steps(response, example)
    except Exception as exc:  # noqa: BLE001 - a reward must never raise into the training loop
        return Reward(0.0, {}, Status.ERROR, f"sum_steps: {type(exc).__name__}: {exc}"[:300])


def _sum_steps(response: str, example: ExampleLike) -> Reward:
    meta = getattr(example, "meta", None) or {}
    if "terms" in meta and "ops" in meta:
        terms, ops = [int(t) for t in meta["terms"]], [str(o) for o in meta["ops"]]
    else:
        terms, ops = problem_terms(str(getattr(example, "question", "") or meta.get("question", "")))
    rewards, spans, last = check_steps(response, terms, ops)
    share = sum(rewards) / max(len(ops), len(spans))
    ends = tuple(e - 1 for _, e in spans)
    if len(spans) < len(ops):
        # Stopping early is a wrong step of its own, placed on the token that stopped (index len(response):
        # the end of the response). Without it, a policy trained on step rewards learns to stop after the
        # steps it gets right: the end-of-sequence token would otherwise carry no step reward at all.
        rewards, ends = [*rewards, 0.0], (*ends, len(response))
    if last is None:
        why = "no steps" if not spans else "the last line is not a step 'a+b=c'"
        return Reward(0.0, {"answer": 0.0, "steps_correct": share}, Status.UNPARSABLE, why,
                      steps=tuple(rewards), step_ends=ends)
    ok = last == int(str(example.reference).strip())  # numbers, so "08" is 8
    return Reward(1.0 if ok else 0.0, {"answer": 1.0 if ok else 0.0, "steps_correct": share},
                  Status.CORRECT if ok else Status.INCORRECT,
                  f"{int(sum(rewards))} of {max(len(ops), len(spans))} steps correct", answer=str(last),
                  steps=tuple(rewards), step_ends=ends)
