"""The policy-gradient objective, resolved once from the `algo` config section.

`Objective(algo, group_size, max_tokens, plan)` holds every variable part of the loss, so the
training loop has no `if algo.x` in it:

    shaped, adv, keep, zero_var = objective.advantages(rewards, lengths, step)  # length shaping, estimator
    targets = objective.targets(adv[kept], mask, old_logp, ref_logp, old_values)  # GAE, KL-in-reward, whitening
    mb = Minibatch(batch, targets.advantages, old_logp, ref_logp)                # one optimizer step's rows
    loss = accumulate_gradients(model, mb, objective.parts, forward_spec, norm_length=objective.norm_length)

The per-token loss is assembled from parts resolved once (`LossParts.from_algo`): the policy term
(a POLICY_LOSSES function with its clip/tau bound) with its optional rollout correction (importance
weights sampler -> trainer, rlvr.algo.correction), the aggregation, an optional KL term, an
optional entropy bonus and an optional value term (PPO's critic, rlvr.train.pg.critic).

The policy's forwards (training, old) score the distribution the sampler drew from: softmax of the
logits / sampling.temperature, truncated to sampling.top_k / top_p when those are on
(`Objective.truncation`, rlvr.algo.logprobs.Truncation); that is what the importance ratio reads. The KL
penalty is a divergence between the policy and the reference (or a teacher) as models: both sides are
scored untruncated at the temperature (the training forward's ScoreOutput.model_logprobs, the reference's
forward without the truncation, and with algo.kl_in=reward the old policy's too: Objective.kl_forward).

It declares what it needs: `needs_old_logprobs(plan)` (a separate no-grad forward before the
first update, which on-policy with one optimizer step equals logp.detach() of the training
forward, so it is skipped there) and `needs_reference` (kl_coef > 0).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rlvr.algo import (
    LOSS_AGGREGATIONS,
    TRUNCATED_LOGPROB,
    Truncation,
    compute_advantages,
    dapo_overlong_penalty,
    high_entropy_mask,
    kimi_length_reward,
    kl_estimate,
    loss_normalizers,
    masked_mean,
    policy_loss,
    rollout_correction,
    value_loss,
)
from rlvr.algo.names import LENGTH_REWARD_NAMES
from rlvr.algo.registry import check_names
from rlvr.models import TrainingBatch, score_tokens
from rlvr.models.packed import PackPlan, row_prompts, score_packed, use_packing, use_varlen
from rlvr.models.prefix import score_rows
from rlvr.rewards.types import Reward, Status
from rlvr.train.batching import BatchPlan, ForwardSpec, micro_batches
from rlvr.train.pg.process import process_targets, step_marks
from rlvr.train.pg.targets import (  # noqa: F401 - re-exported
    Targets,
    TargetSettings,
    gae_targets,
    kl_reward_to_go,
    token_advantages,
)


def _length_none(lengths, correct, *, group_size, max_tokens, buffer):
    return torch.zeros(lengths.shape[0])


def _length_kimi(lengths, correct, *, group_size, max_tokens, buffer):
    return kimi_length_reward(lengths, correct, group_size)


def _length_dapo(lengths, correct, *, group_size, max_tokens, buffer):
    return dapo_overlong_penalty(lengths, max_tokens, buffer)


# Length-shaping terms added to the task reward before advantages; one signature:
# fn(lengths (N,), correct (N,) bool, *, group_size, max_tokens, buffer) -> (N,) float.
LENGTH_REWARDS: dict[str, Callable[..., torch.Tensor]] = {
    "": _length_none,
    "kimi": _length_kimi,
    "dapo_overlong": _length_dapo,
}
check_names(LENGTH_REWARDS, LENGTH_REWARD_NAMES, "LENGTH_REWARDS")  # the config's torch-free list of them


@dataclass
class StepStats:
    """Accumulates per-micro-batch statistics of one RL step, weighted by valid tokens."""

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    mins: dict[str, float] = field(default_factory=dict)
    maxs: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value * weight
        self.weights[key] = self.weights.get(key, 0.0) + weight

    def extreme(self, key: str, value: float) -> None:
        self.mins[key] = min(self.mins.get(key, value), value)
        self.maxs[key] = max(self.maxs.get(key, value), value)

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}

    def merge(self, other: StepStats) -> None:
        """Add another accumulator's sums and weights, and take its extremes (a data-parallel worker's)."""
        for k, v in other.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.weights[k] = self.weights.get(k, 0.0) + other.weights[k]
        for k, v in other.mins.items():
            self.mins[k] = min(self.mins.get(k, v), v)
        for k, v in other.maxs.items():
            self.maxs[k] = max(self.maxs.get(k, v), v)


# ------------------------------------------------------------------------- rewards -> advantages


@dataclass(frozen=True)
class Shaping:
    """Rewards -> advantages, resolved once from the `algo` section (Shaping.of): the length term
    (LENGTH_REWARDS, with its coefficient and warm-up), the outcome estimator (ADVANTAGE_ESTIMATORS), and
    whether zero-variance groups are dropped. Call it with a step's rewards and answer lengths."""

    group_size: int
    length_term: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (lengths, correct) -> (N,)
    length_coef: float
    warmup_steps: int  # the length term is off while step <= warmup_steps
    estimator: Callable[..., torch.Tensor] | None  # (shaped (N,), group_size) -> (N,); None: shaped itself
    filter_zero_variance: bool

    @classmethod
    def of(cls, algo, group_size: int, max_tokens: int) -> Shaping:
        """algo.advantage=gae: the "advantage" is the shaped outcome reward itself, which the critic turns
        into per-token advantages later (Objective.targets); process: GRPO's advantage of the outcome, the
        outcome's part of the process advantage (rlvr.train.pg.process)."""
        term = functools.partial(LENGTH_REWARDS[algo.length_reward], group_size=group_size, max_tokens=max_tokens,
                                 buffer=algo.overlong_buffer)
        name = {"gae": None, "process": "grpo"}.get(algo.advantage, algo.advantage)
        estimator = (None if name is None
                     else functools.partial(compute_advantages, name, eps=algo.adv_eps, std=algo.adv_std))
        return cls(group_size, term, algo.length_reward_coef, algo.length_reward_warmup_steps,
                   estimator, algo.filter_zero_variance)

    def __call__(self, rewards: list[Reward], lengths: torch.Tensor, step: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """(shaped rewards (N,), advantages (N,), keep (N,) bool, share of zero-variance groups); step None:
        the length term is on.

        An UNSCORED reward (`unscored`: its checker failed, Status.ERROR) is not a 0: it is left out of its
        group's statistics and gets advantage 0 (rlvr.algo.advantages, `valid`), and a group's variance is
        that of its scored rewards. With a critic (advantage=gae, no group baseline) its row leaves the loss
        instead (keep False), so the critic never regresses on a made-up return."""
        group_size = self.group_size
        total = torch.tensor([r.total for r in rewards], dtype=torch.float32)  # (N,)
        correct = torch.tensor([r.status is Status.CORRECT for r in rewards])
        scored = ~unscored(rewards)  # (N,)
        valid = None if bool(scored.all()) else scored
        term = self.length_term(lengths, correct)
        warming = step is not None and step <= self.warmup_steps
        shaped = total + (0.0 if warming else self.length_coef) * term.float()
        if self.estimator is None:
            adv = shaped.clone() if valid is None else torch.where(valid, shaped, torch.zeros_like(shaped))
        else:
            adv = self.estimator(shaped, group_size, valid=valid)
        groups, ok = total.view(-1, group_size), scored.view(-1, group_size)
        inf = torch.tensor(float("inf"))
        hi = torch.where(ok, groups, -inf).max(dim=1).values
        lo = torch.where(ok, groups, inf).min(dim=1).values
        zero_var = ~(hi > lo)  # (n_prompts,): equal scored rewards (or fewer than two scored) carry no signal
        keep = torch.ones_like(total, dtype=torch.bool)
        if self.filter_zero_variance:
            keep = (~zero_var).repeat_interleave(group_size)
        if self.estimator is None and valid is not None:  # the critic's targets: an unscored row leaves the loss
            keep = keep & valid
        return shaped, adv, keep, float(zero_var.float().mean())


def unscored(rewards: Sequence[Reward]) -> torch.Tensor:
    """(N,) bool: the rewards that could not be computed (Status.ERROR: the reward function raised, the judge
    failed with judge.fallback=unscored, the environment crashed). A wrong answer, an unparsable one and a
    verifier timeout are scored (the policy owns those)."""
    return torch.tensor([Status(r.status) is Status.ERROR for r in rewards], dtype=torch.bool)


def shape_and_advantage(
    rewards: list[Reward], lengths: torch.Tensor, algo, group_size: int, max_tokens: int, step: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Shaping.of(algo, group_size, max_tokens)(rewards, lengths, step): (shaped rewards (N,), advantages
    (N,), keep (N,) bool, share of zero-variance groups)."""
    return Shaping.of(algo, group_size, max_tokens)(rewards, lengths, step)


# ------------------------------------------------------------------------------ loss, gradients


@dataclass
class Minibatch:
    """The rows of one optimizer step and what the loss reads of them: advantages (b,) or (b, T) per token;
    old_logp, ref_logp (b, T) or None (old None = on-policy: the training forward's logp.detach()); with
    PPO's critic the rollout-time values and the value targets (b, T); row_ids: each row's key in the
    row_entropy accumulator (None = its index); policy_keep (b, T) bool: the response tokens whose policy term
    counts (algo.entropy_mask_quantile, set by Objective.select_tokens over the whole minibatch; None = all)."""

    batch: TrainingBatch
    advantages: torch.Tensor
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    row_ids: Sequence[int] | None = None
    policy_keep: torch.Tensor | None = None

    def part(self, lo: int, hi: int, width: int | None = None) -> Minibatch:
        """Rows lo .. hi - 1 (views), each (b, T) tensor cut to its first `width` positions (None: all)."""

        def cut(t):
            if t is None:
                return None
            return t[lo:hi] if t.dim() == 1 or width is None else t[lo:hi, :width]

        batch = _slice(self.batch, range(lo, hi))
        return Minibatch(batch if width is None else _narrow(batch, width), cut(self.advantages), cut(self.old_logp),
                         cut(self.ref_logp), cut(self.old_values), cut(self.returns),
                         None if self.row_ids is None else list(self.row_ids)[lo:hi], cut(self.policy_keep))

    def to(self, device) -> Minibatch:
        moved = (None if t is None else t.to(device) for t in (
            self.advantages, self.old_logp, self.ref_logp, self.old_values, self.returns))
        return Minibatch(self.batch.to(device), *moved, row_ids=self.row_ids,
                         policy_keep=None if self.policy_keep is None else self.policy_keep.to(device))


@dataclass(frozen=True)
class LossParts:
    """The per-token loss, resolved once from the `algo` section (`LossParts.from_algo`).

    policy(logp, old_logp, adv, mask) -> (per-token loss, stats): a POLICY_LOSSES function with its
    clip ranges / tau bound; aggregate(per_token, mask, norm): a LOSS_AGGREGATIONS function; kl:
    (estimator, coef, in_loss) or None; entropy_coef; value: (coef, clip or None) of PPO's value
    loss, or None; correction: (mode, cap, low) of algo.rollout_correction (a ROLLOUT_CORRECTIONS
    name, `auto` resolved), or None."""

    policy: Callable
    aggregate: Callable
    kl: tuple[str, float, bool] | None = None
    entropy_coef: float = 0.0
    value: tuple[float, float | None] | None = None
    correction: tuple[str, float, float] | None = None

    @classmethod
    def from_algo(cls, algo, correction: str | None = None) -> LossParts:
        """LossParts of an AlgoConfig (a LossParts is returned as is). correction: algo.rollout_correction
        with `auto` resolved (Objective.correction); None resolves it here as for the hf backend."""
        if isinstance(algo, LossParts):
            return algo
        policy = functools.partial(
            policy_loss, algo.loss, clip_low=algo.clip_low, clip_high=algo.clip_high,
            dual_clip=algo.dual_clip or None, tau=algo.kimi_tau,
        )
        kl = (algo.kl_estimator, algo.kl_coef, algo.kl_in != "reward") if algo.kl_coef > 0 else None
        value = None
        if algo.critic:
            value = (algo.value_coef, algo.value_clip or None)
        mode = correction or resolve_rollout_correction(algo.rollout_correction, "hf")
        corr = None if mode == "none" else (mode, algo.rollout_correction_cap, algo.rollout_correction_low)
        return cls(policy=policy, aggregate=LOSS_AGGREGATIONS[algo.aggregation], kl=kl,
                   entropy_coef=algo.entropy_coef, value=value, correction=corr)


def resolve_rollout_correction(mode: str, backend: str) -> str:
    """algo.rollout_correction with `auto` resolved: token_tis for the vllm backend (its kernels and bf16
    numerics are not the trainer's), none for any other (the hf sampler is the trainer's own code)."""
    if mode != "auto":
        return mode
    return "token_tis" if backend == "vllm" else "none"


def micro_batch_loss(
    model, mb: Minibatch, norm, parts: LossParts, fwd: ForwardSpec, *, critic=None, pack: PackPlan | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch, already divided by the minibatch's global normalizers, so that
    summing backward() over the micro-batches of a minibatch gives the minibatch gradient.

    mb: the micro-batch's rows (Minibatch). fwd: how the policy's forward runs (the sampling distribution
    it scores: temperature, truncation to top_k / top_p; the shared prefix). critic (with mb's old_values
    and returns): adds value_coef * the clipped value loss, token-mean over the minibatch. pack: the
    micro-batch's rlvr.models.packed.PackPlan: one padding-free forward (logprobs and entropy on the
    response tokens only, 0 elsewhere). Returns (loss scalar, detached stats).

    With mb.policy_keep (algo.entropy_mask_quantile, Objective.select_tokens) the policy term of the other
    response tokens is 0; their KL and entropy terms stay, and the normalizers still count them (as TRL's
    top_entropy_quantile: the mask multiplies the policy loss, the denominators are the response mask's).

    With a rollout correction (parts.correction) and the batch's sampler logprobs, the policy term of
    each token is multiplied by its detached weight (rlvr.algo.correction: old vs sampler logprobs); a
    token the correction masks, or whose label is outside the trainer's truncated support, leaves the
    per-token loss altogether (policy, KL and entropy terms). The aggregation's normalizers still count
    it: they are fixed from the whole minibatch's response mask before any forward, so the
    split-invariance of rlvr.algo.aggregation holds and masking scales the step down by the masked share
    (as TRL's masks) instead of re-weighting the tokens that stay.
    """
    device = next(model.parameters()).device
    batch = mb.batch.to(device)
    advantages = mb.advantages.to(device)
    old_logp, ref_logp, old_values, returns = mb.old_logp, mb.ref_logp, mb.old_values, mb.returns
    temperature, truncation = fwd.temperature, fwd.truncation
    shared_values = critic is not None and critic.shared
    if pack is not None:
        out = score_packed(model, batch.input_ids, batch.labels, pack, with_entropy=True, temperature=temperature,
                           truncation=truncation)
    elif shared_values:  # the value head reads the hidden states of the one plain forward
        out = score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask, with_entropy=True,
                           temperature=temperature, with_hidden=True, truncation=truncation)
    else:
        out = score_rows(model, batch.input_ids, batch.labels, batch.attention_mask, batch.response_mask,
                         shared_prefix=fwd.shared_prefix, with_entropy=True, temperature=temperature,
                         truncation=truncation)
    logp, entropy = out.logprobs.float(), out.entropy.float()  # (b, T) each; fp32 loss math under bf16
    mask = batch.response_mask
    old = logp.detach() if old_logp is None else old_logp.to(device)
    keep = None  # response tokens that stay in the loss; None = all of them (no truncation, no correction)
    if truncation is not None and truncation.active:
        # a label outside the trainer's kept set has no probability under pi_K: its logprob is the floor,
        # without gradient (rlvr.algo.logprobs), and the token leaves the loss
        keep = mask.bool() & (logp.detach() > TRUNCATED_LOGPROB) & (old > TRUNCATED_LOGPROB)
    sampler = batch.sampler_logprobs.to(device) if batch.sampler_logprobs is not None else None
    stats: dict[str, torch.Tensor] = {}
    corr = None
    if sampler is not None:
        # |sampler - trainer| logprob of the sampled tokens, against the policy that sampled them
        seen = mask if keep is None else keep
        diff = (old.detach() - sampler).abs()
        stats["logprob_diff"] = masked_mean(diff, seen)
        stats["logprob_diff_max"] = (diff * seen).amax()  # 0 when nothing is seen (diff >= 0); no host sync
        if parts.correction is not None:  # importance weights sampler -> trainer (rlvr.algo.correction)
            mode, cap, low = parts.correction
            corr = rollout_correction(mode, old, sampler, mask, cap=cap, low=low)
            keep = corr.keep if keep is None else keep & corr.keep
            stats.update(corr.stats)
    # the policy term over the tokens that stay in the loss: its ratio and clip statistics are theirs (a token
    # already out of the loss, e.g. outside the trainer's top-p set with ratio ~0, would drag ratio/min to 0)
    per_token, meta = parts.policy(logp, old, advantages, mask if keep is None else keep)
    stats.update({k: v.detach() for k, v in meta.items()})
    if corr is not None:
        per_token = per_token * corr.weight
    if mb.policy_keep is not None:  # algo.entropy_mask_quantile: the policy term on the high-entropy tokens only
        selected = mb.policy_keep.to(device)
        per_token = torch.where(selected, per_token, torch.zeros((), dtype=per_token.dtype, device=device))
        stats["entropy_kept_frac"] = masked_mean(selected.float(), mask)
    if parts.kl is not None:
        estimator, coef, in_loss = parts.kl
        if ref_logp is None:
            raise ValueError("algo.kl_coef > 0 needs reference logprobs")
        ref_logp = ref_logp.to(device)
        # a divergence between the two models: the policy's untruncated logprobs against the reference's
        # (ReferencePolicy scores it untruncated), whatever the sampler's top-k / top-p (docs/algorithms.md)
        model_logp = out.model_logprobs.float()
        if in_loss:
            kl = kl_estimate(estimator, model_logp, ref_logp)  # (b, T)
            per_token = per_token + coef * kl
        else:
            # the penalty is already in the advantages (token_advantages); only the metric here,
            # with the same meaning as in the loss mode: KL of the current policy to the reference
            kl = kl_estimate(estimator, model_logp.detach(), ref_logp)  # (b, T)
        stats["kl"] = masked_mean(kl.detach(), mask if keep is None else keep)
    if parts.entropy_coef > 0:
        per_token = per_token - parts.entropy_coef * entropy
    if keep is not None:
        per_token = torch.where(keep, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    stats["entropy"] = masked_mean(entropy.detach(), mask)
    stats["row_entropy"] = masked_mean(entropy.detach(), mask, dim=-1)  # (b,) mean entropy per response
    loss = parts.aggregate(per_token, mask, norm)
    if critic is not None:
        if parts.value is None or old_values is None or returns is None:
            raise ValueError("a critic needs algo.critic set and the batch's old values and returns")
        coef, clip = parts.value
        values = critic.forward(batch, out.hidden).to(device)  # (b, T) with grad
        v_tok, v_meta = value_loss(values, old_values.to(device), returns.to(device), mask, clip_range=clip)
        v_loss = LOSS_AGGREGATIONS["token_mean"](v_tok, mask, norm)
        loss = loss + coef * v_loss
        stats["value_loss"] = masked_mean(v_tok.detach(), mask)
        stats["value_clip_frac"] = v_meta["value_clip_frac"].detach()
        stats["values"] = masked_mean(values.detach(), mask)
    return loss, stats


def accumulate_gradients(
    model,
    mb: Minibatch,
    parts: LossParts,
    fwd: ForwardSpec,
    *,
    norm_length: int = 0,
    normalizers=None,
    critic=None,
    stats: StepStats | None = None,
    row_entropy: dict[int, float] | None = None,
) -> float:
    """Backward over one minibatch (mb: b rows) in micro-batches; returns the minibatch loss.

    Micro-batches hold at most fwd.micro_batch rows and, when fwd.micro_batch_tokens > 0, at most that
    many tokens (padded; real tokens when packed: fwd.packing, rlvr.models.packed). The aggregation
    normalizers come from the whole minibatch's mask (norm_length: the constant of
    seq_mean_token_sum_norm, 0 = none), so the accumulated gradient does not depend on how it is split.
    Gradients are added to .grad (the caller zeroes them). row_entropy, if given, receives the mean token
    entropy of each row, keyed by mb.row_ids[row] (default: the row's index). critic: PPO's value term
    (see micro_batch_loss). normalizers: the LossNormalizers of the whole minibatch when `mb` is one
    worker's share of it (data-parallel learners, rlvr.distributed.dp); None = computed from `mb`. Packed,
    the micro-batches' plans and the minibatch's tensors go to the device before the loop, and the losses
    and statistics are read back after it, so the loop itself never waits on the device.
    """
    batch = mb.batch
    norm = normalizers or loss_normalizers(batch.response_mask, constant=float(norm_length) if norm_length else None)
    seq_lens = batch.attention_mask.sum(-1).tolist()
    packed = critic is None and use_packing(model, fwd.packing)  # a critic reads the plain forward's states
    prompts = row_prompts(batch.input_ids, batch.response_mask) if packed and fwd.shared_prefix else None
    chunks = micro_batches(seq_lens, max_rows=fwd.micro_batch, max_tokens=fwd.micro_batch_tokens, packed=packed,
                           prompts=prompts)
    # a micro-batch is only as wide as its longest row (rows were right-padded to the batch's)
    widths = [max(seq_lens[c.start:c.stop]) for c in chunks]
    plans: list[PackPlan | None] = [None] * len(chunks)
    if packed:  # everything on the device before the loop: no host round trip inside it
        device = next(model.parameters()).device
        varlen = use_varlen(model, fwd.packing)
        plans = [PackPlan.build(batch.attention_mask[c.start:c.stop, :w], batch.response_mask[c.start:c.stop, :w],
                                device, input_ids=batch.input_ids[c.start:c.stop, :w], share=fwd.shared_prefix,
                                varlen=varlen)
                 for c, w in zip(chunks, widths, strict=True)]
        mb = mb.to(device)

    done = []  # (chunk, loss, stats, response tokens): read back after the loop
    for chunk, width, plan in zip(chunks, widths, plans, strict=True):
        part = mb.part(chunk.start, chunk.stop, width)
        w = part.batch.response_mask.sum()
        loss, meta = micro_batch_loss(model, part, norm, parts, fwd, critic=critic, pack=plan)
        loss.backward()
        done.append((chunk, loss.detach(), meta, w))
    row_ids = mb.row_ids
    total = 0.0
    for chunk, loss, meta, w in done:
        total += float(loss)
        ent = meta.pop("row_entropy")
        if row_entropy is not None:
            for j, e in zip(chunk, ent.tolist(), strict=True):
                row_entropy[row_ids[j] if row_ids is not None else j] = e
        if stats is not None:
            w = float(w)
            # the rollout correction's statistics are over its units (tokens or responses)
            units = float(meta.pop("correction_units", w))
            for k, v in meta.items():
                if k.startswith("correction_") and units == 0:
                    continue  # nothing was weighted: no mean, and no min/max of nothing
                if k in _EXTREMES:
                    stats.extreme(k, float(v))
                else:
                    stats.add(k, float(v), units if k.startswith("correction_") else w)
    return total


def _slice(batch: TrainingBatch, rows: range) -> TrainingBatch:
    """Rows rows.start .. rows.stop - 1 of every tensor, as views (no copy, no index tensor)."""
    return dataclasses.replace(batch, **{f.name: v[rows.start:rows.stop] for f in dataclasses.fields(batch)
                                         if isinstance(v := getattr(batch, f.name), torch.Tensor)})


# micro-batch statistics kept as the step's min / max (StepStats.extreme), not token-weighted means
_EXTREMES = ("ratio_min", "ratio_max", "logprob_diff_max", "correction_ratio_min", "correction_ratio_max")


def _narrow(batch: TrainingBatch, width: int) -> TrainingBatch:
    """The first `width` positions of every (b, T) tensor of a right-padded batch."""
    kw = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        kw[f.name] = v[:, :width] if isinstance(v, torch.Tensor) and v.dim() == 2 else v
    return dataclasses.replace(batch, **kw)


@torch.no_grad()
def batch_logprobs(model, batch: TrainingBatch, micro_batch_size: int, temperature: float = 1.0,
                   micro_batch_tokens: int = 0, shared_prefix: bool = False,
                   truncation: Truncation | None = None, packing: str | bool = "auto") -> torch.Tensor:
    """(N, T) float32 token logprobs of `batch` under `model`, no grad, in micro-batches of at most
    micro_batch_size rows and (when > 0) micro_batch_tokens tokens, like the training forward:
    a token budget that bounds the backward must bound these forwards too. shared_prefix: each
    group's prompt forwarded once (rlvr.models.prefix). temperature, truncation: the sampling
    distribution scored (sampling.temperature, top_k / top_p). packing: algo.packing (rlvr.models.packed):
    padding-free forwards, logprobs on the response tokens only (0 elsewhere: the loss reads no others)."""
    return _batch_scores(model, batch, micro_batch_size, temperature, micro_batch_tokens, shared_prefix,
                         truncation, packing, with_entropy=False)[0]


@torch.no_grad()
def _batch_scores(model, batch: TrainingBatch, micro_batch_size: int, temperature: float, micro_batch_tokens: int,
                  shared_prefix: bool, truncation: Truncation | None, packing: str | bool, *, with_entropy: bool
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """batch_logprobs' forwards: (logprobs (N, T), token entropies (N, T) when with_entropy else None)."""
    was_training = model.training
    model.eval()
    seq_lens = batch.attention_mask.sum(-1).tolist()
    packed = use_packing(model, packing)
    prompts = row_prompts(batch.input_ids, batch.response_mask) if packed and shared_prefix else None
    chunks = micro_batches(seq_lens, max_rows=micro_batch_size, max_tokens=micro_batch_tokens, packed=packed,
                           prompts=prompts)
    widths = [max(seq_lens[c.start:c.stop]) for c in chunks]
    if packed:  # plans and tokens on the device before the loop, the result read back once after it
        device = next(model.parameters()).device
        varlen = use_varlen(model, packing)
        plans = [PackPlan.build(batch.attention_mask[c.start:c.stop, :w], batch.response_mask[c.start:c.stop, :w],
                                device, input_ids=batch.input_ids[c.start:c.stop, :w], share=shared_prefix,
                                varlen=varlen)
                 for c, w in zip(chunks, widths, strict=True)]
        ids, labels = batch.input_ids.to(device), batch.labels.to(device)
        out = torch.zeros(batch.labels.shape, dtype=torch.float32, device=device)
        ent = torch.zeros_like(out) if with_entropy else None
        for c, w, plan in zip(chunks, widths, plans, strict=True):
            scored = score_packed(model, ids[c.start:c.stop, :w], labels[c.start:c.stop, :w], plan,
                                  with_entropy=with_entropy, temperature=temperature, truncation=truncation)
            out[c.start:c.stop, :w] = scored.logprobs
            if ent is not None:
                ent[c.start:c.stop, :w] = scored.entropy
        model.train(was_training)
        return out.cpu(), None if ent is None else ent.cpu()
    out = torch.zeros(batch.labels.shape, dtype=torch.float32)
    ent = torch.zeros_like(out) if with_entropy else None
    for chunk, width in zip(chunks, widths, strict=True):
        mb = _narrow(_slice(batch, chunk), width)
        scored = score_rows(model, mb.input_ids, mb.labels, mb.attention_mask, mb.response_mask,
                            shared_prefix=shared_prefix, with_entropy=with_entropy, temperature=temperature,
                            truncation=truncation)
        out[chunk.start:chunk.stop, :width] = scored.logprobs.float().cpu()
        if ent is not None:
            ent[chunk.start:chunk.stop, :width] = scored.entropy.float().cpu()
    model.train(was_training)
    return out, ent


def forward_logprobs(model, batch: TrainingBatch, fwd: ForwardSpec) -> torch.Tensor:
    """batch_logprobs with the run's ForwardSpec (micro-batches, temperature, truncation, prefix, packing)."""
    return batch_logprobs(model, batch, fwd.micro_batch, fwd.temperature, fwd.micro_batch_tokens,
                          shared_prefix=fwd.shared_prefix, truncation=fwd.truncation, packing=fwd.packing)


def forward_entropy(model, batch: TrainingBatch, fwd: ForwardSpec) -> torch.Tensor:
    """(N, T) float32 token entropies of `batch` under `model` (the distribution the training forward scores),
    no grad, in the run's micro-batches, dropout off (as batch_logprobs)."""
    return _batch_scores(model, batch, fwd.micro_batch, fwd.temperature, fwd.micro_batch_tokens, fwd.shared_prefix,
                         fwd.truncation, fwd.packing, with_entropy=True)[1]


@dataclass
class Objective:
    """Everything variable in the loss, resolved from the `algo` section once, before the loop."""

    algo: object  # AlgoConfig
    group_size: int
    max_tokens: int
    plan: BatchPlan
    rollout_backend: str = "hf"  # rollout.backend: what algo.rollout_correction=auto resolves to
    truncation: Truncation | None = None  # sampling.top_k / top_p: every forward scores the truncated distribution
    # the most sampled (loss) tokens a response can have, when max_tokens does not bound them (a thinking
    # budget's reasoning + answer, an episode's model turns: rlvr.train.pg.loop.objective_length_cap); 0 = max_tokens
    loss_tokens: int = 0
    correction: str = field(init=False)  # algo.rollout_correction, auto resolved at construction
    _noted: bool = field(default=False, init=False, repr=False)

    def __post_init__(self):
        self.correction = resolve_rollout_correction(self.algo.rollout_correction,
                                                     self.rollout_backend)

    @property
    def norm_length(self) -> int:
        """Constant of seq_mean_token_sum_norm (Dr. GRPO): algo.norm_length, else the most sampled tokens a
        response can have (loss_tokens: sampling.thinking_budget + max_tokens, data.env_max_tokens), else
        sampling.max_tokens."""
        return self.algo.norm_length or self.loss_tokens or self.max_tokens

    @property
    def needs_reference(self) -> bool:
        return self.algo.kl_coef > 0

    def kl_forward(self, fwd: ForwardSpec) -> ForwardSpec | None:
        """The forward of the KL-in-the-reward penalty's policy side when it differs from the old logprobs'
        (algo.kl_in=reward under a sampler truncation: the penalty compares the models untruncated, the
        old logprobs of the ratio are truncated), else None (the old logprobs serve both)."""
        if self.algo.kl_coef > 0 and self.algo.kl_in == "reward" and fwd.truncation is not None \
                and fwd.truncation.active:
            return dataclasses.replace(fwd, truncation=None)
        return None

    @property
    def needs_old_logprobs(self) -> bool:
        """A no-grad forward before the first update. On-policy with one optimizer step per batch the
        old logprobs equal logp.detach() of the training forward (same numbers, one forward saved),
        unless the KL goes into the reward, which needs them before the first training forward."""
        a = self.algo
        return not (self.plan.on_policy and a.reuse_logprobs_on_policy and a.kl_in != "reward")

    @functools.cached_property
    def parts(self) -> LossParts:
        return LossParts.from_algo(self.algo, correction=self.correction)

    @property
    def entropy_quantile(self) -> float:
        """algo.entropy_mask_quantile: the share of response tokens (top by entropy) the policy term trains on."""
        return self.algo.entropy_mask_quantile

    def select_tokens(self, model, mb: Minibatch, fwd: ForwardSpec) -> Minibatch:
        """mb with policy_keep set to its top-q response tokens by the current policy's entropy (q =
        algo.entropy_mask_quantile; rlvr.algo.high_entropy_mask) when q < 1, else mb itself. Called once per
        minibatch, before its micro-batches (and before a data-parallel or sharded learner splits it): the
        threshold is one number over the whole minibatch, so the gradient does not depend on the split. The
        entropies come from a no-grad forward at the weights the minibatch's gradient is taken at (no
        optimizer step happens inside a minibatch), dropout off."""
        q = self.entropy_quantile
        if q >= 1:
            return mb
        entropy = forward_entropy(model, mb.batch, fwd)
        keep, _ = high_entropy_mask(entropy, mb.batch.response_mask, q)
        return dataclasses.replace(mb, policy_keep=keep)

    def correction_note(self, batch: TrainingBatch | None) -> str | None:
        """A status line, the first time only, when the correction is on but the generator gave no sampler
        logprobs: those rows are trained with weight 1 (no correction), which is not an error."""
        if self.correction == "none" or batch is None or batch.sampler_logprobs is not None or self._noted:
            return None
        self._noted = True
        return (f"note: algo.rollout_correction={self.correction}, but the generator returned no sampler logprobs: "
                "those rollouts are trained without the correction (weight 1)")

    @property
    def needs_critic(self) -> bool:
        return self.algo.advantage == "gae"

    @property
    def needs_steps(self) -> bool:
        """algo.advantage=process: the targets need each kept rollout's step rewards and step ends."""
        return self.algo.advantage == "process"

    def step_marks(self, rollouts, rewards, kept, tokenizer):
        """The kept rows' rlvr.train.pg.process.StepMarks (step rewards, step ends as token positions)
        when the targets need them, else None."""
        if not self.needs_steps:
            return None
        rows = kept.tolist()
        return step_marks([rollouts[i] for i in rows], [rewards[i] for i in rows], tokenizer)

    @functools.cached_property
    def shaping(self) -> Shaping:
        return Shaping.of(self.algo, self.group_size, self.max_tokens)

    @functools.cached_property
    def settings(self) -> TargetSettings:
        """The algo keys the target functions read, as plain values."""
        return TargetSettings.of(self.algo)

    def advantages(self, rewards: list[Reward], lengths: torch.Tensor, step: int | None = None):
        """(shaped rewards (N,), advantages (N,), keep (N,) bool, share of zero-variance groups)."""
        return self.shaping(rewards, lengths, step)

    def targets(self, adv, mask, old_logp=None, ref_logp=None, old_values=None, steps=None) -> Targets:
        """Per-row advantages (B,) -> the loss's targets: GAE with the critic's values when
        algo.advantage=gae, per-step rewards (steps: StepMarks) when algo.advantage=process
        (rlvr.train.pg.process.process_targets), else token_advantages (KL in the reward, whitening)."""
        if self.needs_steps:
            return process_targets(adv, mask, steps, self.settings, self.group_size, old_logp, ref_logp)
        if self.needs_critic:
            if old_values is None:
                raise ValueError("algo.advantage='gae' needs the critic's values of the batch")
            return gae_targets(adv, mask, old_values, self.settings, old_logp, ref_logp)
        return Targets(advantages=self.token_advantages(adv, mask, old_logp, ref_logp))

    def token_advantages(self, adv, mask, old_logp=None, ref_logp=None) -> torch.Tensor:
        return token_advantages(adv, mask, self.settings, old_logp, ref_logp)
