"""Loss aggregation: per-token loss (B, T) -> scalar, named by what it computes.

All modes share one signature, registered in ``LOSS_AGGREGATIONS``:

    fn(per_token_loss, mask, norm: LossNormalizers) -> () scalar

and every normalizer comes from ``norm``, computed ONCE from the mask of the FULL batch (all
micro-batches, accumulation steps and workers of one optimizer step) with ``loss_normalizers``.
Each mode is then a sum over sequences of a per-sequence quantity divided by a global constant,
so for any split of the batch's rows into micro-batches

    sum over micro-batches of fn(loss[rows], mask[rows], norm) == fn(loss, mask, norm)

in value and in gradient. This is what TRL and verl got wrong for a long time: dividing each
micro-batch by its OWN token count (or sequence count) and then averaging micro-batches weights
tokens of short micro-batches more. Call backward on each micro-batch's loss as is; do NOT also
divide by the number of accumulation steps. With data-parallel workers whose gradients are
AVERAGED (DDP), multiply each worker's loss by the world size (or use a SUM all-reduce).

Modes (n_i = valid tokens of sequence i, l_it = per-token loss, S = norm.num_seqs,
N = norm.num_tokens, C = norm.constant):

    seq_mean_token_mean      (1/S) sum_i (1/n_i) sum_t l_it      GRPO paper, CS336 default
    token_mean               (1/N) sum_i sum_t l_it              DAPO "token-level", TRL bnpo/dapo
    seq_mean_token_sum       (1/S) sum_i sum_t l_it              sum over a response's tokens
    seq_mean_token_sum_norm  (1/(S*C)) sum_i sum_t l_it          Dr. GRPO, C = max response length

A row with n_i = 0 contributes 0 everywhere (never NaN). By default S counts every row of the
batch, empty or not (the paper's 1/G counts all G responses); pass ``count_empty_rows=False`` to
``loss_normalizers`` to count only rows with at least one valid token (what verl does now).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from rlvr.algo.masked import masked_count, masked_sum
from rlvr.algo.names import LOSS_AGGREGATION_NAMES
from rlvr.algo.registry import check_names, lookup


@dataclass(frozen=True)
class LossNormalizers:
    """Global denominators of one optimizer step (floats, computed from the full batch mask)."""

    num_seqs: float  # S: number of sequences (rows) in the full batch
    num_tokens: float  # N: number of valid (mask != 0) tokens in the full batch
    constant: float | None = None  # C: e.g. the configured max response length (Dr. GRPO)

    def __add__(self, other: LossNormalizers) -> LossNormalizers:
        """Combine the normalizers of disjoint parts (e.g. per-worker) of one step."""
        if self.constant != other.constant:
            raise ValueError(f"cannot combine normalizers with constants {self.constant} and {other.constant}")
        return LossNormalizers(self.num_seqs + other.num_seqs, self.num_tokens + other.num_tokens, self.constant)


def loss_normalizers(
    mask: torch.Tensor | Iterable[torch.Tensor],
    constant: float | None = None,
    count_empty_rows: bool = True,
) -> LossNormalizers:
    """Normalizers for a full batch. mask: (B, T), or an iterable of (B_k, T_k) micro-batch masks.

    constant: denominator for ``seq_mean_token_sum_norm`` (must be > 0 if given).
    """
    masks = [mask] if isinstance(mask, torch.Tensor) else list(mask)
    if constant is not None and constant <= 0:
        raise ValueError(f"constant must be > 0, got {constant}")
    seqs = 0.0
    toks = 0.0
    for m in masks:
        if m.dim() != 2:
            raise ValueError(f"mask must be (B, T), got {tuple(m.shape)}")
        per_row = masked_count(m, dim=-1, dtype=torch.float64)
        seqs += float(m.shape[0]) if count_empty_rows else float((per_row > 0).sum())
        toks += float(per_row.sum())
    return LossNormalizers(num_seqs=seqs, num_tokens=toks, constant=constant)


def _safe(d: float) -> float:
    # A batch with no sequences / tokens has a zero numerator too: return 0, not NaN.
    return d if d > 0 else 1.0


def _check(loss: torch.Tensor, mask: torch.Tensor) -> None:
    if loss.dim() != 2 or loss.shape != mask.shape:
        raise ValueError(f"per_token_loss {tuple(loss.shape)} and mask {tuple(mask.shape)} must both be (B, T)")


def seq_mean_token_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNormalizers) -> torch.Tensor:
    """(1/S) * sum_i (1/n_i) * sum_t mask_it * l_it. Per-sequence mean, so n_i is local to a row."""
    _check(per_token_loss, mask)
    seq_sum = masked_sum(per_token_loss, mask, dim=-1)  # (B,)
    n = masked_count(mask, dim=-1, dtype=seq_sum.dtype)  # (B,)
    seq_mean = seq_sum / torch.where(n > 0, n, torch.ones_like(n))
    return seq_mean.sum() / _safe(norm.num_seqs)


def token_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNormalizers) -> torch.Tensor:
    """(1/N) * sum_{i,t} mask_it * l_it with N the valid-token count of the FULL batch."""
    _check(per_token_loss, mask)
    return masked_sum(per_token_loss, mask) / _safe(norm.num_tokens)


def seq_mean_token_sum(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNormalizers) -> torch.Tensor:
    """(1/S) * sum_{i,t} mask_it * l_it."""
    _check(per_token_loss, mask)
    return masked_sum(per_token_loss, mask) / _safe(norm.num_seqs)


def seq_mean_token_sum_norm(
    per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNormalizers
) -> torch.Tensor:
    """(1/(S*C)) * sum_{i,t} mask_it * l_it; C a fixed constant such as the max response length.

    Each token of each response gets coefficient 1/(S*C) whatever its response's length.
    """
    _check(per_token_loss, mask)
    if norm.constant is None:
        raise ValueError(
            "seq_mean_token_sum_norm needs LossNormalizers.constant (e.g. max response length); "
            "pass constant= to loss_normalizers"
        )
    return masked_sum(per_token_loss, mask) / (_safe(norm.num_seqs) * norm.constant)


AggregationFn = Callable[[torch.Tensor, torch.Tensor, LossNormalizers], torch.Tensor]

LOSS_AGGREGATIONS: dict[str, AggregationFn] = {
    "seq_mean_token_mean": seq_mean_token_mean,
    "token_mean": token_mean,
    "seq_mean_token_sum": seq_mean_token_sum,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
}
check_names(LOSS_AGGREGATIONS, LOSS_AGGREGATION_NAMES, "LOSS_AGGREGATIONS")


def aggregate_loss(
    name: str, per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNormalizers | None = None
) -> torch.Tensor:
    """Look up ``name`` in LOSS_AGGREGATIONS and apply it.

    norm=None uses this batch's own normalizers: right for a single un-split batch, and ONLY then.
    """
    fn = lookup(LOSS_AGGREGATIONS, name, "loss aggregation")
    if norm is None:
        norm = loss_normalizers(mask)
    return fn(per_token_loss, mask, norm)
