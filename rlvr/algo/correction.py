"""Sampler/trainer mismatch correction: importance weights for rollouts drawn by another sampler.

The rollouts are drawn from the sampler's distribution q (vLLM's kernels in bf16, or any engine
whose numbers differ from the trainer's), while the policy gradient is an expectation under the
trainer's pi (the policy version that sampled, `old_logp`). Per response token the log ratio is

    d_it = old_logp_it - sampler_logp_it          (trainer minus sampler, same weights, same token)

and E_{y~q}[(pi/q)(y) A(y) grad log pi(y)] = E_{y~pi}[A grad log pi]: weighting each token's policy
loss by pi/q removes the mismatch. The weight is truncated (capped) to bound its variance, or tokens
far from 1 are masked out of the loss instead. The modes, registered in ``ROLLOUT_CORRECTIONS`` with
one signature:

    fn(old_logp (B,T), sampler_logp (B,T), mask (B,T), *, cap=2.0, low=0.0) -> RolloutCorrection

    token_tis   w_it = min(exp(d_it), cap)                         TRL token_truncate, verl rollout_is=token
    token_mask  w_it = 1; a token with exp(d_it) outside [low, cap] leaves the loss
                                                                   TRL token_mask, verl rollout_rs=token
    seq_tis     w_it = min(exp(D_i), cap), D_i = sum_t d_it         TRL sequence_truncate, verl rollout_is=sequence
    seq_mask    w_it = 1; a response with exp(D_i) outside [low, cap] leaves the loss
                                                                   TRL sequence_mask, verl rollout_rs=sequence

The weight is detached (a constant of the step, like the advantage) and multiplies the per-token
policy loss. A label outside the trainer's truncated support (old_logp <= TRUNCATED_LOGPROB: the
trainer's top-k / top-p removed a token the sampler kept, rlvr.algo.logprobs) has ratio 0: weight 0
and it leaves the loss, and a response containing one has sequence ratio 0.

Top-p / top-k: the sampler's proposal is its truncated distribution q_K, so the ratio must be taken
against the trainer's truncated pi_K (rlvr.algo.logprobs.Truncation), not its full softmax pi:
log pi(y) - log pi_K(y) = log M, M = pi(K) the mass the kept set holds, so a full-softmax ratio is off
by the factor M on every token (docs/algorithms.md).

Only tensors in, tensors out; the trainer decides what "leaves the loss" means (rlvr.train.pg.objective).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlvr.algo.logprobs import TRUNCATED_LOGPROB
from rlvr.algo.losses import LOG_RATIO_CLAMP
from rlvr.algo.masked import masked_mean
from rlvr.algo.names import ROLLOUT_CORRECTION_NAMES
from rlvr.algo.registry import check_names, lookup


@dataclass
class RolloutCorrection:
    """What a correction mode gives the loss. weight (B, T) float32, detached: multiplies each token's
    policy loss (0 where keep is False). keep (B, T) bool: the response tokens that stay in the loss.
    stats: detached 0-d tensors over the units (valid tokens, or responses with a valid token):
    correction_ratio_mean / _min / _max (the ratio before truncation, exp of the log ratio clamped to
    +-20; 0 outside the trainer's support), correction_truncated (share whose weight was capped),
    correction_masked (share that left the loss), correction_units (how many units)."""

    weight: torch.Tensor
    keep: torch.Tensor
    stats: dict[str, torch.Tensor]


def _units(old_logp, sampler_logp, mask, sequence: bool):
    """(log ratio, inside the trainer's support, is a unit): per token (B, T), or per response (B,)."""
    if old_logp.shape != sampler_logp.shape or mask.shape != old_logp.shape or old_logp.dim() != 2:
        raise ValueError(f"old_logp {tuple(old_logp.shape)}, sampler_logp {tuple(sampler_logp.shape)} and mask "
                         f"{tuple(mask.shape)} must have the same (B, T) shape")
    valid = mask != 0
    old = old_logp.detach().float()
    d = torch.where(valid, old - sampler_logp.detach().float(), torch.zeros((), device=old.device))
    inside = (old > TRUNCATED_LOGPROB) | ~valid
    if not sequence:
        return d, inside, valid, valid
    return d.sum(-1), inside.all(-1), valid.any(-1), valid


def _correct(old_logp, sampler_logp, mask, *, cap: float, low: float, sequence: bool, truncate: bool):
    if not cap >= 1.0:
        raise ValueError(f"cap must be >= 1 (a ratio of 1 is never corrected), got {cap}")
    if not 0.0 <= low <= 1.0:
        raise ValueError(f"low must be in [0, 1], got {low}")
    lr, inside, unit, valid = _units(old_logp, sampler_logp, mask, sequence)
    log_cap = math.log(cap)
    zero = torch.zeros((), device=lr.device)
    ratio = torch.where(inside, lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp(), zero)
    if truncate:
        kept = inside
        weight = torch.where(inside, lr.clamp(max=log_cap).exp(), zero)  # min(exp(lr), cap), no overflow
        truncated = inside & (lr > log_cap)
    else:
        kept = inside & (lr <= log_cap) & (lr >= (math.log(low) if low > 0 else -math.inf))
        weight = kept.float()
        truncated = torch.zeros_like(kept)
    any_unit = unit.any()  # a tensor: no host round trip
    inf = torch.full((), math.inf, device=lr.device)
    stats = {
        "correction_ratio_mean": masked_mean(ratio, unit),
        "correction_ratio_min": torch.where(any_unit, torch.where(unit, ratio, inf).amin(), zero),
        "correction_ratio_max": torch.where(any_unit, torch.where(unit, ratio, -inf).amax(), zero),
        "correction_truncated": masked_mean(truncated.float(), unit),
        "correction_masked": masked_mean((~kept).float(), unit),
        "correction_units": unit.sum().float(),
    }
    if sequence:  # one weight per response, on each of its tokens
        weight, kept = weight.unsqueeze(1).expand_as(valid), kept.unsqueeze(1).expand_as(valid)
    return RolloutCorrection(weight=torch.where(valid, weight, zero).contiguous(), keep=(kept & valid).contiguous(),
                             stats=stats)


def token_tis(old_logp, sampler_logp, mask, *, cap: float = 2.0, low: float = 0.0) -> RolloutCorrection:
    """Truncated importance weight per token: w_it = min(exp(old_logp_it - sampler_logp_it), cap)."""
    return _correct(old_logp, sampler_logp, mask, cap=cap, low=low, sequence=False, truncate=True)


def token_mask(old_logp, sampler_logp, mask, *, cap: float = 2.0, low: float = 0.0) -> RolloutCorrection:
    """Weight 1; tokens whose ratio exp(old_logp - sampler_logp) is outside [low, cap] leave the loss."""
    return _correct(old_logp, sampler_logp, mask, cap=cap, low=low, sequence=False, truncate=False)


def seq_tis(old_logp, sampler_logp, mask, *, cap: float = 2.0, low: float = 0.0) -> RolloutCorrection:
    """Truncated sequence weight: every token of response i gets min(exp(sum_t (old - sampler)_it), cap)."""
    return _correct(old_logp, sampler_logp, mask, cap=cap, low=low, sequence=True, truncate=True)


def seq_mask(old_logp, sampler_logp, mask, *, cap: float = 2.0, low: float = 0.0) -> RolloutCorrection:
    """Weight 1; responses whose sequence ratio exp(sum_t (old - sampler)_it) is outside [low, cap] leave the loss."""
    return _correct(old_logp, sampler_logp, mask, cap=cap, low=low, sequence=True, truncate=False)


CorrectionFn = Callable[..., RolloutCorrection]

ROLLOUT_CORRECTIONS: dict[str, CorrectionFn] = {
    "token_tis": token_tis,
    "token_mask": token_mask,
    "seq_tis": seq_tis,
    "seq_mask": seq_mask,
}
check_names(ROLLOUT_CORRECTIONS, ROLLOUT_CORRECTION_NAMES, "ROLLOUT_CORRECTIONS")


def rollout_correction(name: str, old_logp, sampler_logp, mask, *, cap: float = 2.0,
                       low: float = 0.0) -> RolloutCorrection:
    """Look up `name` in ROLLOUT_CORRECTIONS and apply it."""
    return lookup(ROLLOUT_CORRECTIONS, name, "rollout correction")(old_logp, sampler_logp, mask, cap=cap, low=low)
