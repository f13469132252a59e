"""Unscorable is not zero (issue 36, item 3): a reward whose checker failed (Status.ERROR: the reward function
raised, the judge failed with judge.fallback=unscored, the environment crashed) is kept out of its group's
baseline and gets advantage 0; a wrong answer or a verifier timeout stays a scored incorrect answer.

Hand numbers: the group [1, 0, failed, 1] under grpo (population std) has the advantages of [1, 0, 1]: mean 2/3,
std sqrt(2)/3, A = [1/sqrt 2, -sqrt 2, 0, 1/sqrt 2] = [0.7071, -1.4142, 0, 0.7071]; scored as a 0 it was
[1, -1, -1, 1] (mean 1/2, std 1/2).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlvr.algo import compute_advantages
from rlvr.rewards.types import Reward, Status
from rlvr.train.config import AlgoConfig

S2 = math.sqrt(2)


def _rewards(*spec):
    out = []
    for x in spec:
        if x == "err":
            out.append(Reward(0.0, {}, Status.ERROR, "ValueError: boom"))
        elif x == "timeout":
            out.append(Reward(0.0, {}, Status.TIMEOUT, "timeout"))
        else:
            out.append(Reward(float(x), {}, Status.CORRECT if x else Status.INCORRECT))
    return out


@pytest.mark.parametrize(("name", "std", "want"), [
    ("grpo", "population", [1 / S2, -S2, 0.0, 1 / S2]),
    ("grpo", "sample", [1 / math.sqrt(3), -2 / math.sqrt(3), 0.0, 1 / math.sqrt(3)]),  # std sqrt(1/3)
    ("group_mean", "population", [1 / 3, -2 / 3, 0.0, 1 / 3]),
    ("rloo", "population", [0.5, -1.0, 0.0, 0.5]),
    ("no_baseline", "population", [1.0, 0.0, 0.0, 1.0]),
])
def test_a_failed_checker_leaves_its_group_baseline(name, std, want):
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    valid = torch.tensor([True, True, False, True])
    got = compute_advantages(name, r, 4, eps=0.0, std=std, valid=valid)
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    if name not in ("no_baseline",):  # equal to the estimator on the group without the failed sample
        alone = compute_advantages(name, torch.tensor([1.0, 0.0, 1.0]), 3, eps=0.0, std=std)
        assert got[[0, 1, 3]].tolist() == pytest.approx(alone.tolist(), abs=1e-6)


def test_batch_std_and_degenerate_groups():
    # batch_std: the group means and the batch std over the scored rewards only
    r = torch.tensor([1.0, 0.0, 5.0, 1.0, 0.0, 0.0, 1.0, 9.0])
    valid = torch.tensor([True, True, False, True, True, True, True, False])
    got = compute_advantages("batch_std", r, 4, eps=0.0, valid=valid)
    kept = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    sd = float(kept.std(correction=0))
    want = [(1 - 2 / 3) / sd, (0 - 2 / 3) / sd, 0.0, (1 - 2 / 3) / sd, (0 - 1 / 3) / sd, (0 - 1 / 3) / sd,
            (1 - 1 / 3) / sd, 0.0]
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    # a group with one scored reward (or none) has nothing to compare: 0, never NaN, for every estimator
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    valid = torch.tensor([True, False, False, False])
    for name in ("grpo", "group_mean", "rloo", "batch_std"):
        for std in ("population", "sample"):
            got = compute_advantages(name, r, 4, std=std, valid=valid)
            assert got.tolist() == [0.0, 0.0, 0.0, 0.0], (name, std)
    # all valid: the unmasked formula, bit for bit
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.equal(compute_advantages("grpo", r, 4, valid=torch.ones(4, dtype=torch.bool)),
                       compute_advantages("grpo", r, 4))


def _shape(rewards, **algo):
    from rlvr.train.pg.objective import Shaping

    cfg = AlgoConfig(**algo)
    return Shaping.of(cfg, group_size=4, max_tokens=16)(rewards, torch.full((len(rewards),), 4.0), step=1)


def test_shaping_keeps_unscored_out_and_timeouts_in():
    shaped, adv, keep, zero_var = _shape(_rewards(1, 0, "err", 1, 1, 0, "timeout", 1))
    assert adv[:4].tolist() == pytest.approx([1 / S2, -S2, 0.0, 1 / S2], abs=1e-5)
    # a verifier timeout is a scored incorrect answer: the group [1, 0, 0, 1] -> [1, -1, -1, 1]
    assert adv[4:].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-4)
    assert keep.all() and zero_var == 0.0
    # a group whose scored rewards are all equal carries no signal, whatever the failed one would have been
    _, adv, keep, zero_var = _shape(_rewards(1, "err", 1, 1, 0, 0, 1, 1), filter_zero_variance=True)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0] and zero_var == 0.5
    assert keep.tolist() == [False] * 4 + [True] * 4


def test_a_critic_drops_the_unscored_row():
    # advantage=gae: the shaped reward goes to the critic; an unscored row must not teach it a return of 0
    shaped, adv, keep, _ = _shape(_rewards(1, 0, "err", 1), advantage="gae", critic="shared")
    assert keep.tolist() == [True, True, False, True]
    assert adv.tolist() == [1.0, 0.0, 0.0, 1.0]


def test_refill_counts_only_scored_spread():
    from rlvr.train.pg.rollout_source import _spread_groups

    # [1, err, 1, 1]: no spread among the scored ones (scored as 0 it looked like a spread)
    assert _spread_groups(_rewards(1, "err", 1, 1, 1, 0, 1, 1), 4) == 1


def test_a_crashing_environment_ends_its_episode_unscored():
    from rlvr.envs.base import Environment, StepResult
    from rlvr.envs.rollout import run_episodes
    from rlvr.models.tiny import build_tiny_model
    from rlvr.rollout import build_generator
    from rlvr.rollout.types import SamplingSpec
    from rlvr.train.config import RolloutConfig

    class Crashy(Environment):
        name = "crashy"
        stop = ()
        max_turns = 2

        def reset(self, example):
            return "go"

        def step(self, action):
            if example_ids.pop(0) == 1:
                raise IsADirectoryError("tests")
            return StepResult("", {"answer": 1.0}, done=True)

    example_ids = [0, 1, 0, 0]
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=0)[:2]
    gen = build_generator(RolloutConfig(), model, tok, seed=0)
    eps = run_episodes(gen, Crashy, [{"q": 1}, {"q": 2}], SamplingSpec(n=2, max_tokens=3, seed=0), tok,
                       max_tokens_total=16)
    statuses = [e.reward.status for e in eps]
    assert statuses.count(Status.ERROR) == 1 and len(eps) == 4
    bad = next(e for e in eps if e.reward.status is Status.ERROR)
    assert "environment crashy crashed in step(): IsADirectoryError: tests" in bad.reward.info


def test_the_step_sampler_gives_the_failed_sample_advantage_zero():
    # rlvr.train.pg.rollout_source.sample_groups (what every rollout source runs): draw, score, advantages
    from types import SimpleNamespace

    from rlvr.config import load_config
    from rlvr.train.batching import BatchPlan
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.objective import Objective
    from rlvr.train.pg.rollout_source import sample_groups
    from rlvr.train.session import Timer

    cfg = load_config(TrainConfig, None, ["sampling.n_prompts=2", "sampling.group_size=4"])
    rewards = _rewards(1, 0, "err", 1, 0, "timeout", 1, 1)

    class Source:
        def draw(self, batch, spec):
            ros = [SimpleNamespace(response_ids=[1, 2], loss_mask=None, answer_tokens=None, group=g) for g in range(2) for _ in range(4)]
            return ros, [batch[ro.group] for ro in ros]

        def score(self, rollouts, examples):
            return rewards

    task = SimpleNamespace(train=list(range(10)), stop=(), keep_stop=True)
    plan = BatchPlan(8, 8, 8, 1, 1, 1, True)
    objective = Objective(cfg.algo, 4, 16, plan)
    sampled = sample_groups(Source(), task, cfg, objective, 1, 0, Timer())
    assert sampled.adv[:4].tolist() == pytest.approx([1 / S2, -S2, 0.0, 1 / S2], abs=1e-5)
    # a timeout is scored incorrect: [0, 0, 1, 1] -> [-1, -1, 1, 1]
    assert sampled.adv[4:].tolist() == pytest.approx([-1.0, -1.0, 1.0, 1.0], abs=1e-4)


def test_train_logs_the_unscored_samples_and_goes_on(tmp_path, capsys, arith3_task):
    # an end-to-end run: a reward that raises on every response to one of the two problems of a step (half:
    # not more than half, so the run goes on) -> reward/mean is over the scored rewards, verifier/errors counts
    # the failures, and samples.jsonl shows each failed sample with advantage 0
    from rlvr.config import load_config
    from rlvr.rewards import get_reward_fn
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import train
    from rlvr.train.tasks import TaskData

    arith = get_reward_fn("arithmetic")
    train_ex = list(arith3_task.train[:2])  # every step draws both problems
    bad = {train_ex[0].id}

    def reward(response, example):
        if example.id in bad:
            raise ValueError("reference has no unit")
        return arith(response, example)

    cfg = load_config(TrainConfig, None, [
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "sampling.n_prompts=2", "sampling.group_size=4", "sampling.max_tokens=4", "run.steps=2",
        "run.log_samples_every=1", "run.num_log_samples=2", "run.eval_every=0", "run.progress=false",
        "run.num_threads=1", f"run.out_dir={tmp_path / 'run'}"])
    data = TaskData("t", train_ex, arith3_task.eval[:2], arith3_task.prompt, reward, arith3_task.target)
    train(cfg, data=data)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["verifier/errors"] for r in rows] == [4, 4]
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    failed = [s for s in samples if s["status"] == "error"]
    assert len(failed) == 2 and all(s["advantage"] == 0.0 for s in failed)
    assert "reference has no unit" in capsys.readouterr().err
