"""Per-token policy losses (to be MINIMIZED), registered in ``POLICY_LOSSES`` with one signature:

    fn(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, tau=1.0)
        -> (per_token_loss, metadata)

    logp:       (B, T) log pi_theta(y_t | ...) of the sampled tokens, with gradient.
    old_logp:   (B, T) log pi_old of the same tokens (the policy that sampled them); always
                detached here. For on-policy single-step updates pass logp.detach().
    advantages: (B,) one per response (broadcast over tokens) or (B, T) per token; detached here.
    mask:       (B, T) 1 for response tokens that count, 0 for prompt and padding.
    clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high] (DAPO's
                "clip-higher" uses clip_high > clip_low, e.g. 0.2 / 0.28).
    dual_clip:  None or a constant c > 1: for negative advantages the loss is also capped at
                -c * A (Ye et al. 2020 "dual-clip PPO"), so a huge ratio on a bad token cannot
                produce an unbounded update.
    tau:        Kimi's KL temperature (only ``kimi`` uses it).
    per_token_loss: (B, T), exactly 0 where mask == 0 (whatever logp holds there).
    metadata:   dict of detached 0-d tensors: ratio_mean / ratio_min / ratio_max over valid tokens,
                clip_frac_low / clip_frac_high (fraction of valid tokens whose loss is the clipped
                branch at the lower / upper bound), clip_frac_dual.

The ratio is exp(logp - old_logp.detach()): at the start of an update it equals 1 in value but
its gradient is ratio * grad(logp) = grad(logp), so every ratio-based loss reduces to the policy
gradient there. The log-ratio is clamped to [-20, 20] before exp (as verl does) so a stale
old_logp cannot overflow; outside that range the gradient is 0.

Reduce the per-token loss with an aggregation from ``rlvr.algo.aggregation``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.algo.masked import masked_mean
from rlvr.algo.names import POLICY_LOSS_NAMES
from rlvr.algo.registry import check_names, lookup

LOG_RATIO_CLAMP = 20.0


def _prep(logp, old_logp, advantages, mask):
    if logp.dim() != 2:
        raise ValueError(f"logp must be (B, T), got {tuple(logp.shape)}")
    if old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask {tuple(mask.shape)} "
            "must have the same (B, T) shape"
        )
    adv = advantages.detach().to(logp.dtype)
    if adv.dim() == 1:
        if adv.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages (B,) has B={adv.shape[0]} but logp has B={logp.shape[0]}")
        adv = adv.unsqueeze(1)
    elif adv.dim() == 2 and adv.shape[1] == 1 and adv.shape[0] == logp.shape[0]:
        pass  # (B, 1), the CS336 convention
    elif adv.shape != logp.shape:
        raise ValueError(f"advantages must be (B,), (B, 1) or (B, T); got {tuple(adv.shape)}")
    adv = torch.broadcast_to(adv, logp.shape)
    valid = mask != 0
    return adv, valid


def _zero_invalid(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _ratio(logp: torch.Tensor, old_logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    log_ratio = _zero_invalid(logp - old_logp.detach(), valid)
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _ratio_stats(ratio: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    r = ratio.detach()
    any_valid = valid.any()  # a tensor: no host round trip (the trainer reads the statistics after its loop)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    inf = torch.full((), float("inf"), dtype=r.dtype, device=r.device)
    return {
        "ratio_mean": masked_mean(r, valid),
        "ratio_min": torch.where(any_valid, torch.where(valid, r, inf).amin(), zero),
        "ratio_max": torch.where(any_valid, torch.where(valid, r, -inf).amax(), zero),
    }


def _frac(flag: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return masked_mean(flag.float(), valid)


def _clipped_surrogate(ratio, adv, valid, clip_low, clip_high, dual_clip):
    """PPO clip with separate bounds and optional dual clip. Returns (loss (B, T), metadata)."""
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)  # = -min(ratio*A, clip(ratio)*A)
    r = ratio.detach()
    # The clipped branch is the one taken (and the gradient is 0) exactly in these two cases.
    low = (r < 1.0 - clip_low) & (adv < 0) & valid
    high = (r > 1.0 + clip_high) & (adv > 0) & valid
    dual = torch.zeros_like(valid)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        capped = torch.minimum(loss, -adv * dual_clip)
        loss = torch.where(adv < 0, capped, loss)
        dual = (adv < 0) & (r > dual_clip) & valid
    meta = {
        "clip_frac_low": _frac(low, valid),
        "clip_frac_high": _frac(high, valid),
        "clip_frac_dual": _frac(dual, valid),
    }
    return loss, meta


def _no_clip_meta(valid):
    z = torch.zeros((), device=valid.device)
    return {"clip_frac_low": z, "clip_frac_high": z, "clip_frac_dual": z}


def reinforce(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, tau=1.0):
    """-A * sg[ratio] * logp. With raw rewards as A this is ``no_baseline``; with centred A it is
    ``reinforce_with_baseline``: the two registry names differ only in what advantages you feed.

    On policy (old_logp = logp.detach()) sg[ratio] is exactly 1: the loss is -A * logp, the score-function
    estimator. Off policy (a second minibatch or epoch over the same rollouts) the tokens were sampled by
    pi_old, so the gradient -A * ratio * grad(logp) is importance-weighted, as the ratio-based losses of
    verl and TRL are (no clip: for a trust region use grpo_clip). The value stays -A * logp there too."""
    adv, valid = _prep(logp, old_logp, advantages, mask)
    ratio = _ratio(logp, old_logp, valid)
    loss = _zero_invalid(-adv * ratio.detach() * logp, valid)
    return loss, {**_ratio_stats(ratio, valid), **_no_clip_meta(valid)}


def grpo_clip(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, tau=1.0):
    """-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A), optional dual clip."""
    adv, valid = _prep(logp, old_logp, advantages, mask)
    ratio = _ratio(logp, old_logp, valid)
    loss, meta = _clipped_surrogate(ratio, adv, valid, clip_low, clip_high, dual_clip)
    return _zero_invalid(loss, valid), {**_ratio_stats(ratio, valid), **meta}


def grpo_no_clip(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, tau=1.0):
    """-ratio * A: the importance-weighted policy gradient with no trust region."""
    adv, valid = _prep(logp, old_logp, advantages, mask)
    ratio = _ratio(logp, old_logp, valid)
    return _zero_invalid(-adv * ratio, valid), {**_ratio_stats(ratio, valid), **_no_clip_meta(valid)}


def gspo(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, tau=1.0):
    """GSPO (Zheng et al. 2025): sequence-level ratio, clipped per sequence, GSPO-token form.

    s_i = exp(mean over valid t of (logp_t - old_logp_t)), the geometric mean of token ratios.
    Per token we use s_{i,t} = sg[s_i] * exp(logp_t - sg[logp_t]) (the paper's GSPO-token): its
    value is s_i on every token of response i, its gradient is s_i * grad(logp_t). The loss is
    -min(s_{i,t} A_{i,t}, clip(s_{i,t}, 1 - clip_low, 1 + clip_high) A_{i,t}); with one advantage
    per response and ``seq_mean_token_mean`` aggregation this is exactly the GSPO objective.
    Note: the paper's clip ranges are tiny (3e-4 / 4e-4), because a sequence-level ratio moves much
    less than token ratios; the defaults here are the PPO ones, so set them explicitly.
    Metadata ratio_* are the sequence ratios seen at token level.
    """
    adv, valid = _prep(logp, old_logp, advantages, mask)
    log_ratio = _zero_invalid(logp - old_logp.detach(), valid)
    seq_log_ratio = masked_mean(log_ratio, valid, dim=-1).detach()  # (B,)
    tok_log = seq_log_ratio.unsqueeze(1) + logp - logp.detach()
    ratio = torch.exp(_zero_invalid(tok_log, valid).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss, meta = _clipped_surrogate(ratio, adv, valid, clip_low, clip_high, dual_clip)
    return _zero_invalid(loss, valid), {**_ratio_stats(ratio, valid), **meta}


def kimi(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, tau=1.0):
    """Kimi k1.5 (sec. 2.3.2) squared-error surrogate, per response i:

        L_i = (A_i - tau * log(pi(y_i) / pi_old(y_i)))^2 / (2 * tau)

    with A_i = r_i - tau * log Z_hat; Kimi estimates tau*log Z by the mean reward of the group, so
    pass the ``group_mean`` advantages (r_i - mean_group(r)). log(pi/pi_old) of a whole response is
    the SUM of its token log-ratios over valid tokens. The 1/(2 tau) factor is ours: it makes
    grad L_i = -(A_i - tau * log ratio_i) * grad log pi(y_i) = -A_i grad log pi + (tau/2) grad
    (log ratio_i)^2, which is the (negated) gradient Kimi writes in eq. (3); at ratio 1 it is the
    REINFORCE-with-baseline gradient -A_i * sum_t grad logp_t.
    Per token we put L_i on every valid token of response i, so ``seq_mean_token_mean`` gives
    mean_i L_i (the paper's 1/k sum). Needs one advantage per response ((B,) or (B, 1)).
    """
    if tau <= 0:
        raise ValueError(f"kimi: tau must be > 0, got {tau}")
    if advantages.dim() == 2 and advantages.shape[1] != 1:
        raise ValueError("kimi needs one advantage per response: (B,) or (B, 1), not (B, T)")
    adv, valid = _prep(logp, old_logp, advantages, mask)
    log_ratio = _zero_invalid(logp - old_logp.detach(), valid)
    seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True)  # (B, 1), differentiable
    per_seq = (adv[:, :1] - tau * seq_log_ratio) ** 2 / (2.0 * tau)  # (B, 1)
    loss = _zero_invalid(torch.broadcast_to(per_seq, logp.shape), valid)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return loss, {**_ratio_stats(ratio, valid), **_no_clip_meta(valid)}


def cispo(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, tau=1.0):
    """CISPO (MiniMax-M1, Chen et al. 2025, eq. 4-5): -sg[clip(ratio, 1 - clip_low, 1 + clip_high)] * A * logp.

    The importance weight is clipped and detached; the gradient flows through logp only, so a token
    whose ratio left the range keeps its gradient, with the clipped weight (grpo_clip gives it 0).
    Value -w A logp, gradient -w A grad(logp), w = the clipped ratio; on policy w = 1 and the loss is
    REINFORCE (-A logp). MiniMax sets no lower bound (clip_low >= 1: the weight is only capped) and
    tunes clip_high alone; the ``cispo`` recipe uses clip_low=1, clip_high=4 (weight at most 5, the cap
    of TRL's / ms-swift's epsilon_high=5). dual_clip and tau are ignored. clip_frac_low / clip_frac_high:
    share of valid tokens whose weight was clipped at the lower / upper bound, whatever the sign of A
    (they still carry a gradient here).
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    adv, valid = _prep(logp, old_logp, advantages, mask)
    ratio = _ratio(logp, old_logp, valid)
    r = ratio.detach()
    weight = r.clamp(min=1.0 - clip_low, max=1.0 + clip_high)
    loss = _zero_invalid(-weight * adv * logp, valid)
    meta = {
        "clip_frac_low": _frac((r < 1.0 - clip_low) & valid, valid),
        "clip_frac_high": _frac((r > 1.0 + clip_high) & valid, valid),
        "clip_frac_dual": torch.zeros((), device=valid.device),
    }
    return loss, {**_ratio_stats(ratio, valid), **meta}


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> tuple[torch.Tensor, float]:
    """The top-`quantile` share of valid tokens by entropy ("80/20": Wang et al. 2025; TRL's top_entropy_quantile).

    entropy, mask: (B, T); quantile q in (0, 1]. The threshold is the (1 - q) quantile of the entropies of the
    valid (mask != 0) tokens of the WHOLE tensor, linearly interpolated between order statistics (what
    torch.quantile and TRL compute: sorted values s_0 <= ... <= s_{n-1}, position (1 - q)(n - 1)); a token is
    kept when it is valid and its entropy is >= the threshold, so ties at the threshold are all kept and the
    kept share can exceed q. Pass the entropies of everything that shares one loss normalizer (a minibatch),
    not of one micro-batch: the mask must not depend on how the minibatch is split. q = 1 keeps every valid
    token. Returns (keep (B, T) bool, threshold as a float; 0.0 when there is no valid token).
    """
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    if entropy.shape != mask.shape or entropy.dim() != 2:
        raise ValueError(f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must both be (B, T)")
    valid = mask != 0
    ent = entropy.detach().double()
    values = ent[valid].sort().values
    n = values.numel()
    if n == 0:
        return valid, 0.0
    if quantile == 1:
        return valid, float(values[0])
    pos = (1.0 - quantile) * (n - 1)
    if abs(pos - round(pos)) < 1e-9:  # 1 - 0.8 = 0.19999999999999996 in floats: snap to the order statistic
        pos = float(round(pos))
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    threshold = values[lo] + (values[hi] - values[lo]) * (pos - lo)
    return valid & (ent >= threshold), float(threshold)


PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "no_baseline": reinforce,
    "reinforce_with_baseline": reinforce,
    "grpo_clip": grpo_clip,
    "grpo_no_clip": grpo_no_clip,
    "gspo": gspo,
    "kimi": kimi,
    "cispo": cispo,
}
check_names(POLICY_LOSSES, POLICY_LOSS_NAMES, "POLICY_LOSSES")


def policy_loss(
    name: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **kw,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Look up ``name`` in POLICY_LOSSES and apply it; kw are the shared keyword arguments."""
    return lookup(POLICY_LOSSES, name, "policy loss")(logp, old_logp, advantages, mask, **kw)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO critic loss per token: 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = old + clip(V - old).

    values (B, T) with gradient; old_values, returns (B, T) detached here; mask (B, T).
    clip_range None -> plain 0.5 * (V - R)^2. Returns (per_token_loss (B, T), 0 where mask == 0,
    {"value_clip_frac": fraction of valid tokens where the clipped error is the larger one}).
    """
    if not (values.shape == old_values.shape == returns.shape == mask.shape):
        raise ValueError(
            f"value_loss: values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, returns "
            f"{tuple(returns.shape)}, mask {tuple(mask.shape)} must have the same shape"
        )
    valid = mask != 0
    ret = returns.detach()
    err = (values - ret) ** 2
    if clip_range is None:
        loss = 0.5 * err
        frac = torch.zeros((), device=values.device)
    else:
        if clip_range < 0:
            raise ValueError(f"clip_range must be >= 0, got {clip_range}")
        old = old_values.detach()
        v_clip = old + (values - old).clamp(-clip_range, clip_range)
        err_clip = (v_clip - ret) ** 2
        loss = 0.5 * torch.maximum(err, err_clip)
        frac = _frac(err_clip.detach() > err.detach(), valid)
    return _zero_invalid(loss, valid), {"value_clip_frac": frac}


__all__ = [
    "POLICY_LOSSES",
    "cispo",
    "gspo",
    "grpo_clip",
    "grpo_no_clip",
    "high_entropy_mask",
    "kimi",
    "policy_loss",
    "reinforce",
    "value_loss",
]
