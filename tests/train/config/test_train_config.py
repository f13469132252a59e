"""Trainer config: batch-size arithmetic, recipes, cross-field validation, lr schedule, data order."""

from __future__ import annotations

import math

import pytest
from helpers import REPO

from rlvr.config import ConfigError, load_config
from rlvr.train.batching import BatchConfigError, plan_batches, split_indices
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import validate_train_config
from rlvr.train.pg.recipes import RECIPE_KEYS, RECIPES, get_recipe, recipes_markdown
from rlvr.train.schedules import lr_multiplier
from rlvr.train.session import step_seed, take


def test_plan_batches_resolves_defaults_and_counts_steps():
    # 32 prompts x 8 = 256 rollouts; 2 epochs of minibatches of 64 = 2 * 256/64 = 8 optimizer steps;
    # 64/16 = 4 micro-batches accumulated per step.
    p = plan_batches(32, 8, train_batch_size=64, micro_batch_size=16, epochs=2)
    assert (p.rollout_batch, p.train_batch, p.micro_batch) == (256, 64, 16)
    assert p.optimizer_steps_per_rollout_batch == 8
    assert p.accumulation_steps == 4
    assert not p.on_policy
    whole = plan_batches(4, 2)  # 0 = whole batch: one optimizer step, on-policy
    assert (whole.train_batch, whole.micro_batch, whole.optimizer_steps_per_rollout_batch) == (8, 8, 1)
    assert whole.on_policy


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(train_batch_size=48), "algo.train_batch_size=48 does not divide the rollout batch"),
        (dict(train_batch_size=512), "larger than the rollout batch"),
        (dict(train_batch_size=64, micro_batch_size=24), "algo.micro_batch_size=24 does not divide"),
        (dict(train_batch_size=64, micro_batch_size=128), "larger than algo.train_batch_size=64"),
        (dict(epochs=0), "algo.epochs_per_rollout_batch must be >= 1"),
    ],
)
def test_plan_batches_errors_say_what_to_change(kwargs, needle):
    with pytest.raises(BatchConfigError) as exc:
        plan_batches(32, 8, **kwargs)
    assert needle in str(exc.value)


def test_divisor_suggestions_are_divisors():
    with pytest.raises(BatchConfigError) as exc:
        plan_batches(32, 8, train_batch_size=48)
    msg = str(exc.value)
    suggested = [int(x) for x in msg.split("use one of ")[1].split(" (")[0].split(", ")]
    assert suggested and all(256 % d == 0 for d in suggested)
    assert 64 in suggested  # the divisor nearest to 48 (|64-48| = 16 = |32-48|)


def test_split_indices():
    assert [list(r) for r in split_indices(5, 2)] == [[0, 1], [2, 3], [4]]


def test_every_recipe_sets_every_knob_and_loads():
    for name, rec in RECIPES.items():
        assert set(RECIPE_KEYS) <= set(rec), name
        cfg = load_config(TrainConfig, None, [], base=rec)
        validate_train_config(cfg)  # every named function exists in the rlvr.algo registries
    assert {"reinforce", "reinforce_with_baseline", "grpo", "dr_grpo", "rloo", "dapo", "gspo", "kimi"} <= set(RECIPES)


def test_recipe_knobs_match_the_papers():
    g, d, dr, gs = get_recipe("grpo"), get_recipe("dapo"), get_recipe("dr_grpo"), get_recipe("gspo")
    assert (g["algo.advantage"], g["algo.kl_coef"], g["algo.aggregation"]) == ("grpo", 0.04, "seq_mean_token_mean")
    assert (d["algo.clip_low"], d["algo.clip_high"], d["algo.aggregation"]) == (0.2, 0.28, "token_mean")
    assert d["algo.filter_zero_variance"] is True
    assert (dr["algo.advantage"], dr["algo.aggregation"]) == ("group_mean", "seq_mean_token_sum_norm")
    assert (gs["algo.loss"], gs["algo.clip_low"], gs["algo.clip_high"]) == ("gspo", 3e-4, 4e-4)


def test_unknown_recipe_lists_known():
    with pytest.raises(KeyError) as exc:
        get_recipe("grpo2")
    assert "dr_grpo" in str(exc.value) and "reinforce" in str(exc.value)


def test_recipes_markdown_has_one_row_per_recipe():
    lines = recipes_markdown().strip().splitlines()
    assert len(lines) == 2 + len(RECIPES)


def test_validation_names_the_key():
    # cross-field rules run when the config is loaded (TrainConfig.validate), so loading raises
    with pytest.raises(ValueError, match="algo.loss='ppo_typo' is unknown; known: .*'grpo_clip'"):
        validate_train_config(load_config(TrainConfig, None, ["algo.loss=ppo_typo"]))
    with pytest.raises(ValueError, match="sampling.group_size=1"):
        validate_train_config(load_config(TrainConfig, None, ["sampling.group_size=1"]))
    with pytest.raises(ConfigError, match="algo.lossy"):
        load_config(TrainConfig, None, ["algo.lossy=1"])
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config(TrainConfig, None, ["optim.lr=fast"])


def test_cross_field_rules_fail_at_config_load():
    # a rule that needs two keys (gae without a critic) fails when the config is loaded, before any model,
    # with the message validate_train_config gives; the YAML path names nothing wrong in the file itself
    with pytest.raises(ConfigError, match=r"algo.advantage='gae' needs a value model: set algo.critic"):
        load_config(TrainConfig, None, ["algo.advantage=gae"])
    with pytest.raises(ConfigError, match=r"algo.refill_rounds=2 refills the groups"):
        load_config(TrainConfig, None, ["algo.refill_rounds=2"])
    with pytest.raises(ConfigError, match=r"sampling.temperature=0.0: RL needs sampling"):
        load_config(TrainConfig, None, ["sampling.temperature=0"])
    with pytest.raises(BatchConfigError, match="algo.train_batch_size=6 does not divide the rollout batch"):
        load_config(TrainConfig, None, ["sampling.n_prompts=4", "sampling.group_size=4", "algo.train_batch_size=6"])
    # the same config built in Python: TrainConfig.validate() is the one home, validate_train_config its plan
    cfg = TrainConfig()
    cfg.algo.advantage = "gae"
    with pytest.raises(ConfigError, match="needs a value model"):
        cfg.validate()
    cfg.algo.critic = "shared"
    assert validate_train_config(cfg) == cfg.batch_plan() == plan_batches(32, 8)


def test_asynchronous_placement_rules_fail_before_the_model_loads():
    from rlvr.train.config import DistributedConfig, SamplingConfig

    # partial rollouts with a thinking budget, refill or sampling ahead: refused by TrainConfig.validate(),
    # at load for a YAML / override config and at the trainer's start for one built in Python
    with pytest.raises(ConfigError, match="distributed.segment_tokens does not combine with sampling.thinking_budget"):
        load_config(TrainConfig, None, ["distributed.segment_tokens=4", "sampling.thinking_budget=8"])
    with pytest.raises(ConfigError, match="distributed.segment_tokens does not combine with algo.refill_rounds"):
        load_config(TrainConfig, None, ["distributed.segment_tokens=4", "algo.filter_zero_variance=true",
                                        "algo.refill_rounds=1"])
    both = TrainConfig(distributed=DistributedConfig(placement="ray", segment_tokens=4, max_staleness=1))
    with pytest.raises(ConfigError, match=r"distributed.segment_tokens \(partial rollouts\) and "
                                          r"distributed.max_staleness \(sampling ahead\)"):
        both.validate()
    ahead = TrainConfig(sampling=SamplingConfig(thinking_budget=0),
                        distributed=DistributedConfig(placement="ray", max_staleness=1))
    with pytest.raises(ConfigError, match="distributed.max_staleness does not combine with sampling.thinking_budget"):
        validate_train_config(ahead)
    validate_train_config(TrainConfig(distributed=DistributedConfig(segment_tokens=4)))  # alone it is fine


def test_sft_and_ei_cross_field_rules_fail_at_config_load():
    from rlvr.train.config import EIConfig, SFTConfig
    from rlvr.train.ei import validate_ei_config
    from rlvr.train.sft import validate_sft_config

    with pytest.raises(BatchConfigError, match="algo.micro_batch_size=3 must divide algo.batch_size=4"):
        load_config(SFTConfig, None, ["algo.batch_size=4", "algo.micro_batch_size=3"])
    with pytest.raises(ConfigError, match="data.filter_band='medium' applies to rlvr train only"):
        load_config(EIConfig, None, ["data.filter_band=medium"])
    sft = SFTConfig()
    sft.algo.batch_size, sft.algo.micro_batch_size = 8, 2
    assert validate_sft_config(sft) == sft.batch_sizes() == (8, 2)
    sft.algo.aggregation = "nope"
    with pytest.raises(ConfigError, match="algo.aggregation='nope' is unknown; known: 'seq_mean_token_mean'"):
        sft.validate()
    ei = EIConfig()
    ei.data.curriculum = "pass_rate"
    with pytest.raises(ConfigError, match="data.curriculum='pass_rate' applies to rlvr train only"):
        validate_ei_config(ei)


def test_length_reward_names_match_the_objective():
    from rlvr.algo.names import LENGTH_REWARD_NAMES
    from rlvr.train.pg.objective import LENGTH_REWARDS

    assert sorted(LENGTH_REWARD_NAMES) == sorted(LENGTH_REWARDS)


def test_lr_schedule_values():
    # warmup 4: steps 0..3 get 1/4, 2/4, 3/4, 4/4.
    kw = dict(warmup_steps=4, total_steps=14, min_lr_ratio=0.0)
    assert [lr_multiplier(s, schedule="constant", **kw) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    # After warmup: progress = (s - 4) / (14 - 1 - 4) = (s - 4) / 9; linear = 1 - progress.
    assert lr_multiplier(13, schedule="linear", **kw) == pytest.approx(0.0)
    assert lr_multiplier(8, schedule="linear", **kw) == pytest.approx(1 - 4 / 9)
    # cosine at progress 1/2 (s = 8.5 -> use min_lr_ratio 0.1 at the end instead): 0.1 + 0.9 * 0.5 * (1 + cos(pi))
    assert lr_multiplier(13, schedule="cosine", warmup_steps=4, total_steps=14, min_lr_ratio=0.1) == pytest.approx(0.1)
    mid = lr_multiplier(7, schedule="cosine", warmup_steps=4, total_steps=14, min_lr_ratio=0.0)
    assert mid == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 9)))
    with pytest.raises(KeyError, match="known: constant, cosine, linear"):
        lr_multiplier(0, schedule="exp", **kw)


def test_data_stream_is_a_pure_function_of_position():
    items = list(range(10))
    a = take(items, 0, 25, seed=3)
    # each pass of 10 is a permutation; positions 7..12 straddle epochs 0 and 1
    assert sorted(a[:10]) == items and sorted(a[10:20]) == items
    assert take(items, 7, 6, seed=3) == a[7:13]
    assert take(items, 0, 10, seed=4) != a[:10]
    assert step_seed(0, 1) != step_seed(0, 2) and step_seed(0, 5) == step_seed(0, 5)


def test_docs_recipe_table_is_current():

    doc = (REPO / "docs" / "recipes.md").read_text()
    assert recipes_markdown() in doc  # regenerate docs/recipes.md's table when RECIPES changes


def test_docs_config_tables_are_current():

    from rlvr.config import config_markdown
    from rlvr.train.config import EvalConfig, SFTConfig
    from rlvr.train.demo import DemoConfig

    doc = (REPO / "docs" / "training.md").read_text()
    for cls in (TrainConfig, SFTConfig, EvalConfig, DemoConfig):
        assert config_markdown(cls) in doc, cls.__name__  # regenerate the tables in docs/training.md
