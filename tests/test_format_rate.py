"""One format-rate definition (Reward.formatted) behind training metrics, evaluation and `rlvr grade`."""

from rlvr.eval.metrics import is_formatted
from rlvr.rewards.batch import ScoreCounters
from rlvr.rewards.types import Reward, Status

REWARDS = [
    Reward(1.0, {"format": 1.0, "answer": 1.0}, Status.CORRECT),
    Reward(0.0, {"format": 1.0, "answer": 0.0}, Status.INCORRECT),
    Reward(0.0, {"format": 0.0, "answer": 0.0}, Status.UNPARSABLE),
    Reward(0.0, {"format": 0.5}, Status.INCORRECT),  # partial format credit counts as formatted
    Reward(1.0, {}, Status.CORRECT),  # no format part: an extracted answer counts
    Reward(0.0, {}, Status.INCORRECT),
    Reward(0.0, {}, Status.UNPARSABLE),  # no answer found: not formatted
    Reward(0.0, {}, Status.TIMEOUT),  # timed out after extraction: an answer was there
]
# formatted: yes, yes, no, yes, yes, yes, no, yes -> 6 of 8
EXPECTED = [True, True, False, True, True, True, False, True]


def test_reward_formatted_predicate():
    assert [r.formatted for r in REWARDS] == EXPECTED


def test_eval_and_grade_use_the_same_predicate():
    assert [is_formatted(r.parts, r.status) for r in REWARDS] == EXPECTED
    assert ScoreCounters.of(REWARDS).format_rate == 6 / 8
