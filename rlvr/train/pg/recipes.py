"""Named recipes: the literature's algorithm names mapped to explicit knob settings.

The same name means different knobs in different libraries (TRL's "grpo" defaults to no KL and
token-level aggregation today, verl's GRPO keeps a KL loss, ...). A recipe here sets every knob
that defines the algorithm explicitly, so `--recipe dr_grpo` says exactly what it does, and
`rlvr recipes` / docs/recipes.md print the table. Recipes are the `base` layer of the config: the
YAML file and command-line overrides still win.

Each recipe is a dict of dotted overrides of `TrainConfig` (see rlvr.train.config).
"""

from __future__ import annotations

from typing import Any

# Knobs every recipe sets, so that switching recipe never inherits a leftover from another one.
RECIPE_KEYS = (
    "algo.advantage",
    "algo.adv_std",
    "algo.loss",
    "algo.clip_low",
    "algo.clip_high",
    "algo.aggregation",
    "algo.kl_coef",
    "algo.kl_estimator",
    "algo.kl_in",
    "algo.epochs_per_rollout_batch",
    "algo.num_minibatches",
    "algo.filter_zero_variance",
    "algo.refill_rounds",
    "algo.length_reward",
    "algo.length_reward_coef",
    "algo.critic",
    "algo.whiten_advantages",
)

_BASE: dict[str, Any] = {
    "algo.adv_std": "population",
    "algo.clip_low": 0.2,
    "algo.clip_high": 0.2,
    "algo.kl_coef": 0.0,
    "algo.kl_estimator": "k3",
    "algo.kl_in": "loss",
    "algo.epochs_per_rollout_batch": 1,
    "algo.num_minibatches": 0,
    "algo.filter_zero_variance": False,
    "algo.refill_rounds": 0,
    "algo.length_reward": "",
    "algo.length_reward_coef": 0.0,
    "algo.critic": "",
    "algo.whiten_advantages": False,
}


def _recipe(**knobs: Any) -> dict[str, Any]:
    out = dict(_BASE)
    out.update({k.replace("__", "."): v for k, v in knobs.items()})
    return out


RECIPES: dict[str, dict[str, Any]] = {
    # Williams 1992: every token of a response gets the raw reward; the sum over tokens is the
    # sequence log-probability, so seq_mean_token_sum is the textbook estimator.
    "reinforce": _recipe(
        algo__advantage="no_baseline", algo__loss="no_baseline", algo__aggregation="seq_mean_token_sum"
    ),
    # Group-mean baseline, still the sequence-level estimator; its expectation is (1 - 1/G) grad J.
    "reinforce_with_baseline": _recipe(
        algo__advantage="group_mean",
        algo__loss="reinforce_with_baseline",
        algo__aggregation="seq_mean_token_sum",
    ),
    # DeepSeekMath GRPO as written in the paper: std-normalized group advantages, PPO clip 0.2,
    # per-response token mean, k3 KL to the reference inside the loss with beta = 0.04.
    "grpo": _recipe(
        algo__advantage="grpo",
        algo__loss="grpo_clip",
        algo__aggregation="seq_mean_token_mean",
        algo__kl_coef=0.04,
        algo__kl_estimator="k3",
    ),
    # Liu et al. 2025 (Dr. GRPO): drop the std division and the 1/|o_i| length normalization;
    # divide by a constant (algo.norm_length, default sampling.max_tokens) instead; no KL.
    "dr_grpo": _recipe(
        algo__advantage="group_mean", algo__loss="grpo_clip", algo__aggregation="seq_mean_token_sum_norm"
    ),
    # Ahmadian et al. 2024 (RLOO): leave-one-out baseline, whole response as one action (sum of
    # token log-probs), REINFORCE (no ratio): on-policy by construction.
    "rloo": _recipe(
        algo__advantage="rloo", algo__loss="reinforce_with_baseline", algo__aggregation="seq_mean_token_sum"
    ),
    # Yu et al. 2025 (DAPO): clip-higher (0.2 / 0.28), token-level loss, no KL, dynamic sampling
    # (groups with zero reward variance are dropped and replaced by newly sampled ones, up to 4
    # extra sampling rounds a step), soft overlong punishment over the last algo.overlong_buffer tokens.
    "dapo": _recipe(
        algo__advantage="grpo",
        algo__loss="grpo_clip",
        algo__clip_high=0.28,
        algo__aggregation="token_mean",
        algo__filter_zero_variance=True,
        algo__refill_rounds=4,
        algo__length_reward="dapo_overlong",
        algo__length_reward_coef=1.0,
    ),
    # Zheng et al. 2025 (GSPO): sequence-level ratio (geometric mean of token ratios), clipped
    # per sequence with the paper's tiny ranges 3e-4 / 4e-4, per-response mean, no KL.
    "gspo": _recipe(
        algo__advantage="grpo",
        algo__loss="gspo",
        algo__clip_low=3e-4,
        algo__clip_high=4e-4,
        algo__aggregation="seq_mean_token_mean",
    ),
    # Kimi k1.5 (sec. 2.3): squared-error surrogate of the KL-regularized objective with the group
    # mean as tau*log Z, plus the length reward. The rollout batch is consumed in 4 minibatch updates,
    # so from the second one on pi_old is the rollout policy and tau acts (with one update the ratio
    # is 1 and the loss is REINFORCE with a baseline). The length weight 0.1 is our choice (the report
    # gives none); Kimi's warm-up without the length term is algo.length_reward_warmup_steps.
    "kimi": _recipe(
        algo__advantage="group_mean",
        algo__loss="kimi",
        algo__aggregation="seq_mean_token_mean",
        algo__num_minibatches=4,
        algo__length_reward="kimi",
        algo__length_reward_coef=0.1,
    ),
    # MiniMax-M1 (Chen et al. 2025, CISPO): REINFORCE with a clipped, detached importance weight on each
    # token (no token loses its gradient, as grpo_clip's clipped tokens do), token-level mean over the
    # batch (the paper's 1 / sum_i |o_i|), no KL. No lower bound on the weight (the paper: epsilon_low
    # "large"); the upper bound 1 + 4 = 5 is TRL's / ms-swift's cap (epsilon_high=5), the paper gives none.
    "cispo": _recipe(
        algo__advantage="grpo",
        algo__loss="cispo",
        algo__clip_low=1.0,
        algo__clip_high=4.0,
        algo__aggregation="token_mean",
    ),
    # PPO for language models (Ouyang et al. 2022; the documents' PPO section): a value model (a copy
    # of the start policy with a scalar head), GAE with gamma 1 / lambda 0.95 against its values, the
    # outcome on the last token and a per-token k1 KL penalty to the reference in the reward, whitened
    # advantages, clipped surrogate and clipped value loss, 2 epochs x 2 minibatches per rollout batch.
    "ppo": _recipe(
        algo__advantage="gae",
        algo__critic="separate",
        algo__loss="grpo_clip",
        algo__aggregation="token_mean",
        algo__kl_coef=0.01,
        algo__kl_estimator="k1",
        algo__kl_in="reward",
        algo__whiten_advantages=True,
        algo__epochs_per_rollout_batch=2,
        algo__num_minibatches=2,
    ),
}

# What the same name means elsewhere (as of 2025 releases), for docs/recipes.md and `rlvr recipes`.
ELSEWHERE: dict[str, str] = {
    "reinforce": "TRL: none; verl: none (REINFORCE++ differs: batch whitening + token KL); OpenRLHF: none",
    "reinforce_with_baseline": "TRL: none; verl: none; OpenRLHF: reinforce_baseline (mean baseline, whitened)",
    "grpo": "TRL GRPOTrainer: beta=0 and loss_type dapo/bnpo by default; verl: grpo adv + KL loss (low_var_kl); "
    "OpenRLHF: group_norm + KL",
    "dr_grpo": "TRL: loss_type=dr_grpo, scale_rewards=False; verl: norm_adv_by_std_in_grpo=False + "
    "seq-mean-token-sum-norm; OpenRLHF: dr_grpo",
    "rloo": "TRL RLOOTrainer: LOO baseline with a clipped token loss; verl: rloo adv + token loss; "
    "OpenRLHF: rloo with PPO clip",
    "dapo": "TRL: loss_type=dapo (token mean, no dynamic sampling); verl: DAPO recipe (resamples to fill "
    "the batch); OpenRLHF: dynamic_filtering",
    "gspo": "TRL: importance_sampling_level=sequence; verl: policy_loss=gspo; OpenRLHF: none",
    "kimi": "TRL: none; verl: none; OpenRLHF: none",
    "cispo": "TRL: loss_type=cispo (weight clamped at epsilon_high, no lower bound); verl: policy_loss=cispo "
    "(clip_ratio_low / high, 0.2 by default); SkyRL: policy_loss_type=cispo; OpenRLHF: none",
    "ppo": "TRL: PPOTrainer (separate value model, KL in the reward); verl: adv_estimator=gae with a critic "
    "worker; OpenRLHF: PPO with a critic (default)",
}


def get_recipe(name: str) -> dict[str, Any]:
    """Dotted overrides of a recipe; an unknown name raises KeyError listing the known ones."""
    try:
        return dict(RECIPES[name])
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}") from None


def recipe_rows() -> list[tuple[str, ...]]:
    """One row per recipe: name, then the value of each RECIPE_KEYS knob (as text)."""
    return [(name, *(_fmt(r[k]) for k in RECIPE_KEYS)) for name, r in RECIPES.items()]


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v == "":
        return "-"
    return str(v)


def recipes_markdown() -> str:
    """The recipe table as markdown (docs/recipes.md embeds it)."""
    short = [k.split(".", 1)[1] for k in RECIPE_KEYS]
    lines = ["| recipe | " + " | ".join(short) + " |", "|---" * (len(short) + 1) + "|"]
    for row in recipe_rows():
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
