"""The studies' measuring functions (benchmarks/studies/*.py) on minimal settings: each checks a number
that could come out wrong. The full runs are commands, not tests (docs/studies/)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "studies"))

import length_normalization as length_study  # noqa: E402
import one_minus_1_over_g as factor_study  # noqa: E402
import std_normalization as std_study  # noqa: E402


@pytest.mark.parametrize("g", [2, 4])
def test_group_mean_monte_carlo_matches_1_minus_1_over_g_and_rloo_is_unbiased(g):
    logits, rewards = factor_study.bandit(seed=0)
    mean = factor_study.measure_factor("group_mean", logits, rewards, g, groups=20_000, seed=g)
    loo = factor_study.measure_factor("rloo", logits, rewards, g, groups=20_000, seed=g)
    # within 4 standard errors of the formula, and far (> 10 s.e.) from the unbiased value 1
    assert abs(mean["factor"] - (1 - 1 / g)) < 4 * mean["stderr"]
    assert abs(mean["factor"] - 1) > 10 * mean["stderr"]
    assert abs(loo["factor"] - 1) < 4 * loo["stderr"]
    # the estimate points along the true gradient: what is left orthogonal to it is small
    assert mean["residual"] < 0.05 and loo["residual"] < 0.05
    # rloo = G/(G-1) * group_mean sample by sample: on the same draws the factors keep that ratio
    assert loo["factor"] == pytest.approx(mean["factor"] * g / (g - 1), rel=1e-9)


def test_exact_gradient_of_the_bandit_against_autograd():
    import torch

    logits, rewards = factor_study.bandit(k=4, seed=3)
    th = logits.clone().requires_grad_(True)
    (torch.softmax(th, 0) * rewards).sum().backward()
    assert torch.allclose(factor_study.exact_gradient(logits, rewards), th.grad)


def test_group_weights_against_hand_computed_values():
    # G = 8, one success: p = 1/8. GRPO: A = (7/8)/sqrt(7/64) once and -(1/8)/sqrt(7/64) seven times,
    # mean |A| = 2 * (7/64) / sqrt(7/64) = 2 sqrt(7)/8 = 0.6614; group mean: 2 * 7/64 = 0.21875
    assert std_study.group_weight("grpo", 1, 8) == pytest.approx(2 * math.sqrt(7) / 8, rel=1e-5)
    assert std_study.group_weight("group_mean", 1, 8) == pytest.approx(0.21875)
    assert std_study.group_weight("grpo", 4, 8) == pytest.approx(1.0, rel=1e-5)
    assert std_study.group_weight("grpo", 0, 8) == 0.0 and std_study.group_weight("grpo", 8, 8) == 0.0
    rows = std_study.weights_table(8)
    # relative to a p = 1/2 group, GRPO gives a 1-in-8 group 3.02 / 2 = 1.51 times the weight Dr. GRPO does
    assert rows[1]["ratio_vs_half"] == pytest.approx(math.sqrt(64 / 7) / 2, rel=1e-4)


def test_expected_weight_monte_carlo_matches_the_binomial_sum():
    for q in (0.1, 0.5):
        for est in ("grpo", "group_mean"):
            mc = std_study.expected_weight(est, q, 8, groups=20_000, seed=1)
            assert mc == pytest.approx(std_study.binomial_expectation(est, q, 8), abs=0.01)
    # q = 0.5, group mean: sum_k C(8,k)/256 * 2 (k/8)(1-k/8) = 2 * E[p(1-p)] = 2 * (1/4)(1 - 1/8) = 0.4375
    assert std_study.binomial_expectation("group_mean", 0.5, 8) == pytest.approx(0.4375)


def test_length_gap_summarizes_first_and_last_steps():
    rows = [{"step": i, "len/correct": 10.0, "len/incorrect": 10.0 + i, "len/truncated_frac": 0.0}
            for i in range(1, 21)]
    rows.insert(3, {"step": 99, "len/correct": None, "len/incorrect": 30.0})  # no correct sample: skipped
    s = length_study.length_gap(rows, first=5, last=5)
    assert s["first"]["gap"] == pytest.approx(3.0)  # steps 1..5
    assert s["last"]["gap"] == pytest.approx(18.0)  # steps 16..20
    assert s["gap_change"] == pytest.approx(15.0) and s["correct_change"] == 0.0
    with pytest.raises(ValueError, match="len/correct"):
        length_study.length_gap([{"len/correct": 3.0}])
