"""The health check after a weight push: does the engine now sample from the learner's policy?

After every push (`rollout.push_check`, on by default for the vllm backend) the engine samples a
short probe (a few fixed prompts of the task, `max_tokens` tokens, temperature 1, no truncation,
a fixed seed) with its logprobs, and the learner scores the same tokens. The gap is the mean
|engine logprob - learner logprob| over the probe's tokens: float noise when the push reached the
engine (fp32: ~1e-6; bf16: ~1e-2), the size of the learning step when it did not (a no-op push, a
weight that went to the wrong parameter, stale weights after a wake-up, a prefix cache that kept
old KV). Above `tol` the run warns; above it again at the next push it stops with PushCheckError
naming the step, the gap and the setting, before it trains on rollouts of another policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlvr.models import score_tokens
from rlvr.rollout.batch import rollouts_to_batch
from rlvr.rollout.types import EngineError, SamplingSpec


class PushCheckError(EngineError):
    """The engine's logprobs stayed away from the learner's after a push."""


def logprob_gap(generator, model, tokenizer, prompts: Sequence[str], *, max_tokens: int = 16,
                seed: int = 0) -> tuple[float, float, int]:
    """(mean, max |engine - learner| logprob, tokens compared) on a fresh probe of `prompts`."""
    spec = SamplingSpec(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens, seed=seed, logprobs=True)
    rollouts = [r for r in generator.generate(list(prompts), spec) if r.response_ids and r.logprobs]
    if not rollouts:
        return 0.0, 0.0, 0
    batch = rollouts_to_batch(rollouts, tokenizer.pad_token_id)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            lp = score_tokens(model, batch.input_ids.to(device), batch.labels.to(device),
                              batch.attention_mask.to(device)).logprobs.float().cpu()
    finally:
        model.train(was_training)
    mask = batch.response_mask.bool()
    diff = (lp - batch.sampler_logprobs)[mask].abs()
    return float(diff.mean()), float(diff.max()), int(mask.sum())


class PushCheck:
    """Call after each `generator.update_weights(..., version)`; returns the gap (mean) it measured.

    prompts: the probe (fixed for the run). tol: the largest mean gap accepted. say: where the
    warning goes (the run's progress line)."""

    def __init__(self, prompts: Sequence[str], *, tol: float, max_tokens: int = 16, seed: int = 0,
                 say: Callable[[str], None] = print):
        self.prompts = list(prompts)
        self.tol = float(tol)
        self.max_tokens = max_tokens
        self.seed = seed
        self.say = say
        self.strikes = 0
        self.last: dict[str, float] = {}

    def __call__(self, generator, model, tokenizer, version: int) -> float:
        mean, worst, n = logprob_gap(generator, model, tokenizer, self.prompts, max_tokens=self.max_tokens,
                                     seed=self.seed + int(version))
        self.last = {"rollout/push_gap_mean": mean, "rollout/push_gap_max": worst}
        if mean <= self.tol:
            self.strikes = 0
            return mean
        self.strikes += 1
        what = (f"after the weight push of step {version}, the engine's logprobs differ from the learner's by "
                f"{mean:.3g} nats per token on average (max {worst:.3g}, {n} probe tokens), above "
                f"rollout.push_check_tol={self.tol:g}")
        if self.strikes >= 2:
            raise PushCheckError(
                f"{what}, for the second push in a row: the engine is not sampling from the policy being "
                "trained (a push that did not reach it, or a dtype/model mismatch). Stopped before training on "
                "its rollouts; raise rollout.push_check_tol if the gap is expected (e.g. a bf16 engine against "
                "an fp32 learner), or set rollout.push_check=false")
        self.say(f"warning: {what}; the run stops if the next push is off too")
        return mean
