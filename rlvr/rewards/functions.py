"""Reward functions: `(response: str, example: ExampleLike) -> Reward`, registered by name.

Every function returns the total and its named parts (`format`, `answer`, ...), a typed status,
and never raises: a bug or bad metadata becomes `Status.ERROR` with the reason in `info`, so the
trainer counts it instead of crashing or silently scoring 0. All are module-level functions (or
instances of module-level classes), so worker processes can import them by name and pickle works.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from rlvr.rewards import countdown as _countdown
from rlvr.rewards.extract import (
    MAX_RESPONSE_CHARS,
    answer_block,
    answer_is,
    choice_letter,
    final_answer,
    gsm8k_hash,
    last_boxed,
    last_number,
    parse_r1_zero,
    reference_answer,
)
from rlvr.rewards.grader import grade_answer
from rlvr.rewards.language import language_share
from rlvr.rewards.types import ExampleLike, Reward, Status


def never_raises(fn: Callable[[str, ExampleLike], Reward]) -> Callable[[str, ExampleLike], Reward]:
    """Turn any exception of a reward function into Reward(0, status=ERROR, info=reason)."""

    @functools.wraps(fn)
    def wrapper(response: str, example: ExampleLike) -> Reward:
        try:
            return fn(response, example)
        except Exception as exc:  # noqa: BLE001 - a reward must never raise into the trainer
            return Reward(0.0, {}, Status.ERROR, f"{fn.__name__}: {type(exc).__name__}: {exc}"[:300])

    return wrapper


def _graded(answer: str | None, reference: str, format_ok: float) -> Reward:
    """Shared tail of the answer-checking rewards: parts {format, answer}, total = answer.

    As in the CS336 r1_zero_reward_fn, a well-formatted wrong answer earns total 0 (format is
    logged, not paid), so the format term cannot be farmed on its own."""
    if answer is None:
        return Reward(0.0, {"format": format_ok, "answer": 0.0}, Status.UNPARSABLE, "no answer found")
    verdict = grade_answer(answer, reference_answer(reference))
    score = 1.0 if verdict.status is Status.CORRECT else 0.0
    return Reward(score, {"format": format_ok, "answer": score}, verdict.status, verdict.info, answer=answer)


@never_raises
def r1_zero(response: str, example: ExampleLike) -> Reward:
    """CS336 r1_zero semantics: format = `</think> <answer>` and `</answer>` present; answer =
    last answer block (its `\\boxed{}` if it has one); total = answer correctness."""
    parsed = parse_r1_zero(response)
    if not parsed.format_ok:
        return Reward(0.0, {"format": 0.0, "answer": 0.0}, Status.UNPARSABLE, "r1_zero format not followed")
    answer = parsed.answer
    if answer is not None and ("\\boxed" in answer or "\\fbox" in answer):
        answer = last_boxed(answer)
    return _graded(answer, example.reference, 1.0)


@never_raises
def question_only(response: str, example: ExampleLike) -> Reward:
    """CS336 question_only semantics: the answer is the last `\\boxed{}` (else a `####` line);
    format = an answer was found."""
    answer = last_boxed(response)
    if answer is None:
        answer = gsm8k_hash(response)
    return _graded(answer, example.reference, 1.0 if answer is not None else 0.0)


def _explicit_or_last_number(response: str) -> tuple[str | None, float]:
    """(answer, format): an explicit marker (answer block, box, ####, "the answer is") gives
    format 1; falling back to the last number in the text gives format 0."""
    for fn in (answer_block, last_boxed, gsm8k_hash, answer_is):
        ans = fn(response)
        if ans is not None:
            if fn is answer_block and ("\\boxed" in ans or "\\fbox" in ans):
                ans = last_boxed(ans)
            return ans, 1.0
    # An explicit marker that yielded nothing usable (unbalanced, too long) means a malformed
    # answer, not an invitation to pick a number out of it.
    tail = response[-MAX_RESPONSE_CHARS:]
    if any(marker in tail for marker in _MARKERS):
        return None, 0.0
    return last_number(response), 0.0


_MARKERS = ("<answer>", "\\boxed", "\\fbox", "####")


@never_raises
def gsm8k(response: str, example: ExampleLike) -> Reward:
    """GSM8K: answer from an explicit marker, else the last number; graded exactly."""
    answer, fmt = _explicit_or_last_number(response)
    return _graded(answer, example.reference, fmt)


@never_raises
def arithmetic(response: str, example: ExampleLike) -> Reward:
    """Synthetic arithmetic: same extraction as gsm8k; the reference is a number. Its prompts ask
    for a bare number, so there is no format to follow: the reward reports no format part (format
    rates show n/a instead of a misleading 0%)."""
    answer, fmt = _explicit_or_last_number(response)
    r = _graded(answer, example.reference, fmt)
    return Reward(r.total, {"answer": r.parts["answer"]}, r.status, r.info, answer=r.answer)


@never_raises
def math(response: str, example: ExampleLike) -> Reward:
    """Free-form math (MATH-style): answer block > box > #### > "the answer is" > last number;
    format = an explicit marker was used; graded by the full tiered checker."""
    answer, fmt = _explicit_or_last_number(response)
    return _graded(answer, example.reference, fmt)


def _meta(example: ExampleLike, key: str):
    meta = getattr(example, "meta", None) or {}
    if key not in meta:
        raise KeyError(f"example.meta has no {key!r} (keys: {sorted(meta)})")
    return meta[key]


@never_raises
def countdown(response: str, example: ExampleLike) -> Reward:
    """Countdown: the answer (answer block, else box, else last line) must use each of
    meta["numbers"] exactly once with + - * / and parentheses and equal meta["target"]."""
    numbers = [int(n) for n in _meta(example, "numbers")]
    target = int(_meta(example, "target"))
    expr = answer_block(response)
    fmt = 1.0
    if expr is None:
        expr = last_boxed(response)
    if expr is None:
        fmt = 0.0
        lines = [ln for ln in response[-4096:].splitlines() if ln.strip()]
        expr = lines[-1] if lines else None
    if expr is None:
        return Reward(0.0, {"format": 0.0, "answer": 0.0}, Status.UNPARSABLE, "no expression found")
    ok, why = _countdown.check(expr, numbers, target)
    score = 1.0 if ok else 0.0
    return Reward(score, {"format": fmt, "answer": score}, Status.CORRECT if ok else Status.INCORRECT, why,
                  answer=expr)


_LETTERS = "ABCDEFGHIJ"


@never_raises
def multiple_choice(response: str, example: ExampleLike) -> Reward:
    """Multiple choice: the committed letter equals the reference letter. The reference may be
    a letter ("B", "(B)") or the text of a choice listed in meta["choices"]."""
    meta = getattr(example, "meta", None) or {}
    choices = meta.get("choices")
    letters = _LETTERS[: len(choices)] if choices else _LETTERS
    ref = example.reference.strip().strip("()").strip()
    if len(ref) == 1 and ref.upper() in letters:
        gold = ref.upper()
    elif choices:
        norm = [str(c).strip().lower() for c in choices]
        if ref.lower() not in norm:
            raise ValueError(f"reference {example.reference!r} is neither a letter nor one of the choices")
        gold = letters[norm.index(ref.lower())]
    else:
        raise ValueError(f"reference {example.reference!r} is not a choice letter and meta has no 'choices'")
    letter = choice_letter(response, letters)
    if letter is None:
        return Reward(0.0, {"format": 0.0, "answer": 0.0}, Status.UNPARSABLE, "no choice letter found")
    score = 1.0 if letter == gold else 0.0
    status = Status.CORRECT if score else Status.INCORRECT
    return Reward(score, {"format": 1.0, "answer": score}, status, f"chose {letter}, gold {gold}", answer=letter)


LANGUAGE_CORRECT_AT = 0.9  # status CORRECT when at least this share is in the target language


@never_raises
def language(response: str, example: ExampleLike) -> Reward:
    """R1 language consistency: share of reasoning words (text before `</think>`, or the whole
    response without it) in the script of meta.get("language", "en"). Total in [0, 1]."""
    meta = getattr(example, "meta", None) or {}
    share = language_share(parse_r1_zero(response).reasoning, str(meta.get("language", "en")))
    status = Status.CORRECT if share >= LANGUAGE_CORRECT_AT else Status.INCORRECT
    return Reward(share, {"language": share}, status, f"{share:.3f} in target language")


@never_raises
def final(response: str, example: ExampleLike) -> Reward:
    """Generic: `extract.final_answer` then the tiered checker; format = an answer was found."""
    answer = final_answer(response)
    return _graded(answer, example.reference, 1.0 if answer is not None else 0.0)
