"""The studies' measuring functions (benchmarks/studies/*.py) on minimal settings: each checks a number
that could come out wrong. The full runs are commands, not tests (docs/studies/)."""

import math
import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "studies"))

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


import off_policy as off_policy_study  # noqa: E402
import thinking_budget as think_study  # noqa: E402


def test_stability_measures_drops_and_spread():
    s = off_policy_study.stability([0.2, 0.3, 0.1, 0.25], [0.5, 0.7, 0.5, 0.7], last=4)
    assert s["max_drop"] == pytest.approx(0.2)  # 0.3 -> 0.1
    assert s["best_minus_last"] == pytest.approx(0.05)
    assert s["train_acc_sd_last"] == pytest.approx(0.1)  # population sd of 0.5, 0.7, 0.5, 0.7
    assert off_policy_study.stability([0.1, 0.2, 0.3], [0.4])["max_drop"] == 0.0


def test_think_target_and_its_grading():
    t = think_study.think_target("3+5+7+1=")
    assert t == "\n3+5=08\n08+7=15\n15+1=16\n</think>\n\n16"
    assert think_study.think_target("9+9+9=") == "\n9+9=18\n18+9=27\n</think>\n\n27"
    ex = type("Ex", (), {"reference": "16"})()
    assert think_study.think_reward(t, ex).total == 1.0
    assert think_study.think_reward(t[:-2] + "17", ex).total == 0.0
    # reasoning cut before the think block closed: the last number seen (16) is NOT an answer
    assert think_study.think_reward("\n3+5=08\n08+7=15\n15+1=16", ex).status.value == "unparsable"
    assert think_study.answer_after_think("\n\n</think>\n\n16") == "16"


@pytest.mark.parametrize("budget", [0, 3])
def test_forced_answers_always_close_the_think_block_and_cut_answers_respect_the_cap(budget):
    from rlvr.models.tiny import build_tiny_model
    from rlvr.rollout import build_generator
    from rlvr.train.config import RolloutConfig

    model, tok = build_tiny_model(hidden_size=32, num_layers=1, seed=0)
    task = think_study.think_task(0, n_train=8, n_eval=6)
    gen = build_generator(RolloutConfig(), model, tok, default_batch_size=8)
    forced = think_study.accuracy_at_budget(gen, task, list(task.eval), budget, "forced")
    cut = think_study.accuracy_at_budget(gen, task, list(task.eval), budget, "cut")
    # an untrained model never closes its think block by itself within 3 tokens: a forced answer always
    # sees "</think>" (forced text, or the empty block of budget 0), a cut one never does
    assert forced["closed"] == 1.0 and cut["closed"] == 0.0 and cut["answered"] == 0.0
    assert forced["sampled_tokens"] <= budget + think_study.ANSWER_TOKENS
    assert cut["sampled_tokens"] <= budget + think_study.ANSWER_TOKENS
    with pytest.raises(ValueError, match="mode"):
        think_study.accuracy_at_budget(gen, task, list(task.eval), budget, "sideways")


def test_fused_targets_are_full_reasoning_or_a_prefix_then_the_forced_answer():
    import random

    full = think_study.think_target("3+5+7=")
    reasoning = full.split("</think>")[0]
    rng = random.Random(0)
    seen = [think_study.fused_target("3+5+7=", rng) for _ in range(400)]
    cut = [t for t in seen if t != full]
    assert 150 < len(cut) < 250  # about half
    for t in cut:
        assert t.endswith("</think>\n\n15")
        head = t[: -len("15")]
        if head == "\n\n</think>\n\n":  # budget 0: the empty think block
            continue
        assert head.endswith(think_study.STOP_THINKING)
        prefix = head[: -len(think_study.STOP_THINKING)]
        assert 0 < len(prefix) < len(reasoning) and reasoning.startswith(prefix)


def test_the_commands_write_their_results_files(tmp_path):
    """`python benchmarks/studies/NAME.py ...` end to end for the two studies that need no training:
    results json (with the command and the measured numbers) and plot, here into tmp_path (--out)."""
    import json

    factor_study.main(["--groups", "4000", "--sizes", "2,4", "--out", str(tmp_path)])
    std_study.main(["--no-learning", "--group-size", "4", "--out", str(tmp_path)])
    f = json.loads((tmp_path / "one_minus_1_over_g.json").read_text())
    assert [r["G"] for r in f["rows"]] == [2, 2, 2, 4, 4, 4] and f["groups"] == 4000
    gm = [r for r in f["rows"] if r["estimator"] == "group_mean"]
    assert all(abs(r["factor"] - r["expected"]) < 4 * r["stderr"] for r in gm)
    s = json.loads((tmp_path / "std_normalization.json").read_text())
    # G = 4, one success: GRPO 2 sqrt(3/16) = 0.866, group mean 2 * 3/16 = 0.375
    assert s["weights"][1]["grpo"] == pytest.approx(0.8660, abs=1e-4)
    assert s["weights"][1]["group_mean"] == pytest.approx(0.375)
    assert "learning" not in s and "wall_s" in s and "load_average_end" in s
    assert (tmp_path / "one_minus_1_over_g.png").stat().st_size > 0
    assert (tmp_path / "std_normalization.png").stat().st_size > 0


def test_add_merges_seeds_only_with_the_same_settings(tmp_path):
    import json

    import _common

    (tmp_path / "x.json").write_text(json.dumps({"command": "first", "steps": 40, "runs": {"0": {"a": 1}}}))
    header: dict = {}
    res = _common.merge_previous("x", {"steps": 40, "runs": {"1": {"a": 2}}}, header, ("steps",), results=tmp_path)
    assert res["runs"] == {"0": {"a": 1}, "1": {"a": 2}} and header["earlier_commands"] == ["first"]
    with pytest.raises(SystemExit, match="steps"):
        _common.merge_previous("x", {"steps": 20, "runs": {"1": {}}}, {}, ("steps",), results=tmp_path)


def test_reflective_targets_write_a_wrong_step_then_wait_then_the_right_one():
    import random

    from reflection import REFLECTION, reflective_target

    from rlvr.eval.reflection import has_reflection
    from rlvr.rewards.types import Status
    from rlvr.train.config import DataConfig
    from rlvr.train.tasks import load_task_data

    task = load_task_data(DataConfig(task="sum_steps", num_train=50, num_eval=0))
    rng = random.Random(0)
    for ex in task.train:
        plain = task.target(ex)
        t = reflective_target(plain, rng)
        lines = t.split("\n")
        assert lines[1] == REFLECTION and lines[2:] == plain.split("\n")  # the right steps follow, unchanged
        wrong, right = lines[0].split("=")[1], lines[2].split("=")[1]
        assert wrong != right and len(wrong) == len(right) and 1 <= abs(int(wrong) - int(right)) <= 3
        assert has_reflection(t) and not has_reflection(plain)
        assert task.reward_fn(t, ex).status is Status.CORRECT  # the outcome reads the last line
