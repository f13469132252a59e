"""The recipe book reached from the trainer config: PPO with a critic (GAE targets, value head,
checkpointed critic), kimi with several minibatch updates so tau acts, DAPO dynamic sampling with
refill, the length-reward warm-up. Unit checks against hand-computed numbers, then through train()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.training import TINY, spread_task

from rlvr.config import ConfigError, load_config
from rlvr.models import build_tiny_model, build_training_batch
from rlvr.rewards.types import Reward, Status
from rlvr.train.batching import ForwardSpec
from rlvr.train.config import AlgoConfig, TrainConfig
from rlvr.train.pg.critic import Critic
from rlvr.train.pg.loop import train, validate_train_config
from rlvr.train.pg.objective import (
    LossParts,
    Minibatch,
    accumulate_gradients,
    gae_targets,
    shape_and_advantage,
)
from rlvr.train.pg.recipes import get_recipe


def _cfg(tmp_path, *overrides, recipe=None) -> TrainConfig:
    # dapo's overlong window must fit in max_tokens=3; without dapo_overlong the key is refused as inert
    window = ["algo.overlong_buffer=2"] if recipe == "dapo" else []
    return load_config(TrainConfig, None, TINY + window + [f"run.out_dir={tmp_path / 'run'}", *overrides],
                       base=get_recipe(recipe) if recipe else None)


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------ PPO: GAE


def test_gae_targets_put_the_outcome_on_the_last_token_and_the_kl_on_every_token():
    # two responses of 3 and 2 tokens (row 1 right-padded); values V; outcome 1 and 0; k1 KL = old - ref
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float32)
    values = torch.tensor([[0.5, 0.25, 0.0], [0.1, 0.2, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -2.0, 0.0]])  # k1 = old - ref: [.5, 0, -.5], [0, 1]
    algo = AlgoConfig(advantage="gae", critic="shared", kl_coef=0.1, kl_estimator="k1", kl_in="reward",
                      gamma=1.0, gae_lambda=0.5)
    t = gae_targets(torch.tensor([1.0, 0.0]), mask, values, algo, old, ref)
    # rewards row 0: [-.05, 0, .05 + 1] ; row 1: [0, -.1]
    # deltas row 0: d2 = 1.05 - 0 = 1.05; d1 = 0 + .0 - .25 = -.25; d0 = -.05 + .25 - .5 = -.3
    # A2 = 1.05; A1 = -.25 + .5 * 1.05 = .275; A0 = -.3 + .5 * .275 = -.1625
    # row 1: d1 = -.1 - .2 = -.3; d0 = 0 + .2 - .1 = .1; A1 = -.3; A0 = .1 + .5 * -.3 = -.05
    want = torch.tensor([[-0.1625, 0.275, 1.05], [-0.05, -0.3, 0.0]])
    assert torch.allclose(t.advantages, want, atol=1e-6)
    assert torch.allclose(t.returns, want + values * mask, atol=1e-6)
    assert t.old_values is values
    # whitening then applies to the advantages only (returns stay the regression target)
    w = gae_targets(torch.tensor([1.0, 0.0]), mask, values, AlgoConfig(**{**algo.__dict__, "whiten_advantages": True}),
                    old, ref)
    valid = w.advantages[mask.bool()]
    assert abs(float(valid.mean())) < 1e-6 and abs(float(valid.std(unbiased=False)) - 1) < 1e-3
    assert torch.allclose(w.returns, t.returns)


def test_gae_advantage_passes_the_shaped_outcome_through():
    rewards = [Reward(1.0, status=Status.CORRECT), Reward(0.0), Reward(0.0), Reward(1.0, status=Status.CORRECT)]
    _, adv, keep, _ = shape_and_advantage(rewards, torch.tensor([2.0, 3.0, 1.0, 2.0]),
                                          AlgoConfig(advantage="gae", critic="separate"), 2, 4)
    assert adv.tolist() == [1.0, 0.0, 0.0, 1.0] and keep.all()


def _batch(tok, n=4):
    prompts = [tok("1+2=")["input_ids"], tok("3+4+5=")["input_ids"]] * (n // 2)
    responses = [tok("3")["input_ids"] + [tok.eos_token_id], tok("12")["input_ids"] + [tok.eos_token_id]] * (n // 2)
    return build_training_batch(prompts, responses, pad_token_id=tok.pad_token_id)


@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_critic_gradients_do_not_depend_on_the_micro_batch_split(mode):
    torch.manual_seed(0)
    algo = AlgoConfig(advantage="gae", critic=mode, loss="grpo_clip", aggregation="token_mean")
    grads = []
    for micro in (4, 1):
        model, tok = build_tiny_model(seed=3, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
        critic = Critic(model, mode=mode, lr=1e-3, grad_clip=1.0)
        with torch.no_grad():
            critic.head.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
        batch = _batch(tok)
        old_v = critic.values(model, batch, micro_batch_size=4)
        assert old_v.shape == batch.labels.shape
        assert torch.all(old_v[batch.attention_mask == 0] == 0)
        returns = torch.where(batch.response_mask.bool(), torch.tensor(1.0), torch.tensor(0.0))
        adv = torch.randn(batch.labels.shape, generator=torch.Generator().manual_seed(2)) * batch.response_mask
        accumulate_gradients(model, Minibatch(batch, adv, old_values=old_v, returns=returns), LossParts.from_algo(algo),
                             ForwardSpec.of(algo, micro), norm_length=0, critic=critic)
        g_policy = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        g_critic = torch.cat([p.grad.flatten() for p in critic.params if p.grad is not None])
        grads.append((g_policy, g_critic))
        assert float(g_critic.abs().sum()) > 0  # the value loss reaches the head
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-6)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-6)


def test_shared_critic_sends_the_value_loss_into_the_trunk_and_separate_does_not():
    """The policy's gradient with a critic minus the one without it: the value loss's share.
    Shared: non-zero (the head reads the policy's trunk); separate: exactly zero."""
    algo_pg = AlgoConfig(loss="grpo_clip", aggregation="token_mean")
    diffs = {}
    for mode in ("shared", "separate"):
        out = []
        for with_critic in (False, True):
            model, tok = build_tiny_model(seed=3, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
            batch = _batch(tok)
            adv = torch.ones(batch.labels.shape[0])
            kw, mb = {}, Minibatch(batch, adv)
            parts, fwd = LossParts.from_algo(algo_pg), ForwardSpec.of(algo_pg, 4)
            if with_critic:
                critic = Critic(model, mode=mode, lr=1e-3, grad_clip=1.0)
                with torch.no_grad():
                    critic.head.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
                parts = LossParts.from_algo(AlgoConfig(advantage="gae", critic=mode, loss="grpo_clip",
                                                       aggregation="token_mean", value_clip=0.0))
                kw = {"critic": critic}
                mb = Minibatch(batch, adv, old_values=critic.values(model, batch, 4),
                               returns=torch.full(batch.labels.shape, 2.0))
            accumulate_gradients(model, mb, parts, fwd, norm_length=0, **kw)
            out.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        diffs[mode] = float((out[1] - out[0]).abs().max())
    assert diffs["separate"] == 0.0
    assert diffs["shared"] > 1e-6


def test_ppo_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="algo.critic"):
        validate_train_config(_cfg(tmp_path, "algo.advantage=gae"))
    with pytest.raises(ConfigError, match="algo.critic"):
        validate_train_config(_cfg(tmp_path, "algo.critic=shared"))
    with pytest.raises(ConfigError, match="algo.num_minibatches"):
        validate_train_config(_cfg(tmp_path, "algo.num_minibatches=3", "sampling.n_prompts=4",
                                   "sampling.group_size=2"))
    with pytest.raises(ConfigError, match="algo.refill_rounds"):
        validate_train_config(_cfg(tmp_path, "algo.refill_rounds=2"))
    plan = validate_train_config(_cfg(tmp_path, recipe="ppo"))
    assert plan.optimizer_steps_per_rollout_batch == 4 and not plan.on_policy


# ------------------------------------------------------------------- a task with a reward spread


def test_dynamic_sampling_refills_the_batch_with_groups_that_have_a_spread(tmp_path):
    task = spread_task()
    cfg = _cfg(tmp_path, "sampling.n_prompts=4", "sampling.group_size=4", "run.steps=3", "algo.refill_rounds=8",
               recipe="dapo")
    rows = _rows(train(cfg, data=task).run_dir)
    for r in rows:
        # a full batch: n_prompts groups kept, none with equal rewards (only mixed problems can spread)
        assert r["dynamic/groups_kept"] == 4, r
        assert r["kept_frac"] == pytest.approx(4 / r["dynamic/groups_sampled"])
        assert r["dynamic/extra_samples"] == (r["dynamic/rounds"] - 1) * 16
        assert r["dynamic/rounds"] >= 3  # a third of the problems can spread: 4 such groups need >= 3 rounds
        assert r["dynamic/groups_dropped"] >= r["dynamic/groups_sampled"] - r["dynamic/groups_kept"] - 4


def test_dynamic_sampling_stops_at_its_budget(tmp_path):
    task = spread_task()
    calls = []
    cfg = _cfg(tmp_path, "sampling.n_prompts=4", "sampling.group_size=4", "run.steps=2", "algo.refill_rounds=1",
               recipe="dapo")

    def count(step, metrics):
        calls.append(metrics["dynamic/rounds"])

    rows = _rows(train(cfg, data=task, on_step=count).run_dir)
    assert calls == [2, 2]  # one round plus at most one refill, never more
    assert all(r["dynamic/groups_kept"] < 4 for r in rows)  # 8 problems drawn, at most 4 mixed: not full


def test_length_reward_warmup_turns_the_length_term_off_for_the_first_steps():
    rewards = [Reward(1.0, status=Status.CORRECT), Reward(0.0), Reward(1.0, status=Status.CORRECT), Reward(0.0)]
    lengths = torch.tensor([2.0, 8.0, 6.0, 4.0])
    algo = AlgoConfig(advantage="group_mean", length_reward="kimi", length_reward_coef=0.5,
                      length_reward_warmup_steps=3)
    shaped_warm, *_ = shape_and_advantage(rewards, lengths, algo, 4, 8, step=3)
    shaped_on, *_ = shape_and_advantage(rewards, lengths, algo, 4, 8, step=4)
    assert shaped_warm.tolist() == [1.0, 0.0, 1.0, 0.0]
    # kimi lambda = 0.5 - (len - 2) / (8 - 2): [.5, -.5, -1/6, 1/6]; wrong answers get min(0, lambda)
    want = [1 + 0.25, 0.5 * -0.5, 1 + 0.5 * (0.5 - 4 / 6), 0.0]
    assert shaped_on.tolist() == pytest.approx(want)


# --------------------------------------------------------------------------------- through train


def test_kimi_recipe_goes_off_policy_and_tau_changes_the_update(tmp_path):
    task = spread_task(n_always=0, n_never=0, n_mixed=8)
    finals = {}
    for tau in (0.5, 4.0):
        cfg = _cfg(tmp_path / f"t{tau}", "sampling.n_prompts=4", "sampling.group_size=4", "run.steps=2",
                   f"algo.kimi_tau={tau}", "optim.lr=1e-2", recipe="kimi")
        res = train(cfg, data=task)
        rows = _rows(res.run_dir)
        assert all(r["ratio/min"] < 1 - 1e-6 or r["ratio/max"] > 1 + 1e-6 for r in rows), rows
        model_dir = res.run_dir / "checkpoints" / "step_000002" / "model"
        from safetensors.torch import load_file

        finals[tau] = load_file(str(next(model_dir.glob("*.safetensors"))))
    diff = max(float((finals[0.5][k] - finals[4.0][k]).abs().max()) for k in finals[0.5])
    assert diff > 1e-5


def test_ppo_recipe_trains_checkpoints_its_critic_and_resumes_exactly(tmp_path):
    task = spread_task(n_always=2, n_never=2, n_mixed=4)
    common = ["sampling.n_prompts=4", "sampling.group_size=4", "optim.lr=1e-2", "run.checkpoint_every=2"]
    straight = train(_cfg(tmp_path / "a", *common, "run.steps=4", recipe="ppo"), data=task)
    rows = _rows(straight.run_dir)
    assert (straight.run_dir / "checkpoints" / "step_000004" / "critic.pt").exists()
    assert all("critic/value_loss" in r and "critic/explained_var" in r for r in rows)
    assert rows[-1]["critic/values"] != 0.0  # the head learned something from 0
    assert any(abs(r["ratio/max"] - 1) > 1e-6 for r in rows)  # 2 epochs x 2 minibatches: off-policy updates
    # stop at 2, resume to 4: identical metrics from step 3 on
    train(_cfg(tmp_path / "b", *common, "run.steps=2", recipe="ppo"), data=task)
    resumed = train(_cfg(tmp_path / "b", *common, "run.steps=4", recipe="ppo"), data=task, resume=True)
    got = _rows(resumed.run_dir)
    drop = ("time", "mem/", "tokens_per_s", "perf/")
    for a, b in zip(rows[2:], got[2:], strict=True):
        ka = {k: v for k, v in a.items() if not k.startswith(drop)}
        kb = {k: v for k, v in b.items() if not k.startswith(drop)}
        assert ka == kb
