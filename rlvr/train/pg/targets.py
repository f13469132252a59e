"""What the loss regresses on, per trained row: the `Targets` record and the functions that make it from
the outcome advantages. `token_advantages`: (B,) advantages, or (B, T) with KL in the reward or whitening;
`gae_targets`: PPO's per-token advantages and value returns against the critic's rollout-time values;
rlvr.train.pg.process.process_targets: process supervision's per-step advantages. The objective
(rlvr.train.pg.objective.Objective.targets) picks one per run and passes them its TargetSettings, the
algo keys they read as plain values (an AlgoConfig has the same names, so one can stand in for it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rlvr.algo import gae, kl_estimate, kl_shaped_rewards, whiten


@dataclass(frozen=True)
class TargetSettings:
    """The algo keys the target functions read, resolved once from the config (TargetSettings.of):
    KL in the reward (kl_in, kl_estimator, kl_coef), whitening, GAE's gamma / lambda, and process
    supervision's normalization (adv_eps, adv_std), baseline and outcome weight."""

    kl_in: str
    kl_estimator: str
    kl_coef: float
    whiten_advantages: bool
    gamma: float
    gae_lambda: float
    adv_eps: float
    adv_std: str
    process_baseline: str
    process_outcome_coef: float

    @classmethod
    def of(cls, algo) -> TargetSettings:
        return cls(**{f.name: getattr(algo, f.name) for f in dataclasses.fields(cls)})


def kl_reward_to_go(kl: torch.Tensor, coef: float, mask: torch.Tensor) -> torch.Tensor:
    """Reward-to-go (gamma = 1) of the per-token KL penalty: out[b, t] = sum_{t' >= t, valid} -coef * kl[b, t'].

    kl (B, T) any KL_ESTIMATORS value (detached), mask (B, T) response tokens -> (B, T) float, 0 where
    mask == 0. The per-token rewards come from rlvr.algo.kl_shaped_rewards with zero outcome rewards:
    the outcome part of the return is the estimator's advantage, added by token_advantages.
    """
    r = kl_shaped_rewards(torch.zeros(kl.shape[0], device=kl.device), kl, coef, mask)  # (B, T), 0 off mask
    rtg = r.flip(-1).cumsum(-1).flip(-1)  # (B, T); prompt positions would hold the whole sum
    return torch.where(mask != 0, rtg, torch.zeros((), device=rtg.device))


def token_advantages(
    adv: torch.Tensor,
    mask: torch.Tensor,
    settings: TargetSettings,
    old_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """Final advantages of the rows that are trained: (B,) unchanged with the defaults, else (B, T).

    adv (B,) from the outcome estimator; mask (B, T) response tokens; old_logp, ref_logp (B, T),
    needed only with kl_in == "reward". Then A[b, t] = adv[b] + sum_{t' >= t} -kl_coef * kl[b, t']
    with kl = kl_estimator(old_logp, ref_logp) on the sampled tokens. With whiten_advantages
    the result is whitened over all valid tokens of the batch (rlvr.algo.whiten: population std,
    eps 1e-8 inside the sqrt); masked-out tokens get 0.
    """
    out = adv
    if settings.kl_in == "reward":
        if old_logp is None or ref_logp is None:
            raise ValueError("algo.kl_in='reward' needs old and reference logprobs")
        # on the mask's device (the CPU in the loop): logprobs may come from an accelerator
        kl = kl_estimate(settings.kl_estimator, old_logp.detach().to(mask.device), ref_logp.detach().to(mask.device))
        out = adv.unsqueeze(1) + kl_reward_to_go(kl, settings.kl_coef, mask)
        out = torch.where(mask != 0, out, torch.zeros((), device=out.device))
    if settings.whiten_advantages:
        out = whiten(torch.broadcast_to(out.unsqueeze(1), mask.shape) if out.dim() == 1 else out, mask)
    return out


@dataclass
class Targets:
    """What the loss regresses on, for the rows that are trained: advantages (B,) or (B, T); with a
    critic also the value targets returns (B, T) and the rollout-time values old_values (B, T)."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None


def gae_targets(outcome: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, settings: TargetSettings,
                old_logp: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None) -> Targets:
    """PPO's per-token targets. Rewards per token: the outcome (B,) on each response's last token,
    and with kl_in=reward and kl_coef > 0 a penalty -kl_coef * KL(old || ref) on every token;
    advantages by GAE (gamma, gae_lambda) against the rollout-time values (B, T); returns
    = advantages + values (before whitening); advantages whitened over valid tokens when
    whiten_advantages."""
    if settings.kl_in == "reward" and settings.kl_coef > 0:
        if old_logp is None or ref_logp is None:
            raise ValueError("algo.kl_in='reward' needs old and reference logprobs")
        kl = kl_estimate(settings.kl_estimator, old_logp.detach().to(mask.device), ref_logp.detach().to(mask.device))
    else:
        kl = torch.zeros(mask.shape)
    rewards = kl_shaped_rewards(outcome, kl, settings.kl_coef, mask)  # (B, T), outcome on the last token
    adv, returns = gae(rewards, values, mask, gamma=settings.gamma, lam=settings.gae_lambda)
    if settings.whiten_advantages:
        adv = whiten(adv, mask)
    return Targets(advantages=adv, returns=returns, old_values=values)
