"""Pure tensor math for RLVR: tensors and floats in, tensors out (no models, no I/O, no configs).

Registries (name -> function, one signature each; an unknown name raises listing known names):
ADVANTAGE_ESTIMATORS, POLICY_LOSSES, LOSS_AGGREGATIONS, KL_ESTIMATORS, ROLLOUT_CORRECTIONS. See docs/algorithms.md.
Their built-in names are listed, torch-free, in rlvr.algo.names (each registry checks it agrees at import).

The names below are imported from their modules on first use (PEP 562), so that importing rlvr.algo.names
imports no torch: the config sections read it (tests/architecture/test_import_graph.py checks they import no torch).
"""

from __future__ import annotations

import importlib

# the module of rlvr.algo that defines each name
_MODULES: dict[str, tuple[str, ...]] = {
    "advantages": (
        "ADVANTAGE_ESTIMATORS", "batch_std", "compute_advantages", "gae", "group_mean", "grpo", "no_baseline",
        "process_supervision_advantages", "rloo",
    ),
    "aggregation": (
        "LOSS_AGGREGATIONS", "LossNormalizers", "aggregate_loss", "loss_normalizers", "seq_mean_token_mean",
        "seq_mean_token_sum", "seq_mean_token_sum_norm", "token_mean",
    ),
    "correction": (
        "ROLLOUT_CORRECTIONS", "RolloutCorrection", "rollout_correction", "seq_mask", "seq_tis", "token_mask",
        "token_tis",
    ),
    "kl": (
        "KL_ESTIMATORS", "k1", "k1_clamped", "k2", "k3", "kl_estimate", "kl_shaped_rewards", "last_valid_index",
    ),
    "length": (
        "dapo_overlong_penalty", "kimi_length_reward",
    ),
    "logprobs": (
        "IGNORE_INDEX", "TRUNCATED_LOGPROB", "TokenScores", "Truncation", "entropy_from_logits", "kept_mask",
        "logprobs_and_entropy", "token_logprobs_from_logits", "token_scores",
    ),
    "losses": (
        "POLICY_LOSSES", "cispo", "grpo_clip", "grpo_no_clip", "gspo", "high_entropy_mask", "kimi", "policy_loss",
        "reinforce", "value_loss",
    ),
    "masked": (
        "masked_count", "masked_mean", "masked_normalize", "masked_sum", "masked_var", "whiten",
    ),
    "registry": (
        "lookup",
    ),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
