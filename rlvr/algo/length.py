"""Length-dependent reward terms (added to the task reward, with a weight chosen by the recipe)."""

from __future__ import annotations

import torch


def kimi_length_reward(
    lengths: torch.Tensor, correct: torch.Tensor, group_size: int | None = None
) -> torch.Tensor:
    """Kimi k1.5 sec. 2.3.3 length reward, per group of responses to one prompt.

    lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len), min/max over the group;
    reward_i = lambda_i if correct_i else min(0, lambda_i); a group with all lengths equal gets 0.
    lengths: (N,) token counts; correct: (N,) bool (or 0/1); group_size: G with N = k * G and
    groups contiguous; None treats all N as one group. Returns (N,) float32 in [-0.5, 0.5].
    Unweighted: Kimi multiplies it by a weight and warms up without it.
    """
    if lengths.dim() != 1 or correct.shape != lengths.shape:
        raise ValueError(f"lengths {tuple(lengths.shape)} and correct {tuple(correct.shape)} must both be (N,)")
    n = lengths.shape[0]
    g = n if group_size is None else group_size
    if g < 1 or n % g != 0:
        raise ValueError(f"number of responses {n} is not a multiple of group_size {g}")
    length = lengths.detach().to(torch.float64).reshape(-1, g)
    lo = length.min(dim=1, keepdim=True).values
    hi = length.max(dim=1, keepdim=True).values
    span = hi - lo
    lam = 0.5 - (length - lo) / torch.where(span > 0, span, torch.ones_like(span))
    lam = torch.where(span > 0, lam, torch.zeros_like(lam))
    ok = correct.reshape(-1, g).bool()
    return torch.where(ok, lam, lam.clamp(max=0.0)).reshape(-1).float()


def dapo_overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13).

    0 for len <= max_len - cache_len; ((max_len - cache_len) - len) / cache_len in between
    (linear from 0 down to -1 at len == max_len); -1 for len > max_len.
    lengths: (N,) token counts -> (N,) float32.
    """
    if cache_len <= 0 or cache_len > max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    length = lengths.detach().to(torch.float64)
    start = max_len - cache_len
    mid = (start - length) / cache_len
    out = torch.where(length <= start, torch.zeros_like(length), mid)
    out = torch.where(length > max_len, torch.full_like(length, -1.0), out)
    return out.float()
