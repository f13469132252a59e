"""Keys accepted and inert are refused (issue 36 item 2, and item 5's greedy n > 1): a key of the algo, data or
judge section set to a non-default value that another key's value makes do nothing fails when the config loads,
naming both keys, all such problems at once; a default is never refused, every recipe still validates, and
the combinations that do something are accepted. The key-to-consumer tables of rlvr.train.config are checked
against the loss and advantage functions themselves, so a loss that starts reading a key cannot stay refused."""

from __future__ import annotations

import pytest
import torch

from rlvr.config import ConfigError, load_config
from rlvr.train.config import EvalConfig, FilterConfig, TrainConfig
from rlvr.train.pg.loop import validate_train_config
from rlvr.train.pg.recipes import RECIPES, get_recipe

JUDGE = ["data.reward=judge", "judge.url=http://127.0.0.1:9/v1", "judge.model=m"]
LOCAL_JUDGE = ["data.reward=judge", "judge.model=tiny"]
ENV = ["data.env=calculator"]

# (overrides of `rlvr train`, the keys the refusal must name). Each row is a key set to a non-default value that
# does nothing under the other key's value (the consumer of each key: rlvr.train.pg.objective, rlvr.algo.losses,
# rlvr.algo.advantages, rlvr.algo.correction, rlvr.train.pg.reference, rlvr.envs.task, rlvr.train.pg.curriculum,
# rlvr.train.tasks, rlvr.train.judge).
INERT_TRAIN = [
    # the length term is multiplied by its coefficient (default 0), its window / warm-up need it on
    (["algo.length_reward=kimi"], ["algo.length_reward=", "algo.length_reward_coef"]),
    (["algo.length_reward=dapo_overlong"], ["algo.length_reward=", "algo.length_reward_coef"]),
    (["algo.length_reward_coef=0.5"], ["algo.length_reward_coef", "algo.length_reward "]),
    (["algo.overlong_buffer=2"], ["algo.overlong_buffer", "algo.length_reward=dapo_overlong"]),
    (["algo.length_reward=kimi", "algo.length_reward_coef=0.1", "algo.overlong_buffer=2"],
     ["algo.overlong_buffer", "algo.length_reward='kimi'"]),
    (["algo.length_reward_warmup_steps=3"], ["algo.length_reward_warmup_steps", "algo.length_reward="]),
    # clip keys with the losses that clip nothing; tau without the kimi loss
    *[([f"algo.loss={loss}", f"algo.{key}={value}"], [f"algo.{key}", f"algo.loss='{loss}'"])
      for loss in ("no_baseline", "reinforce_with_baseline", "grpo_no_clip", "kimi")
      for key, value in (("clip_low", 0.1), ("clip_high", 0.28), ("dual_clip", 3.0))],
    (["algo.kimi_tau=2"], ["algo.kimi_tau", "algo.loss='grpo_clip'"]),
    (["algo.loss=gspo", "algo.kimi_tau=0.5"], ["algo.kimi_tau", "algo.loss='gspo'"]),
    # the KL term: k1_clamped descends no divergence in the loss; the estimator and refresh need kl_coef > 0
    (["algo.kl_coef=0.1", "algo.kl_estimator=k1_clamped"], ["algo.kl_estimator='k1_clamped'", "algo.kl_in=loss"]),
    (["algo.kl_estimator=k2"], ["algo.kl_estimator='k2'", "algo.kl_coef=0"]),
    (["algo.ref_refresh_every=2"], ["algo.ref_refresh_every", "algo.kl_coef=0"]),
    (["algo.norm_length=64"], ["algo.norm_length", "algo.aggregation"]),
    # the std keys of the dividing advantages; the critic's keys without gae
    *[([f"algo.advantage={adv}", "algo.adv_std=sample"], ["algo.adv_std", f"algo.advantage='{adv}'"])
      for adv in ("no_baseline", "zero", "group_mean", "rloo")],
    (["algo.advantage=group_mean", "algo.adv_eps=1e-4"], ["algo.adv_eps", "algo.advantage='group_mean'"]),
    (["--recipe=ppo", "algo.adv_std=sample"], ["algo.adv_std", "algo.advantage='gae'"]),
    *[([f"algo.{key}={value}"], [f"algo.{key}", "algo.advantage='grpo'"])
      for key, value in (("gamma", 0.99), ("gae_lambda", 1.0), ("value_coef", 1.0), ("value_clip", 0.0),
                         ("critic_lr", 1e-5))],
    # the rollout correction's cap with no correction (auto = none on hf), its low bound without a mask
    (["algo.rollout_correction_cap=3"], ["algo.rollout_correction_cap", "algo.rollout_correction='auto'",
                                         "rollout.backend=hf"]),
    (["algo.rollout_correction=none", "algo.rollout_correction_cap=3"],
     ["algo.rollout_correction_cap", "algo.rollout_correction='none'"]),
    (["algo.rollout_correction=token_tis", "algo.rollout_correction_low=0.5"],
     ["algo.rollout_correction_low", "algo.rollout_correction='token_tis'"]),
    # data keys an environment does not read
    *[([*ENV, override], [f"data.{override.split('=')[0].split('.')[1]}", "data.env='calculator'"])
      for override in ("data.thinking_mode=think", "data.template=question_only", "data.reward=language",
                       "data.reward_timeout_s=5", "data.reward_isolate=true", "data.verifier_tolerance=lenient",
                       "data.task=gsm8k", "data.question_key=problem", "data.answer_key=solution",
                       "data.operands=3")],
    (["data.env=code_repair", "data.digits=2"], ["data.digits", "data.env='code_repair'"]),
    # environment keys without an environment
    *[([override], [f"data.{override.split('=')[0].split('.')[1]}", "data.env"])
      for override in ("data.env_max_turns=6", "data.env_max_tokens=128", "data.env_integrity=report",
                       "data.env_chat=plain")],
    # column names without rows to read, an HF split without the dataset
    (["data.question_key=problem"], ["data.question_key", "data.train_path"]),
    (["data.answer_key=solution"], ["data.answer_key", "data.hf_dataset"]),
    (["data.hf_split=test"], ["data.hf_split", "data.hf_dataset"]),
    # the pass-rate refresh's size without a refresh; the curriculum's floor without the curriculum
    (["data.filter_k=4"], ["data.filter_k", "data.filter_every"]),
    (["data.filter_pool=10"], ["data.filter_pool", "data.filter_every"]),
    (["data.filter_band=medium", "data.filter_k=4"], ["data.filter_k", "data.filter_every"]),
    (["data.curriculum_floor=0.1"], ["data.curriculum_floor", "data.curriculum"]),
    # judge keys without the judge reward; an HTTP judge's keys with a local one, and the reverse
    (["judge.url=http://127.0.0.1:9/v1"], ["judge.url", "data.reward="]),
    (["judge.fallback=incorrect"], ["judge.fallback", "data.reward="]),
    (["data.reward=r1_zero", "judge.model=tiny"], ["judge.model", "data.reward='r1_zero'"]),
    (["judge.max_tokens=64"], ["judge.max_tokens", "data.reward="]),
    ([*JUDGE, "judge.batch_size=8"], ["judge.batch_size", "judge.url="]),
    ([*JUDGE, "judge.device=cpu"], ["judge.device", "judge.url="]),
    ([*LOCAL_JUDGE, "judge.timeout_s=5"], ["judge.timeout_s", "judge.url"]),
    ([*LOCAL_JUDGE, "judge.concurrency=2"], ["judge.concurrency", "judge.url"]),
    ([*LOCAL_JUDGE, "judge.api_key_env=KEY"], ["judge.api_key_env", "judge.url"]),
]


def _load(cls, overrides):
    recipe = next((o.split("=", 1)[1] for o in overrides if o.startswith("--recipe=")), None)
    rest = [o for o in overrides if not o.startswith("--recipe=")]
    return load_config(cls, None, rest, base=get_recipe(recipe) if recipe else None)


def _refused(cls, overrides) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        cfg = _load(cls, overrides)
        if cls is TrainConfig:
            validate_train_config(cfg)
    return exc.value


@pytest.mark.parametrize("overrides, names", INERT_TRAIN, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_an_inert_key_is_refused_naming_both_keys(overrides, names):
    err = _refused(TrainConfig, overrides)
    line = next((e for e in err.errors if names[0] in e), None)
    assert line is not None, f"no problem names {names[0]!r}: {err.errors}"
    for name in names:
        assert name in line, f"{name!r} not in {line!r}"
    assert "leave" in line or "set " in line or "use " in line, line  # says what to do


@pytest.mark.parametrize("cls, overrides, names", [
    # item 5: `rlvr eval sampling.n=8` without a temperature sampled 8 identical greedy answers
    (EvalConfig, ["sampling.n=8"], ["sampling.n=8", "sampling.temperature=0"]),
    (EvalConfig, ["sampling.n=2", "sampling.temperature=0"], ["sampling.n=2", "sampling.temperature=0"]),
    (EvalConfig, ["judge.url=http://127.0.0.1:9/v1"], ["judge.url", "data.reward="]),
    (EvalConfig, ["data.filter_k=4"], ["data.filter_k", "data.filter_every"]),
    # rlvr filter: k greedy samples of a problem are k copies of one answer
    (FilterConfig, ["sampling.temperature=0"], ["filter.k", "--k", "sampling.temperature=0"]),
    (FilterConfig, ["sampling.temperature=0", "filter.k=1", "filter.no_reasoning_k=4"],
     ["filter.no_reasoning_k", "sampling.temperature=0"]),
])
def test_the_other_commands_refuse_their_inert_pairs(cls, overrides, names):
    err = _refused(cls, overrides)
    line = next((e for e in err.errors if names[0] in e), None)
    assert line is not None, err.errors
    for name in names:
        assert name in line, f"{name!r} not in {line!r}"


def test_every_problem_is_reported_at_once():
    err = _refused(TrainConfig, ["algo.loss=reinforce_with_baseline", "algo.clip_high=0.28", "algo.kimi_tau=2",
                                 "algo.length_reward=kimi"])
    assert len(err.errors) == 3, err.errors
    err = _refused(TrainConfig, [*ENV, "data.thinking_mode=think", "data.template=question_only"])
    assert len(err.errors) == 2, err.errors


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_validates(name):
    cfg = load_config(TrainConfig, None, [], base=get_recipe(name))
    validate_train_config(cfg)


@pytest.mark.parametrize("overrides", [
    # a default spelled out is never refused, whatever the other keys
    ["algo.loss=reinforce_with_baseline", "algo.clip_low=0.2", "algo.clip_high=0.2", "algo.dual_clip=0",
     "algo.kimi_tau=1.0"],
    ["algo.advantage=group_mean", "algo.adv_std=population", "algo.adv_eps=1e-6", "algo.gamma=1.0",
     "algo.length_reward_coef=0", "algo.overlong_buffer=4", "algo.kl_estimator=k3", "algo.norm_length=0"],
    ["data.filter_k=8", "data.curriculum_floor=0.05", "data.env_max_turns=4", "data.hf_split=train",
     "judge.fallback=symbolic", "judge.timeout_s=30"],
    # and the combinations where the key acts
    ["algo.loss=grpo_clip", "algo.clip_high=0.28", "algo.dual_clip=3"],
    ["algo.loss=gspo", "algo.clip_low=3e-4", "algo.clip_high=4e-4", "algo.dual_clip=3"],
    ["algo.loss=cispo", "algo.clip_low=1", "algo.clip_high=4"],
    ["algo.loss=kimi", "algo.advantage=group_mean", "algo.kimi_tau=0.5"],
    ["algo.length_reward=kimi", "algo.length_reward_coef=0.1", "algo.length_reward_warmup_steps=3"],
    ["algo.length_reward=dapo_overlong", "algo.length_reward_coef=1", "algo.overlong_buffer=8"],
    ["algo.kl_coef=0.1", "algo.kl_estimator=k2", "algo.ref_refresh_every=5"],
    ["algo.kl_coef=0.1", "algo.kl_in=reward", "algo.kl_estimator=k1_clamped"],
    ["algo.aggregation=seq_mean_token_sum_norm", "algo.norm_length=64"],
    ["algo.advantage=batch_std", "algo.adv_std=sample", "algo.adv_eps=1e-4"],
    ["algo.advantage=process", "algo.adv_std=sample", "data.task=sum_steps", "data.num_eval=50"],
    ["algo.advantage=gae", "algo.critic=shared", "algo.gamma=0.99", "algo.gae_lambda=1", "algo.value_coef=1",
     "algo.value_clip=0", "algo.critic_lr=1e-5"],
    ["algo.rollout_correction=token_tis", "algo.rollout_correction_cap=3"],
    ["algo.rollout_correction=seq_mask", "algo.rollout_correction_cap=3", "algo.rollout_correction_low=0.5"],
    [*ENV, "data.digits=1", "data.env_max_turns=3", "data.env_chat=plain", "data.reward_workers=2"],
    ["data.filter_band=medium", "data.filter_every=5", "data.filter_k=4", "data.filter_pool=16"],
    ["data.curriculum=pass_rate", "data.curriculum_floor=0.1"],
    ["data.task=arithmetic", "data.thinking_mode=think"],
    [*JUDGE, "judge.timeout_s=5", "judge.concurrency=2", "judge.api_key_env=KEY", "judge.fallback=incorrect"],
    [*LOCAL_JUDGE, "judge.batch_size=8", "judge.device=cpu", "judge.max_tokens=32"],
])
def test_defaults_and_acting_combinations_are_accepted(overrides):
    validate_train_config(_load(TrainConfig, overrides))


def test_eval_and_filter_accept_sampled_and_single_greedy_answers():
    _load(EvalConfig, ["sampling.n=8", "sampling.temperature=1.0"])
    _load(EvalConfig, ["sampling.temperature=0"])
    _load(FilterConfig, ["sampling.temperature=0", "filter.k=1"])
    _load(FilterConfig, ["sampling.temperature=0.7", "filter.k=8", "filter.no_reasoning_k=4"])


def test_an_environment_ignores_the_hf_dataset_too():
    from rlvr.train.config import DataConfig

    problems = DataConfig(env="calculator", hf_dataset="some/data").inert_problems()
    assert any("data.hf_dataset" in p and "data.env='calculator'" in p for p in problems), problems


# ------------------------------------------------- the tables of rlvr.train.config against the functions


def _policy_loss(name, **kw):
    from rlvr.algo import POLICY_LOSSES

    torch.manual_seed(0)
    logp = torch.randn(4, 5) * 0.5 - 1.0
    # off policy: per-row ratios about 2.2, 2.7 (a negative advantage: the dual clip's case), 0.45 and 0.4
    old = logp + torch.tensor([[-0.8], [-1.0], [0.8], [0.9]]) + torch.randn(4, 5) * 0.1
    adv = torch.tensor([1.5, -1.0, 0.5, -2.0]).unsqueeze(1)  # one advantage per response (kimi needs that)
    mask = torch.ones(4, 5)
    logp = logp.clone().requires_grad_(True)
    loss, _ = POLICY_LOSSES[name](logp, old, adv, mask, **kw)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return torch.cat([loss.detach().flatten(), grad.flatten()])


def test_the_clip_and_tau_tables_match_the_losses():
    import rlvr.train.config.algo as config
    from rlvr.algo import POLICY_LOSSES

    for name in POLICY_LOSSES:
        base = _policy_loss(name)
        reads = {
            "clip": not torch.equal(base, _policy_loss(name, clip_low=0.05, clip_high=0.05)),
            "dual_clip": not torch.equal(base, _policy_loss(name, dual_clip=1.5)) if name != "cispo" else False,
            "tau": not torch.equal(base, _policy_loss(name, tau=3.0)),
        }
        assert reads["clip"] == (name in config.CLIPPING_LOSSES), name
        assert reads["dual_clip"] == (name in config.DUAL_CLIP_LOSSES), name
        assert reads["tau"] == (name == "kimi"), name


def test_the_std_advantage_table_matches_the_estimators():
    import rlvr.train.config.algo as config
    from rlvr.algo import ADVANTAGE_ESTIMATORS

    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.25])
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        base = fn(rewards, 4)
        reads = (not torch.equal(base, fn(rewards, 4, std="sample"))
                 or not torch.equal(base, fn(rewards, 4, eps=0.5)))
        assert reads == (name in config.STD_ADVANTAGES), name
    assert "process" in config.STD_ADVANTAGES and "gae" not in config.STD_ADVANTAGES


# ------------------------------------------------------------------------ as a user runs the commands


def _rlvr(*args: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / "rlvr"  # the console script pyproject.toml installs
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlvr.cli"]
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off"}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("args, names", [
    # issue 36 item 5: 8 greedy answers per problem and a flat pass@k, with no note
    (["eval", "sampling.n=8", "data.num_eval=2"], ["sampling.n=8", "sampling.temperature=0"]),
    # item 2: the length term without its weight trained as if it were not there
    (["train", "algo.length_reward=kimi", "run.steps=1"], ["algo.length_reward='kimi'", "algo.length_reward_coef=0"]),
])
def test_the_commands_refuse_before_any_model_loads(args, names, tmp_path):
    res = _rlvr(*args, f"run.{'out' if args[0] == 'eval' else 'out_dir'}={tmp_path / 'out'}")
    assert res.returncode == 2, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    assert not (tmp_path / "out").exists()  # nothing was written
