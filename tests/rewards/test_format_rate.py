"""One format-rate definition (Reward.formatted, rlvr.rewards.types.format_rate) behind training metrics,
evaluation and `rlvr grade`."""

import math

from rlvr.eval.metrics import is_formatted
from rlvr.rewards.batch import ScoreCounters
from rlvr.rewards.types import Reward, Status, format_rate
from rlvr.train.session import sample_metrics

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
# formatted only by a format part > 0: yes, yes, no, yes, then no part at all -> 3 of 8
EXPECTED = [True, True, False, True, False, False, False, False]


def test_reward_formatted_predicate():
    assert [r.formatted for r in REWARDS] == EXPECTED


def test_eval_and_grade_use_the_same_predicate():
    assert [is_formatted(r.parts, r.status) for r in REWARDS] == EXPECTED
    assert ScoreCounters.of(REWARDS).format_rate == 3 / 8
    assert format_rate([r.parts for r in REWARDS]) == 3 / 8


def test_no_format_part_is_not_a_rate():
    """A reward without a format part (arithmetic) has no format rate: NaN everywhere, "n/a" in tables,
    not the share of responses with an extracted answer (which grade and the trainers used to print)."""
    no_part = REWARDS[4:]
    assert math.isnan(format_rate([r.parts for r in no_part]))
    assert math.isnan(ScoreCounters.of(no_part).format_rate)
    assert ScoreCounters.of(no_part).as_dict()["format_rate"] is None
    assert "format_rate" not in sample_metrics(no_part, [_Ro()] * len(no_part))
    assert sample_metrics(REWARDS, [_Ro()] * len(REWARDS))["format_rate"] == 3 / 8


class _Ro:
    response_ids = [1, 2]
    finish_reason = "stop"
    text = "42"
