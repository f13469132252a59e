"""Batch-size arithmetic of the policy-gradient trainer, checked before any work starts.

One RL step samples a *rollout batch* of n_prompts * group_size responses. It is consumed in
`epochs_per_rollout_batch` passes; each pass is cut into minibatches of `train_batch_size` rollouts
(one optimizer step each), and each minibatch into micro-batches of `micro_batch_size` rollouts
(one forward/backward each, gradients accumulated). The loss aggregation's normalizer is computed
over the whole minibatch, so the micro-batch size changes memory, never the gradient.
`micro_batches` cuts a minibatch by a token budget instead (algo.micro_batch_tokens): rows of
long responses then go fewer to a micro-batch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rlvr.train.config reads this module and stays torch-free
    from rlvr.algo import Truncation

from rlvr.config import ConfigError


class BatchConfigError(ConfigError):
    """The batch sizes cannot be split as configured; the message says what to change. A ConfigError, so
    that the config loader reports it as it is (TrainConfig.validate plans the batches)."""


@dataclass(frozen=True)
class BatchPlan:
    """Resolved batch sizes of one RL step (all counts are rollouts, i.e. responses)."""

    rollout_batch: int  # n_prompts * group_size
    train_batch: int  # rollouts per optimizer step
    micro_batch: int  # rollouts per forward/backward
    epochs: int  # passes over the rollout batch
    optimizer_steps_per_rollout_batch: int  # epochs * rollout_batch / train_batch
    accumulation_steps: int  # train_batch / micro_batch
    on_policy: bool  # exactly one optimizer step per rollout batch: ratio == 1 at the step


@dataclass(frozen=True)
class ForwardSpec:
    """How every forward of a rollout batch runs (training, old, reference, critic values, behaviour
    policy), resolved once before the loop: micro-batches of at most micro_batch rows and (when > 0)
    micro_batch_tokens tokens; the sampling distribution scored (logits / temperature, truncated to the
    sampler's top-k / top-p: rlvr.algo.logprobs.Truncation, None = untruncated); each group's prompt
    forwarded once (shared_prefix, rlvr.models.prefix); padding-free forwards (packing: algo.packing,
    rlvr.models.packed; auto = on CUDA)."""

    micro_batch: int
    micro_batch_tokens: int = 0
    temperature: float = 1.0
    truncation: Truncation | None = None
    shared_prefix: bool = False
    packing: str | bool = "auto"

    @classmethod
    def of(cls, algo, micro_batch: int, *, temperature: float = 1.0, truncation: Truncation | None = None,
           micro_batch_tokens: int | None = None) -> ForwardSpec:
        """The spec of an algo section's keys (micro_batch_tokens, shared_prefix, packing) with the
        micro-batch rows and the sampling distribution; micro_batch_tokens overrides the section's."""
        tokens = algo.micro_batch_tokens if micro_batch_tokens is None else micro_batch_tokens
        return cls(micro_batch, tokens, temperature, truncation, algo.shared_prefix, algo.packing)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _suggest(n: int, near: int) -> str:
    """A few divisors of n close to `near`, as a readable hint."""
    divs = sorted(_divisors(n), key=lambda d: (abs(d - near), d))[:4]
    return ", ".join(str(d) for d in sorted(divs))


def plan_batches(
    n_prompts: int,
    group_size: int,
    train_batch_size: int = 0,
    micro_batch_size: int = 0,
    epochs: int = 1,
) -> BatchPlan:
    """Resolve 0 = "whole" defaults and check that every level divides the one above.

    Raises BatchConfigError naming the config keys and suggesting values that work.
    """
    if n_prompts < 1:
        raise BatchConfigError(f"sampling.n_prompts must be >= 1, got {n_prompts}")
    if group_size < 1:
        raise BatchConfigError(f"sampling.group_size must be >= 1, got {group_size}")
    if epochs < 1:
        raise BatchConfigError(f"algo.epochs_per_rollout_batch must be >= 1, got {epochs}")
    if train_batch_size < 0 or micro_batch_size < 0:
        raise BatchConfigError(
            "algo.train_batch_size and algo.micro_batch_size must be >= 0 (0 = the whole batch), got "
            f"{train_batch_size} and {micro_batch_size}"
        )
    rollout = n_prompts * group_size
    train = train_batch_size or rollout
    if train > rollout:
        raise BatchConfigError(
            f"algo.train_batch_size={train} is larger than the rollout batch "
            f"sampling.n_prompts*sampling.group_size={n_prompts}*{group_size}={rollout}; "
            f"lower it to at most {rollout} or raise sampling.n_prompts"
        )
    if rollout % train:
        raise BatchConfigError(
            f"algo.train_batch_size={train} does not divide the rollout batch "
            f"sampling.n_prompts*sampling.group_size={n_prompts}*{group_size}={rollout}; "
            f"use one of {_suggest(rollout, train)} (or change sampling.n_prompts)"
        )
    micro = micro_batch_size or train
    if micro > train:
        raise BatchConfigError(
            f"algo.micro_batch_size={micro} is larger than algo.train_batch_size={train}; "
            f"lower it to at most {train}"
        )
    if train % micro:
        raise BatchConfigError(
            f"algo.micro_batch_size={micro} does not divide algo.train_batch_size={train}; "
            f"use one of {_suggest(train, micro)}"
        )
    steps = epochs * (rollout // train)
    return BatchPlan(
        rollout_batch=rollout,
        train_batch=train,
        micro_batch=micro,
        epochs=epochs,
        optimizer_steps_per_rollout_batch=steps,
        accumulation_steps=train // micro,
        on_policy=steps == 1,
    )


def minibatch_rows(n: int, plan: BatchPlan) -> int:
    """Rows per optimizer step of a step that trains n rows: plan.train_batch; when the step trains more rows than
    its rollout batch (an agent episode's earlier segments, rlvr.train.pg.rollout_source.training_rows), as many
    as keep the plan's number of optimizer steps per epoch (the schedule counts on it)."""
    if n <= plan.rollout_batch:
        return plan.train_batch
    return -(-n // (plan.rollout_batch // plan.train_batch))


def split_indices(n: int, size: int) -> list[range]:
    """Consecutive chunks of range(n) of length `size` (the last may be shorter)."""
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def micro_batches(seq_lens: Sequence[int], *, max_rows: int = 0, max_tokens: int = 0,
                  packed: bool = False, prompts: Sequence[tuple[Hashable, int]] | None = None) -> list[range]:
    """Cut rows 0..n-1 (in the given order) into contiguous micro-batches for forward/backward.

    seq_lens: (n,) token count of each row (prompt + response). A micro-batch is padded to its
    longest row, so its cost is rows * max(seq_lens in it) tokens; packed (the padding-free forward,
    rlvr.models.packed) it is sum(seq_lens in it). Each range has at most `max_rows` rows (0 =
    unlimited) and a token count <= `max_tokens` (0 = unlimited), and at least one row: a single row
    longer than max_tokens gets a range of its own. prompts (packed with the shared prompt): each row's
    (prompt key, prompt tokens), key None for a row that shares nothing; a row whose prompt is already in
    the range costs only its other tokens (the packed sequence holds each prompt once).

    Greedy: a range grows until the next row would break a limit, so every range but the last is
    as long as the limits allow. Rows are not reordered (the caller may sort by length first to
    waste less padding); the gradient does not depend on the cut because the loss normalizers
    are computed over the whole minibatch.
    """
    if max_rows < 0 or max_tokens < 0:
        raise ValueError(f"max_rows and max_tokens must be >= 0 (0 = unlimited), got {max_rows} and {max_tokens}")
    out: list[range] = []
    start, longest, total = 0, 0, 0
    seen: set = set()  # prompt keys in the current range
    for i, n in enumerate(seq_lens):
        if n < 0:
            raise ValueError(f"seq_lens[{i}] = {n} is negative")
        key, plen = prompts[i] if prompts is not None else (None, 0)
        cost = n - plen if key is not None and key in seen else n
        rows = i - start + 1  # rows of the current range if row i joins it
        grown = max(longest, n)
        too_many = max_rows > 0 and rows > max_rows
        too_long = max_tokens > 0 and (total + cost if packed else rows * grown) > max_tokens
        if rows > 1 and (too_many or too_long):
            out.append(range(start, i))
            start, grown, total, cost = i, n, 0, n
            seen.clear()
        longest = grown
        total += cost
        if key is not None:
            seen.add(key)
    if len(seq_lens) > start:
        out.append(range(start, len(seq_lens)))
    return out
