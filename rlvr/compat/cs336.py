"""Stanford CS336 assignment 5 (alignment) function names and signatures, backed by rlvr.algo.

Thin wrappers: each one converts the assignment's conventions (advantages shaped (B, 1), one
``cliprange`` for both sides, ``loss_type`` strings, backward inside the micro-batch step) to the
plain functions of ``rlvr.algo`` and ``rlvr.models``. Conventions that matter:

- ``compute_group_normalized_rewards`` with ``normalize_by_std=True`` divides by ``torch.std``,
  i.e. the SAMPLE standard deviation (1/(G-1)), plus ``advantage_eps``; the DeepSeekMath formula
  and rlvr's default ``grpo`` estimator use the population std (1/G). For [1, 0, 0, 0] the sample
  version gives [1.5, -0.5, -0.5, -0.5], the population one [1.732, -0.577, ...].
- ``masked_mean`` is the assignment's plain ``sum(tensor * mask) / sum(mask)``: an empty slice
  gives NaN (0/0), exactly as the assignment's reference (its ``masked_mean`` snapshot along dim 0
  holds NaNs there). ``rlvr.algo.masked_mean`` is the safe one (0 for an empty slice, masked-out
  entries selected away rather than multiplied), and is what rlvr's own trainer uses.
- ``sft_microbatch_train_step``: loss = -(sum over response tokens of log p) / normalize_constant,
  averaged over the micro-batch's sequences, divided by gradient_accumulation_steps.
- ``grpo_microbatch_train_step``: per-token loss, mean over each sequence's response tokens, mean
  over sequences, divided by gradient_accumulation_steps (the assignment's masked_mean form, so a
  sequence with no response token makes the loss NaN, as in the assignment). This is only
  split-invariant when every micro-batch has the same number of sequences; rlvr's trainer uses
  ``rlvr.algo.aggregation`` with global normalizers instead.

The assignment's public snapshot tests (tests/_snapshots of stanford-cs336/assignment5-alignment)
run against these functions in tests/compat/test_compat_cs336.py, with the snapshots vendored under
tests/fixtures/cs336/.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.algo.advantages import group_mean, grpo
from rlvr.algo.logprobs import entropy_from_logits
from rlvr.algo.losses import grpo_clip, reinforce
from rlvr.algo.masked import masked_normalize as _masked_normalize
from rlvr.algo.registry import lookup


def compute_group_normalized_rewards(
    reward_fn: Callable[[str, str], dict[str, float]],
    rollout_responses: list[str],
    repeated_ground_truths: list[str],
    group_size: int,
    advantage_eps: float,
    normalize_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Score each response, then A = r - mean_group(r), divided by (torch.std_group(r) + eps) if
    normalize_by_std. reward_fn(response, ground_truth) returns a dict with "reward",
    "format_reward", "answer_reward". Returns (advantages (N,), raw_rewards (N,), metadata)."""
    if len(rollout_responses) != len(repeated_ground_truths):
        raise ValueError(
            f"{len(rollout_responses)} rollout_responses but {len(repeated_ground_truths)} ground truths"
        )
    scores = [reward_fn(r, g) for r, g in zip(rollout_responses, repeated_ground_truths, strict=True)]
    for i, s in enumerate(scores):
        if "reward" not in s:
            raise KeyError(f"reward_fn result {i} has no 'reward' key (keys: {sorted(s)})")
    raw = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)
    if normalize_by_std:
        adv = grpo(raw, group_size, eps=advantage_eps, std="sample")
    else:
        adv = group_mean(raw, group_size)
    meta = {
        "reward_mean": raw.mean().item() if raw.numel() else 0.0,
        "reward_std": raw.std().item() if raw.numel() > 1 else 0.0,
        "reward_max": raw.max().item() if raw.numel() else 0.0,
        "reward_min": raw.min().item() if raw.numel() else 0.0,
    }
    for key in ("format_reward", "answer_reward"):
        vals = [float(s[key]) for s in scores if key in s]
        if vals:
            meta[f"{key}_mean"] = sum(vals) / len(vals)
    return adv, raw, meta


def _ones_mask(logp: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(logp, dtype=torch.bool)


def compute_naive_policy_gradient_loss(
    raw_rewards_or_advantages: torch.Tensor, policy_log_probs: torch.Tensor
) -> torch.Tensor:
    """-A * log p per token. A (B, 1) or (B,), policy_log_probs (B, T) -> (B, T)."""
    loss, _ = reinforce(
        policy_log_probs, policy_log_probs.detach(), raw_rewards_or_advantages, _ones_mask(policy_log_probs)
    )
    return loss


def compute_grpo_clip_loss(
    advantages: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    cliprange: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-min(ratio * A, clip(ratio, 1 - cliprange, 1 + cliprange) * A) per token, (B, T).

    metadata: rlvr's clip/ratio statistics plus "clipped" (B, T) bool, True where the clipped
    branch is strictly smaller than the unclipped one (the token gets no gradient).
    """
    mask = _ones_mask(policy_log_probs)
    loss, meta = grpo_clip(
        policy_log_probs, old_log_probs, advantages, mask, clip_low=cliprange, clip_high=cliprange
    )
    with torch.no_grad():
        ratio = torch.exp(policy_log_probs - old_log_probs)
        adv = advantages.reshape(-1, 1).to(ratio.dtype)
        meta["clipped"] = ratio.clamp(1 - cliprange, 1 + cliprange) * adv < ratio * adv
        meta["clip_fraction"] = meta["clipped"].float().mean()
    return loss, meta


def _naive(policy_log_probs, raw_rewards, advantages, old_log_probs, cliprange):
    if raw_rewards is None:
        raise ValueError("loss_type 'no_baseline' needs raw_rewards")
    return compute_naive_policy_gradient_loss(raw_rewards, policy_log_probs), {}


def _with_baseline(policy_log_probs, raw_rewards, advantages, old_log_probs, cliprange):
    if advantages is None:
        raise ValueError("loss_type 'reinforce_with_baseline' needs advantages")
    return compute_naive_policy_gradient_loss(advantages, policy_log_probs), {}


def _clip(policy_log_probs, raw_rewards, advantages, old_log_probs, cliprange):
    missing = [n for n, v in (("advantages", advantages), ("old_log_probs", old_log_probs),
                              ("cliprange", cliprange)) if v is None]
    if missing:
        raise ValueError(f"loss_type 'grpo_clip' needs {', '.join(missing)}")
    return compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange)


CS336_LOSS_TYPES = {"no_baseline": _naive, "reinforce_with_baseline": _with_baseline, "grpo_clip": _clip}


def compute_policy_gradient_loss(
    policy_log_probs: torch.Tensor,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Dispatch on loss_type in {"no_baseline", "reinforce_with_baseline", "grpo_clip"} -> (B, T)."""
    fn = lookup(CS336_LOSS_TYPES, loss_type, "loss_type")
    return fn(policy_log_probs, raw_rewards, advantages, old_log_probs, cliprange)


def masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The assignment's masked mean: sum(tensor * mask) / sum(mask) along dim (all if None).

    An empty slice gives NaN (0 / 0), and a non-finite value under mask == 0 still propagates
    (it is multiplied by 0), both as in the assignment's reference. For the safe version (0 on an
    empty slice) use ``rlvr.algo.masked_mean``.
    """
    masked = tensor * mask
    if dim is None:
        return masked.sum() / mask.sum()
    return masked.sum(dim=dim) / mask.sum(dim=dim)


def masked_normalize(
    tensor: torch.Tensor, mask: torch.Tensor, normalize_constant: float = 1.0, dim: int | None = None
) -> torch.Tensor:
    """Sum over mask == 1 along dim (all if None), divided by normalize_constant."""
    return _masked_normalize(tensor, mask, normalize_constant, dim)


def compute_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) over the last dim. (B, T, V) -> (B, T), chunked and stable."""
    return entropy_from_logits(logits)


def sft_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    normalize_constant: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """NLL summed over response tokens / normalize_constant, mean over sequences, / accumulation
    steps; calls backward. Returns (loss (), {"num_response_tokens": ()})."""
    per_seq = _masked_normalize(-policy_log_probs, response_mask, normalize_constant, dim=-1)  # (B,)
    loss = per_seq.mean() / gradient_accumulation_steps
    loss.backward()
    return loss.detach(), {"num_response_tokens": response_mask.sum().detach()}


def grpo_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token policy-gradient loss, masked mean per sequence, mean over sequences, divided by
    gradient_accumulation_steps; calls backward. Returns (loss (), metadata)."""
    per_tok, meta = compute_policy_gradient_loss(
        policy_log_probs, loss_type, raw_rewards, advantages, old_log_probs, cliprange
    )
    loss = masked_mean(per_tok, response_mask, dim=-1).mean() / gradient_accumulation_steps
    loss.backward()
    return loss.detach(), meta


def get_response_log_probs(
    model, input_ids: torch.Tensor, labels: torch.Tensor, return_token_entropy: bool = False
) -> dict[str, torch.Tensor]:
    """{"log_probs": (B, T), "token_entropy": (B, T) if asked}; unmasked, as in the assignment.

    Delegates to rlvr.models.score_tokens (micro-batched, chunked logprobs)."""
    from rlvr.models import score_tokens  # lazy: rlvr.models imports transformers

    out = score_tokens(model, input_ids, labels, with_entropy=return_token_entropy)
    result = {"log_probs": out.logprobs}
    if return_token_entropy:
        result["token_entropy"] = out.entropy
    return result


def tokenize_prompt_and_output(prompt_strs: list[str], output_strs: list[str], tokenizer) -> dict[str, torch.Tensor]:
    """{"input_ids", "labels", "response_mask"}, each (B, max(prompt+output len) - 1).

    Delegates to rlvr.models.tokenize_prompt_and_output."""
    from rlvr.models import tokenize_prompt_and_output as _tok  # lazy: imports transformers

    return _tok(prompt_strs, output_strs, tokenizer)
