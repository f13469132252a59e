"""Pure tensor math for RLVR: tensors and floats in, tensors out (no models, no I/O, no configs).

Registries (name -> function, one signature each; an unknown name raises listing known names):
ADVANTAGE_ESTIMATORS, POLICY_LOSSES, LOSS_AGGREGATIONS, KL_ESTIMATORS. See docs/algorithms.md.
"""

from rlvr.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    batch_std,
    compute_advantages,
    gae,
    group_mean,
    grpo,
    no_baseline,
    process_supervision_advantages,
    rloo,
)
from rlvr.algo.aggregation import (
    LOSS_AGGREGATIONS,
    LossNormalizers,
    aggregate_loss,
    loss_normalizers,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)
from rlvr.algo.kl import (
    KL_ESTIMATORS,
    k1,
    k1_clamped,
    k2,
    k3,
    kl_estimate,
    kl_shaped_rewards,
    last_valid_index,
)
from rlvr.algo.length import dapo_overlong_penalty, kimi_length_reward
from rlvr.algo.logprobs import (
    IGNORE_INDEX,
    entropy_from_logits,
    logprobs_and_entropy,
    token_logprobs_from_logits,
)
from rlvr.algo.losses import (
    POLICY_LOSSES,
    grpo_clip,
    grpo_no_clip,
    gspo,
    kimi,
    policy_loss,
    reinforce,
    value_loss,
)
from rlvr.algo.masked import masked_count, masked_mean, masked_normalize, masked_sum, masked_var, whiten
from rlvr.algo.registry import lookup

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "IGNORE_INDEX",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "LossNormalizers",
    "aggregate_loss",
    "batch_std",
    "compute_advantages",
    "dapo_overlong_penalty",
    "entropy_from_logits",
    "gae",
    "group_mean",
    "grpo",
    "grpo_clip",
    "grpo_no_clip",
    "gspo",
    "k1",
    "k1_clamped",
    "k2",
    "k3",
    "kimi",
    "kimi_length_reward",
    "kl_estimate",
    "kl_shaped_rewards",
    "last_valid_index",
    "logprobs_and_entropy",
    "lookup",
    "loss_normalizers",
    "masked_count",
    "masked_mean",
    "masked_normalize",
    "masked_sum",
    "masked_var",
    "no_baseline",
    "policy_loss",
    "process_supervision_advantages",
    "reinforce",
    "rloo",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "token_logprobs_from_logits",
    "token_mean",
    "value_loss",
    "whiten",
]
