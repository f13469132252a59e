"""Token-budget micro-batches (rlvr.train.batching.micro_batches): hand cases and properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.train.batching import micro_batches


def _padded(seq_lens, r: range) -> int:
    return len(r) * max(seq_lens[i] for i in r)


def test_hand_cases():
    # budget 24 tokens: [10, 12] pads to 2*12 = 24 (fits); adding 4 would be 3*12 = 36.
    # [4, 5, 6, 7] = 4*7 = 28 > 24, so [4, 5, 6] (18); then [7, 3, 2] = 3*7 = 21.
    lens = [10, 12, 4, 5, 6, 7, 3, 2]
    assert micro_batches(lens, max_rows=0, max_tokens=24) == [range(0, 2), range(2, 5), range(5, 8)]
    # row limit alone: chunks of 3
    assert micro_batches(lens, max_rows=3, max_tokens=0) == [range(0, 3), range(3, 6), range(6, 8)]
    # both: the tighter one wins each time
    assert micro_batches(lens, max_rows=2, max_tokens=24) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    # no limits: one range
    assert micro_batches(lens, max_rows=0, max_tokens=0) == [range(0, 8)]


def test_a_row_longer_than_the_budget_gets_its_own_range():
    # 50 > 16: alone; the rows around it are not pulled in with it.
    assert micro_batches([3, 50, 4, 4], max_rows=0, max_tokens=16) == [range(0, 1), range(1, 2), range(2, 4)]
    assert micro_batches([50], max_rows=0, max_tokens=16) == [range(0, 1)]


def test_empty_and_bad_arguments():
    assert micro_batches([], max_rows=4, max_tokens=100) == []
    with pytest.raises(ValueError, match="max_rows and max_tokens must be >= 0"):
        micro_batches([1, 2], max_rows=-1, max_tokens=0)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = -3"):
        micro_batches([1, -3], max_rows=0, max_tokens=10)


@settings(max_examples=400, deadline=None)
@given(
    seq_lens=st.lists(st.integers(min_value=0, max_value=300), max_size=60),
    max_rows=st.integers(min_value=0, max_value=12),
    max_tokens=st.one_of(st.just(0), st.integers(min_value=1, max_value=1200)),
)
def test_properties(seq_lens, max_rows, max_tokens):
    ranges = micro_batches(seq_lens, max_rows=max_rows, max_tokens=max_tokens)
    # every row exactly once, in order, contiguous ranges, none empty
    assert [i for r in ranges for i in r] == list(range(len(seq_lens)))
    assert all(len(r) >= 1 and r.step == 1 for r in ranges)
    for k, r in enumerate(ranges):
        if max_rows:
            assert len(r) <= max_rows
        if max_tokens:
            # the padded count fits, unless the range is a single over-long row
            assert _padded(seq_lens, r) <= max_tokens or len(r) == 1
        # greedy: the next row would have broken a limit (so no range is needlessly short)
        if k + 1 < len(ranges):
            grown = range(r.start, r.stop + 1)
            assert (max_rows and len(grown) > max_rows) or (max_tokens and _padded(seq_lens, grown) > max_tokens)


def test_a_step_with_more_rows_than_its_rollout_batch_keeps_its_optimizer_steps():
    """An agent episode's earlier segments add rows beyond the rollout batch (rlvr.train.pg.rollout_source.
    training_rows): the minibatches grow so the step still takes the plan's optimizer steps (the schedule counts on
    them); up to the rollout batch nothing changes (a filtered step keeps minibatches of train_batch rows)."""
    from rlvr.train.batching import minibatch_rows, plan_batches, split_indices

    plan = plan_batches(4, 4, 8, 4, 1)  # 16 rollouts, 2 optimizer steps of 8
    assert plan.optimizer_steps_per_rollout_batch == 2
    assert [minibatch_rows(n, plan) for n in (16, 11, 3)] == [8, 8, 8]
    assert [len(split_indices(n, minibatch_rows(n, plan))) for n in (17, 20, 33)] == [2, 2, 2]
    assert [len(c) for c in split_indices(21, minibatch_rows(21, plan))] == [11, 10]
