"""Advantage estimators.

Outcome estimators share ONE signature and live in ``ADVANTAGE_ESTIMATORS``:

    fn(rewards, group_size, *, eps=1e-6, std="population", valid=None) -> advantages

    rewards:    (N,) float, one scalar reward per response, N = num_prompts * group_size, the
                G responses of a prompt contiguous (rows [k*G, (k+1)*G) form group k).
    group_size: G >= 1 (estimators that need G >= 2 say so and raise otherwise).
    eps:        stabilizer added to a standard deviation before dividing (ignored by estimators
                that do not divide).
    std:        "population" (1/G, as in the DeepSeekMath formula and the seeds' worked numbers)
                or "sample" (1/(G-1), what torch.std and the CS336 assignment use).
    valid:      None, or (N,) bool: False marks an UNSCORED response (its checker failed: it raised, the
                judge was unreachable, the environment crashed; not a wrong answer, not a verifier
                timeout). An unscored response is left out of every statistic (its group's mean and std,
                the leave-one-out mean, the batch std) and gets advantage 0; each group's statistics are
                those of its scored responses (a group of G with one unscored has the advantages of the
                group of G - 1 without it). A group with fewer scored responses than the estimator needs
                (one for a mean, two for a leave-one-out or a sample std) gets 0.
    returns     (N,) float32 (float64 for float64 rewards), detached; all tokens of a response
                get the same advantage (broadcast it over tokens in the loss).

Also here: ``process_supervision_advantages`` (per-token advantages from step rewards) and
``gae`` (PPO with a critic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlvr.algo.names import ADVANTAGE_ESTIMATOR_NAMES
from rlvr.algo.registry import check_names, lookup

STD_KINDS = ("population", "sample")


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) -> (N // G, G) float, with clear errors."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    n = rewards.shape[0]
    if n % group_size != 0:
        raise ValueError(f"number of rewards {n} is not a multiple of group_size {group_size}")
    r = rewards.detach()
    if not r.is_floating_point() or r.dtype in (torch.float16, torch.bfloat16):
        r = r.float()
    return r.reshape(n // group_size, group_size)


def _std(x: torch.Tensor, dim: int, std: str) -> torch.Tensor:
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
    n = x.shape[dim]
    if std == "sample" and n < 2:
        raise ValueError("std='sample' needs at least 2 values per group (divides by G-1)")
    return x.std(dim=dim, keepdim=True, correction=1 if std == "sample" else 0)


def _valid_groups(valid: torch.Tensor | None, r: torch.Tensor) -> torch.Tensor | None:
    """valid (N,) bool -> (N // G, G) bool like r, or None when absent or all True (the unmasked formulas,
    bit for bit)."""
    if valid is None:
        return None
    v = torch.as_tensor(valid, dtype=torch.bool, device=r.device)
    if v.shape != (r.numel(),):
        raise ValueError(f"valid must be (N,) = ({r.numel()},) bool, got shape {tuple(v.shape)}")
    return None if bool(v.all()) else v.reshape(r.shape)


def _masked_stats(r: torch.Tensor, v: torch.Tensor, std: str, dims) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, std) of r over the True entries of v along dims (keepdim); std 0 where too few entries."""
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
    vf = v.to(r.dtype)
    n = vf.sum(dim=dims, keepdim=True)
    mean = (r * vf).sum(dim=dims, keepdim=True) / n.clamp_min(1)
    ddof = 1 if std == "sample" else 0
    var = (((r - mean) * vf) ** 2).sum(dim=dims, keepdim=True) / (n - ddof).clamp_min(1)
    return n, mean, torch.where(n > ddof, var.sqrt(), torch.zeros_like(var))


def no_baseline(rewards, group_size, *, eps=1e-6, std="population", valid=None):
    """A_i = r_i (vanilla REINFORCE; G may be 1)."""
    r = _groups(rewards, group_size)
    v = _valid_groups(valid, r)
    out = r if v is None else torch.where(v, r, torch.zeros_like(r))
    return out.reshape(-1).clone()


def zero(rewards, group_size, *, eps=1e-6, std="population", valid=None):
    """A_i = 0: no outcome signal. With a teacher (teacher.model, algo.kl_in=reward) the per-token reverse KL
    to the teacher is the whole signal: pure on-policy distillation (G may be 1)."""
    return torch.zeros_like(_groups(rewards, group_size)).reshape(-1)


def group_mean(rewards, group_size, *, eps=1e-6, std="population", valid=None):
    """A_i = r_i - mean_group(r). Dr. GRPO's advantage (no std division).

    Its expected gradient is (1 - 1/G) times the true gradient (the baseline includes r_i).
    """
    r = _groups(rewards, group_size)
    v = _valid_groups(valid, r)
    if v is None:
        return (r - r.mean(dim=1, keepdim=True)).reshape(-1)
    _, mean, _ = _masked_stats(r, v, "population", 1)
    return torch.where(v, r - mean, torch.zeros_like(r)).reshape(-1)


def grpo(rewards, group_size, *, eps=1e-6, std="population", valid=None):
    """A_i = (r_i - mean_group(r)) / (std_group(r) + eps). DeepSeekMath GRPO (outcome supervision).

    A group with identical rewards gets exactly 0 (numerator 0, denominator eps > 0).
    """
    r = _groups(rewards, group_size)
    v = _valid_groups(valid, r)
    if v is None:
        centered = r - r.mean(dim=1, keepdim=True)
        return (centered / (_std(r, 1, std) + eps)).reshape(-1)
    _, mean, sd = _masked_stats(r, v, std, 1)
    return torch.where(v, (r - mean) / (sd + eps), torch.zeros_like(r)).reshape(-1)


def rloo(rewards, group_size, *, eps=1e-6, std="population", valid=None):
    """A_i = r_i - mean_{j != i} r_j (REINFORCE leave-one-out; unbiased). Needs G >= 2.

    Equal to G/(G-1) * (r_i - mean_group(r)).
    """
    if group_size < 2:
        raise ValueError("rloo needs group_size >= 2 (the leave-one-out mean of one response is empty)")
    r = _groups(rewards, group_size)
    v = _valid_groups(valid, r)
    if v is None:
        loo_mean = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
        return (r - loo_mean).reshape(-1)
    n, mean, _ = _masked_stats(r, v, "population", 1)
    loo_mean = (mean * n - r) / (n - 1).clamp_min(1)
    return torch.where(v & (n > 1), r - loo_mean, torch.zeros_like(r)).reshape(-1)


def batch_std(rewards, group_size, *, eps=1e-6, std="population", valid=None):
    """A_i = (r_i - mean_group(r)) / (std_batch(r) + eps): group-mean centering, batch-level scale.

    std_batch is the standard deviation of the RAW rewards over all N responses of the batch
    (population or sample per ``std``), one number for the batch. This is the "group mean,
    batch std" normalization of Liu et al. 2025 ("Tricks or Traps", Lite PPO). REINFORCE++-baseline
    (OpenRLHF) instead whitens the centered rewards over the batch; with equal group sizes the
    centered rewards have mean 0, so that differs from ours only in using the std of the centered
    rewards rather than of the raw rewards. The point of both: a prompt whose group happens to have
    a small spread is not up-weighted, unlike GRPO's per-group std.
    """
    r = _groups(rewards, group_size)
    v = _valid_groups(valid, r)
    if v is not None:
        _, mean, _ = _masked_stats(r, v, "population", 1)
        _, _, s = _masked_stats(r, v, std, (0, 1))
        return torch.where(v, (r - mean) / (s + eps), torch.zeros_like(r)).reshape(-1)
    centered = r - r.mean(dim=1, keepdim=True)
    flat = r.reshape(-1)
    if std == "sample" and flat.numel() < 2:
        raise ValueError("std='sample' needs at least 2 rewards in the batch")
    s = _std(flat.unsqueeze(0), 1, std).reshape(())
    return (centered / (s + eps)).reshape(-1)


AdvantageFn = Callable[..., torch.Tensor]

ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "no_baseline": no_baseline,
    "zero": zero,
    "group_mean": group_mean,
    "grpo": grpo,
    "rloo": rloo,
    "batch_std": batch_std,
}
check_names(ADVANTAGE_ESTIMATORS, ADVANTAGE_ESTIMATOR_NAMES, "ADVANTAGE_ESTIMATORS")


def compute_advantages(
    name: str, rewards: torch.Tensor, group_size: int, *, eps: float = 1e-6, std: str = "population",
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Look up ``name`` in ADVANTAGE_ESTIMATORS and apply it. (N,) -> (N,). valid (N,) bool: False = an
    unscored response, out of every statistic, advantage 0 (module docstring)."""
    fn = lookup(ADVANTAGE_ESTIMATORS, name, "advantage estimator")
    if valid is None:  # an estimator registered without the keyword still works on fully scored batches
        return fn(rewards, group_size, eps=eps, std=std)
    return fn(rewards, group_size, eps=eps, std=std, valid=valid)


def process_supervision_advantages(
    step_rewards: Sequence[Sequence[float]],
    step_end_positions: Sequence[Sequence[int]],
    group_size: int,
    num_tokens: int,
    *,
    eps: float = 1e-6,
    std: str = "population",
) -> torch.Tensor:
    """Per-token advantages from per-step rewards (DeepSeekMath sec. 4.1.3, process supervision).

    step_rewards[i][j]:       reward of step j of response i (N responses, groups contiguous).
    step_end_positions[i][j]: index (0-based, within response i's tokens) of the last token of
                              step j; strictly increasing per response.
    num_tokens:               T, width of the output.
    Within each group, all step rewards of all its responses are normalized together:
    r~ = (r - mean) / (std + eps). Token t of response i then gets
    A_{i,t} = sum of r~_{i,j} over steps j with end_position >= t.
    Tokens after the last step end get 0. A group with no steps at all gets zeros.
    Returns (N, T) float32.
    """
    n = len(step_rewards)
    if len(step_end_positions) != n:
        raise ValueError(
            f"step_rewards has {n} responses but step_end_positions has {len(step_end_positions)}"
        )
    if group_size < 1 or n % group_size != 0:
        raise ValueError(f"number of responses {n} is not a multiple of group_size {group_size}")
    out = torch.zeros(n, num_tokens, dtype=torch.float32)
    for i in range(n):
        if len(step_rewards[i]) != len(step_end_positions[i]):
            raise ValueError(
                f"response {i}: {len(step_rewards[i])} step rewards but "
                f"{len(step_end_positions[i])} step end positions"
            )
        ends = list(step_end_positions[i])
        if any(b <= a for a, b in zip(ends, ends[1:], strict=False)):
            raise ValueError(f"response {i}: step end positions must be strictly increasing, got {ends}")
        if ends and (ends[0] < 0 or ends[-1] >= num_tokens):
            raise ValueError(f"response {i}: step end positions {ends} outside [0, {num_tokens})")
    for g0 in range(0, n, group_size):
        flat = [r for i in range(g0, g0 + group_size) for r in step_rewards[i]]
        if not flat:
            continue
        vals = torch.tensor(flat, dtype=torch.float64)
        if std == "sample" and vals.numel() < 2:
            raise ValueError("std='sample' needs at least 2 step rewards per group")
        s = _std(vals.unsqueeze(0), 1, std).reshape(())
        normed = (vals - vals.mean()) / (s + eps)
        k = 0
        for i in range(g0, g0 + group_size):
            row = torch.zeros(num_tokens, dtype=torch.float64)
            start = 0
            # Reverse cumulative sum over steps: a token in step j collects steps j..last.
            steps = normed[k : k + len(step_rewards[i])]
            k += len(step_rewards[i])
            suffix = torch.flip(torch.cumsum(torch.flip(steps, [0]), 0), [0])
            for j, end in enumerate(step_end_positions[i]):
                row[start : end + 1] = suffix[j]
                start = end + 1
            out[i] = row.float()
    return out


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over the valid tokens of each row.

    rewards, values, mask: (B, T). delta_t = r_t + gamma * V_{t'} - V_t where t' is the next
    valid token of the row and V after the last valid token is 0 (terminal). A_t = sum_l
    (gamma*lam)^l delta_{t+l} over valid tokens. Masked-out positions are skipped (the recursion
    passes through them unchanged) and get advantage and return 0, so left and right padding
    both work. With gamma = lam = 1 this telescopes to A_t = sum_{k>=t} r_k - V_t.
    Returns (advantages (B, T), returns = advantages + values (B, T)), both detached.
    """
    if rewards.shape != values.shape or rewards.shape != mask.shape or rewards.dim() != 2:
        raise ValueError(
            f"gae: rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, mask "
            f"{tuple(mask.shape)} must all be (B, T)"
        )
    r = rewards.detach().float()
    v = values.detach().float()
    m = mask.bool()
    b, t = r.shape
    adv = torch.zeros_like(r)
    next_value = torch.zeros(b, dtype=r.dtype, device=r.device)
    next_gae = torch.zeros(b, dtype=r.dtype, device=r.device)
    for k in range(t - 1, -1, -1):
        delta = r[:, k] + gamma * next_value - v[:, k]
        cur = delta + gamma * lam * next_gae
        valid = m[:, k]
        adv[:, k] = torch.where(valid, cur, torch.zeros_like(cur))
        next_value = torch.where(valid, v[:, k], next_value)
        next_gae = torch.where(valid, cur, next_gae)
    returns = torch.where(m, adv + v, torch.zeros_like(adv))
    return adv, returns


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "batch_std",
    "compute_advantages",
    "gae",
    "group_mean",
    "grpo",
    "no_baseline",
    "process_supervision_advantages",
    "rloo",
]
