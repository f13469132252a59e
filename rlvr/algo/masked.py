"""Masked reductions that never return NaN for an empty mask (they return 0 there).

``mask`` is 0/1 (bool, int or float; float weights are allowed) and broadcastable to ``x``.
Masked-out entries of ``x`` may hold anything, even NaN or inf: they are selected away with
``torch.where`` rather than multiplied by zero, so neither the value nor the gradient sees them.
"""

from __future__ import annotations

import torch


def _weighted(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype) if mask.dtype == torch.bool else mask
    return torch.where(mask != 0, x * mask, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x over entries where mask != 0 (weighted by mask). dim=None sums everything -> ()."""
    w = _weighted(x, mask)
    return w.sum() if dim is None else w.sum(dim=dim)


def masked_count(mask: torch.Tensor, dim: int | None = None, dtype=torch.float32) -> torch.Tensor:
    """Sum of mask weights (number of valid entries for a 0/1 mask)."""
    m = mask.to(dtype)
    return m.sum() if dim is None else m.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over entries where mask != 0. An empty mask (or empty row for dim) gives 0, not NaN.

    x (B, T), mask (B, T): dim=None -> (), dim=-1 -> (B,), dim=0 -> (T,).
    """
    mask = torch.broadcast_to(mask, x.shape)
    s = masked_sum(x, mask, dim)
    n = masked_count(mask, dim, dtype=s.dtype)
    # Divide by 1 where the count is 0: s is 0 there, and the backward pass stays finite
    # (torch.where after a 0/0 would still send NaN gradients into the unselected branch).
    return s / torch.where(n != 0, n, torch.ones_like(n))


def masked_normalize(
    x: torch.Tensor, mask: torch.Tensor, constant: float, dim: int | None = None
) -> torch.Tensor:
    """CS336 semantics: sum of x over mask != 0 along dim, divided by the constant."""
    if constant == 0:
        raise ValueError("masked_normalize: constant must be non-zero")
    return masked_sum(x, mask, dim) / constant


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = False) -> torch.Tensor:
    """Variance over all entries where mask != 0 -> (). Population (1/n) unless unbiased (1/(n-1))."""
    mask = torch.broadcast_to(mask, x.shape)
    mean = masked_mean(x, mask)
    sq = masked_sum((x - mean) ** 2, mask)
    n = masked_count(mask, dtype=sq.dtype)
    denom = n - 1 if unbiased else n
    return sq / torch.where(denom > 0, denom, torch.ones_like(denom))


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over masked entries; masked-out entries become 0.

    Population variance (1/n). With shift_mean=False the mean is added back, so only the
    scale changes (used to whiten rewards while keeping their sign, as in PPO implementations).
    x, mask: same shape (e.g. (B, T)) -> same shape.
    """
    mask = torch.broadcast_to(mask, x.shape)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask != 0, out, torch.zeros_like(out))
