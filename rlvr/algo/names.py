"""The built-in names of the registries, torch-free: the config (rlvr.train.config) reads them here without
importing torch, and each registry checks at import that it holds exactly these (registry.check_names).

Two kinds. Open: a user may register more from Python before loading a config (docs/design.md, "Extension
points": a loss, an advantage), so the config checks a name against the live registry and reads these only
for its help. Closed: the config's rules name each member (k1 refused in the loss, norm_length read by one
aggregation, the cap and low bound of the corrections, the window of dapo_overlong), so a new member needs a
config change anyway; those are `Literal` field types, refused at load with the choices listed.
"""

from __future__ import annotations

from typing import Literal, get_args

# open: rlvr.algo.ADVANTAGE_ESTIMATORS and rlvr.algo.POLICY_LOSSES
ADVANTAGE_ESTIMATOR_NAMES = ("no_baseline", "zero", "group_mean", "grpo", "rloo", "batch_std")
POLICY_LOSS_NAMES = ("no_baseline", "reinforce_with_baseline", "grpo_clip", "grpo_no_clip", "gspo", "kimi", "cispo")

# closed: rlvr.algo.LOSS_AGGREGATIONS, KL_ESTIMATORS, ROLLOUT_CORRECTIONS and rlvr.train.pg.objective.LENGTH_REWARDS
# ('' = no length term)
LossAggregationName = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
KlEstimatorName = Literal["k1", "k2", "k3", "k1_clamped"]
RolloutCorrectionName = Literal["token_tis", "token_mask", "seq_tis", "seq_mask"]
LengthRewardName = Literal["", "kimi", "dapo_overlong"]

LOSS_AGGREGATION_NAMES: tuple[str, ...] = get_args(LossAggregationName)
KL_ESTIMATOR_NAMES: tuple[str, ...] = get_args(KlEstimatorName)
ROLLOUT_CORRECTION_NAMES: tuple[str, ...] = get_args(RolloutCorrectionName)
LENGTH_REWARD_NAMES: tuple[str, ...] = get_args(LengthRewardName)
