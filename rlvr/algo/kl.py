"""Per-token estimators of the divergence to a reference policy, registered in ``KL_ESTIMATORS``.

    fn(logp, ref_logp) -> (B, T)   (any equal shapes; same shape out)

with logp = log pi_theta(y_t) and ref_logp = log pi_ref(y_t) of tokens SAMPLED from pi_theta
(or pi_old). With d = logp - ref_logp, these are Schulman's estimators of KL(pi_theta || pi_ref):

    k1 = d                          unbiased, high variance, can be negative per token
    k2 = 0.5 * d^2                  biased, low variance, >= 0
    k3 = exp(-d) + d - 1            unbiased ("low variance"), >= 0 (GRPO's choice)
    k1_clamped = max(d, 0)          NOT a KL estimator (see its docstring)

Use them inside the loss (gradient flows through logp; ref_logp is detached) or as per-token
reward shaping with ``kl_shaped_rewards`` (then detach first). An unbiased VALUE is not an unbiased
GRADIENT: in the loss, E_{y~pi}[grad k2] = grad KL(pi || ref), E[grad k3] = grad KL(ref || pi) (the
reverse KL) and E[grad k1] = 0 (the trainer refuses k1 in the loss); in the reward, E[k1 grad log pi]
= grad KL(pi || ref). docs/algorithms.md section 4 has the table and an exact enumeration.
d is clamped to [-20, 20] in k3 before exp (verl clamps similarly) so a far-off reference cannot
overflow; outside that range k3 is linear-ish and its gradient saturates.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.algo.names import KL_ESTIMATOR_NAMES
from rlvr.algo.registry import check_names, lookup

KL_CLAMP = 20.0


def _d(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} must match")
    return logp - ref_logp.detach()


def k1(logp, ref_logp):
    """logp - ref_logp."""
    return _d(logp, ref_logp)


def k2(logp, ref_logp):
    """0.5 * (logp - ref_logp)^2."""
    return 0.5 * _d(logp, ref_logp) ** 2


def k3(logp, ref_logp):
    """exp(ref - logp) - (ref - logp) - 1 >= 0 (DeepSeekMath / GRPO's KL term)."""
    neg = (-_d(logp, ref_logp)).clamp(-KL_CLAMP, KL_CLAMP)  # ref - logp
    return torch.exp(neg) - neg - 1.0


def k1_clamped(logp, ref_logp):
    """max(logp - ref_logp, 0).

    This is NOT a KL divergence nor an unbiased estimator of one: it drops every token where the
    policy is less likely than the reference, so its expectation overestimates KL. It reproduces
    AlpacaFarm PPO's ``_shape_reward`` (a reward-shaping penalty), nothing more.
    """
    return _d(logp, ref_logp).clamp_min(0.0)


KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: dict[str, KLFn] = {"k1": k1, "k2": k2, "k3": k3, "k1_clamped": k1_clamped}
check_names(KL_ESTIMATORS, KL_ESTIMATOR_NAMES, "KL_ESTIMATORS")


def kl_estimate(name: str, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Look up ``name`` in KL_ESTIMATORS and apply it."""
    return lookup(KL_ESTIMATORS, name, "KL estimator")(logp, ref_logp)


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) mask -> (B,) int64 index of the last position with mask != 0 (-1 for an empty row).

    Works for left and right padding alike (unlike 'number of valid tokens minus one').
    """
    t = mask.shape[-1]
    pos = torch.arange(t, device=mask.device).expand_as(mask)
    return torch.where(mask != 0, pos, torch.full_like(pos, -1)).max(dim=-1).values


def kl_shaped_rewards(
    rewards: torch.Tensor, kl: torch.Tensor, coef: float, mask: torch.Tensor
) -> torch.Tensor:
    """Per-token rewards for PPO: -coef * kl on every valid token, plus the task reward.

    rewards: (B,) one terminal reward per response, added on its LAST valid token; or (B, T)
             per-token rewards, added where mask != 0.
    kl:      (B, T) per-token estimate (any of KL_ESTIMATORS); detached here.
    Returns (B, T) float, 0 where mask == 0. An empty row gets no reward at all (no token to hold it).
    """
    if kl.shape != mask.shape or kl.dim() != 2:
        raise ValueError(f"kl {tuple(kl.shape)} and mask {tuple(mask.shape)} must both be (B, T)")
    valid = mask != 0
    out = torch.where(valid, -coef * kl.detach().float(), torch.zeros((), device=kl.device))
    r = rewards.detach().float()
    if r.dim() == 1:
        if r.shape[0] != kl.shape[0]:
            raise ValueError(f"rewards (B,) has B={r.shape[0]} but kl has B={kl.shape[0]}")
        last = last_valid_index(mask)  # (B,)
        has = last >= 0
        idx = last.clamp_min(0).unsqueeze(1)
        add = torch.where(has, r, torch.zeros_like(r)).unsqueeze(1)
        out = out.scatter_add(1, idx, add)
    elif r.shape == kl.shape:
        out = out + torch.where(valid, r, torch.zeros((), device=r.device))
    else:
        raise ValueError(f"rewards must be (B,) or (B, T) = {tuple(kl.shape)}, got {tuple(r.shape)}")
    return out
