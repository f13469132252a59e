"""R1's two rule-based rewards as separate terms, so they can be ADDED as well as GATED.

DeepSeek-R1-Zero is trained on the sum of an accuracy reward and a format reward (R1 report,
section 2.2.2); CS336's `r1_zero` (rlvr.rewards.functions.r1_zero) instead gates the answer on the
format: an unformatted response scores 0 even when its answer is right, and the format is logged,
not paid. Both are reachable by name:

    data.reward=r1_zero                   # gated (CS336): total = formatted AND right
    data.reward="answer:1,format:0.5"     # added (R1): total = right + 0.5 * formatted

    response                                  r1_zero   answer:1,format:0.5
    "... </think> <answer>15</answer>" (15)     1.0       1.0 + 0.5 = 1.5
    "... </think> <answer>14</answer>" (15)     0.0       0.0 + 0.5 = 0.5
    "15"                               (15)     0.0       1.0 + 0.0 = 1.0
    "14"                               (15)     0.0       0.0

`format` uses exactly r1_zero's format rule (rlvr.rewards.extract.parse_r1_zero: the separator
`</think> <answer>` and a later `</answer>`), so "formatted" means the same in both modes.

Put the accuracy term first in a composition: a composed reward's status (what `accuracy` counts)
is its first term's (rlvr.rewards.registry.ComposedReward).
"""

from __future__ import annotations

from rlvr.rewards.extract import (
    MAX_RESPONSE_CHARS,
    answer_block,
    answer_is,
    gsm8k_hash,
    last_boxed,
    last_number,
    parse_r1_zero,
    reference_answer,
)
from rlvr.rewards.grader import grade_answer
from rlvr.rewards.types import ExampleLike, Reward, Status

# An explicit answer marker that yields no usable answer (an unclosed block or box, a truncated
# response) is a malformed answer, not an invitation to pick a number out of the reasoning.
_MARKERS = ("<answer>", "\\boxed", "\\fbox", "####")


def format_reward(response: str, example: ExampleLike) -> Reward:
    """R1's format reward: total 1 when the response follows the r1_zero format (`... </think>
    <answer> ... </answer>`), else 0. Status CORRECT / UNPARSABLE (the format check is the whole
    verdict; the answer is not read). Parts {"format": total}."""
    try:
        ok = parse_r1_zero(response).format_ok
    except Exception as exc:  # noqa: BLE001 - a reward never raises into the trainer
        return Reward(0.0, {}, Status.ERROR, f"format: {type(exc).__name__}: {exc}"[:300])
    score = 1.0 if ok else 0.0
    return Reward(score, {"format": score}, Status.CORRECT if ok else Status.UNPARSABLE,
                  "" if ok else "r1_zero format not followed")


def extract_answer(response: str) -> str | None:
    """The answer an accuracy-only reward grades, whatever the format: the last complete
    `<answer>...</answer>` block (its `\\boxed{}` if it has one), else the last `\\boxed{}`, else a
    `####` line, else "the answer is ...", else the last number in the response. None when an
    explicit marker is present but yields nothing usable, or when there is no number at all."""
    for fn in (answer_block, last_boxed, gsm8k_hash, answer_is):
        ans = fn(response)
        if ans is not None:
            if fn is answer_block and ("\\boxed" in ans or "\\fbox" in ans):
                ans = last_boxed(ans)
            return ans
    tail = response[-MAX_RESPONSE_CHARS:] if isinstance(response, str) else ""
    if any(marker in tail for marker in _MARKERS):
        return None
    return last_number(response)


def answer_reward(response: str, example: ExampleLike) -> Reward:
    """R1's accuracy reward without a format gate: total 1 when the extracted answer (see
    extract_answer) is equivalent to the reference, else 0; graded by the tiered checker like every
    other answer reward. Parts {"answer": total}: no format part (pair it with `format`)."""
    try:
        answer = extract_answer(response)
        if answer is None:
            return Reward(0.0, {"answer": 0.0}, Status.UNPARSABLE, "no answer found")
        verdict = grade_answer(answer, reference_answer(example.reference))
    except Exception as exc:  # noqa: BLE001 - a reward never raises into the trainer
        return Reward(0.0, {}, Status.ERROR, f"answer: {type(exc).__name__}: {exc}"[:300])
    score = 1.0 if verdict.status is Status.CORRECT else 0.0
    return Reward(score, {"answer": score}, verdict.status, verdict.info, answer=answer)


# Registered names (rlvr.rewards.REWARD_FUNCTIONS).
FORMAT_REWARDS = {"format": format_reward, "answer": answer_reward}
