"""Rollouts -> right-padded training batch (the trainer's entry point to rlvr.models.tokenize)."""

from __future__ import annotations

from collections.abc import Sequence

from rlvr.models.tokenize import TrainingBatch, build_training_batch
from rlvr.rollout.types import Rollout


def rollouts_to_batch(rollouts: Sequence[Rollout], pad_token_id: int) -> TrainingBatch:
    """Stack rollouts (prompt_ids + response_ids) into a TrainingBatch: input_ids, labels,
    response_mask (False on forced, non-sampled tokens), attention_mask and, when every rollout
    has them, the sampler logprobs aligned with the labels. All (B, T-1)."""
    have_lps = all(r.logprobs is not None for r in rollouts)
    return build_training_batch(
        [r.prompt_ids for r in rollouts],
        [r.response_ids for r in rollouts],
        pad_token_id,
        loss_masks=[
            r.loss_mask if r.loss_mask is not None else [True] * len(r.response_ids) for r in rollouts
        ],
        sampler_logprobs=[r.logprobs for r in rollouts] if have_lps else None,
    )
