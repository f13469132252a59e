"""Policy-gradient training, the GRPO family: `rlvr train`.

One step, in the order data flows (`train` below reads top to bottom the same way):

    prompts (n_prompts)  -> generator.generate(SamplingSpec(n=G, seed=step_seed(seed, step)))
    rollouts (n_prompts*G) -> reward_fn(response, example) -> Reward(total, parts, status)
    rewards (+ optional length term) -> advantages (ADVANTAGE_ESTIMATORS[algo.advantage])
    old logprobs: one no-grad forward per rollout batch, reused by every epoch and minibatch
      (on-policy with one optimizer step per batch they equal logp.detach() of the training
      forward, which we then use instead: same numbers, one forward saved; not with kl_in=reward)
    reference logprobs (only when algo.kl_coef > 0): a frozen copy of the start policy, replaced
      by the current policy every algo.ref_refresh_every steps. The old policy (ratio denominator,
      how stale the samples are) and the reference policy (KL anchor) are different things.
    token advantages (token_advantages): with algo.kl_in=reward add the reward-to-go of
      -kl_coef * KL(old || ref) per token; with algo.whiten_advantages whiten over valid tokens
    epochs x minibatches (one optimizer step each) x micro-batches (one backward each):
      per-token loss (POLICY_LOSSES) [+ kl_coef * KL if kl_in=loss] [- entropy_coef * H] -> aggregation with
      normalizers of the whole minibatch (LOSS_AGGREGATIONS) -> backward; clip; AdamW step
    generator.update_weights(policy weights, version = step)

Metrics, samples, checkpoints and plots go to the run directory (rlvr.runs).
"""

from __future__ import annotations

import copy
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.algo import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    compute_advantages,
    dapo_overlong_penalty,
    kimi_length_reward,
    kl_estimate,
    kl_shaped_rewards,
    loss_normalizers,
    masked_mean,
    policy_loss,
    whiten,
)
from rlvr.algo.advantages import ADVANTAGE_ESTIMATORS
from rlvr.models import TrainingBatch, score_tokens
from rlvr.rewards.types import Reward, Status
from rlvr.train.batching import BatchPlan, plan_batches, split_indices
from rlvr.train.common import (
    clip_and_step,
    eval_prefixed,
    finish_run,
    optimizer_from_config,
    policy_from_config,
    quiet_transformers,
    step_seed,
    take,
)
from rlvr.train.config import AlgoConfig, TrainConfig

# --------------------------------------------------------------------------------- validation


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


def validate_train_config(cfg: TrainConfig) -> BatchPlan:
    """Every cross-field check of a TrainConfig, before any work. Raises ValueError naming the key."""
    a, s = cfg.algo, cfg.sampling
    registries = [
        ("algo.advantage", a.advantage, ADVANTAGE_ESTIMATORS),
        ("algo.loss", a.loss, POLICY_LOSSES),
        ("algo.aggregation", a.aggregation, LOSS_AGGREGATIONS),
        ("algo.kl_estimator", a.kl_estimator, KL_ESTIMATORS),
        ("algo.length_reward", a.length_reward, LENGTH_REWARDS),
    ]
    for key, value, reg in registries:
        if value not in reg:
            raise ValueError(f"{key}={value!r} is unknown; known: {', '.join(repr(k) for k in sorted(reg))}")
    if a.adv_std not in ("population", "sample"):
        raise ValueError(f"algo.adv_std={a.adv_std!r}: use 'population' or 'sample'")
    if s.group_size < 2 and a.advantage != "no_baseline":
        raise ValueError(
            f"sampling.group_size={s.group_size}: the {a.advantage!r} advantage compares responses within a "
            "group, so every advantage would be 0; use sampling.group_size >= 2 or algo.advantage=no_baseline"
        )
    if not 0 <= a.clip_low < 1:
        raise ValueError(f"algo.clip_low={a.clip_low} must be in [0, 1)")
    if a.clip_high < 0:
        raise ValueError(f"algo.clip_high={a.clip_high} must be >= 0")
    if a.dual_clip and a.dual_clip <= 1:
        raise ValueError(f"algo.dual_clip={a.dual_clip} must be > 1 (or 0 = off)")
    if a.kl_coef < 0 or a.entropy_coef < 0 or a.length_reward_coef < 0:
        raise ValueError("algo.kl_coef, algo.entropy_coef and algo.length_reward_coef must be >= 0")
    if a.kl_in not in ("loss", "reward"):
        raise ValueError(f"algo.kl_in={a.kl_in!r}: use 'loss' or 'reward'")
    if a.kl_in == "reward" and a.kl_coef == 0:
        # refused rather than a silent no-op: whoever sets kl_in=reward expects a KL penalty
        raise ValueError("algo.kl_in='reward' with algo.kl_coef=0 shapes nothing; set algo.kl_coef > 0 "
                         "(or leave algo.kl_in=loss)")
    if a.loss == "kimi" and (a.kl_in == "reward" or a.whiten_advantages):
        raise ValueError(
            "algo.loss='kimi' needs one advantage per response (A_i = r_i - tau log Z); algo.kl_in=reward "
            "and algo.whiten_advantages make per-token advantages, so use them with another algo.loss"
        )
    if a.ref_refresh_every < 0:
        raise ValueError(f"algo.ref_refresh_every={a.ref_refresh_every} must be >= 0")
    if a.length_reward == "dapo_overlong" and not 0 < a.overlong_buffer <= s.max_tokens:
        raise ValueError(
            f"algo.overlong_buffer={a.overlong_buffer} must be in (0, sampling.max_tokens={s.max_tokens}]"
        )
    if s.temperature <= 0:
        raise ValueError(f"sampling.temperature={s.temperature}: RL needs sampling (> 0); greedy has no spread")
    if cfg.run.steps < 1:
        raise ValueError(f"run.steps={cfg.run.steps} must be >= 1")
    if cfg.optim.lr <= 0:
        raise ValueError(f"optim.lr={cfg.optim.lr} must be > 0")
    return plan_batches(s.n_prompts, s.group_size, a.train_batch_size, a.micro_batch_size, a.epochs_per_rollout_batch)


# ------------------------------------------------------------------------------------- records


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


# ------------------------------------------------------------------------------ loss, gradients


def micro_batch_loss(
    model,
    batch: TrainingBatch,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    norm,
    algo: AlgoConfig,
    *,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch, already divided by the minibatch's global normalizers, so that
    summing backward() over the micro-batches of a minibatch gives the minibatch gradient.

    batch: (b, T) tensors; advantages (b,) or (b, T) per token; old_logp, ref_logp (b, T) or None (old None = on-policy:
    logp.detach() is used). Returns (loss scalar, detached stats).
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    advantages = advantages.to(device)
    out = score_tokens(
        model,
        batch.input_ids,
        batch.labels,
        batch.attention_mask,
        with_entropy=True,
        temperature=temperature,
    )
    logp, entropy = out.logprobs, out.entropy  # (b, T) each
    mask = batch.response_mask
    old = logp.detach() if old_logp is None else old_logp.to(device)
    if ref_logp is not None:
        ref_logp = ref_logp.to(device)
    per_token, meta = policy_loss(
        algo.loss,
        logp,
        old,
        advantages,
        mask,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        dual_clip=algo.dual_clip or None,
        tau=algo.kimi_tau,
    )
    stats = {k: v.detach() for k, v in meta.items()}
    if algo.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("algo.kl_coef > 0 needs reference logprobs")
        if algo.kl_in == "reward":
            # the penalty is already in the advantages (token_advantages); only the metric here,
            # with the same meaning as in the loss mode: KL of the current policy to the reference
            kl = kl_estimate(algo.kl_estimator, logp.detach(), ref_logp)  # (b, T)
        else:
            kl = kl_estimate(algo.kl_estimator, logp, ref_logp)  # (b, T)
            per_token = per_token + algo.kl_coef * kl
        stats["kl"] = masked_mean(kl.detach(), mask)
    if algo.entropy_coef > 0:
        per_token = per_token - algo.entropy_coef * entropy
    stats["entropy"] = masked_mean(entropy.detach(), mask)
    stats["row_entropy"] = masked_mean(entropy.detach(), mask, dim=-1)  # (b,) mean entropy per response
    loss = LOSS_AGGREGATIONS[algo.aggregation](per_token, mask, norm)
    return loss, stats


def accumulate_gradients(
    model,
    batch: TrainingBatch,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    algo: AlgoConfig,
    *,
    micro_batch_size: int,
    norm_length: int,
    temperature: float = 1.0,
    stats: StepStats | None = None,
    row_entropy: dict[int, float] | None = None,
    row_ids: Sequence[int] | None = None,
) -> float:
    """Backward over one minibatch (b rows) in micro-batches; returns the minibatch loss.

    The aggregation normalizers come from the whole minibatch's mask, so the accumulated gradient
    does not depend on micro_batch_size. Gradients are added to .grad (the caller zeroes them).
    row_entropy, if given, receives the mean token entropy of each row, keyed by row_ids[row]
    (default: the row's index in `batch`).
    """
    norm = loss_normalizers(batch.response_mask, constant=float(norm_length) if norm_length else None)
    total = 0.0
    n = batch.input_ids.shape[0]
    for chunk in split_indices(n, micro_batch_size):
        idx = torch.arange(chunk.start, chunk.stop)
        mb = batch.rows(idx)
        loss, meta = micro_batch_loss(
            model,
            mb,
            advantages[idx],
            None if old_logp is None else old_logp[idx],
            None if ref_logp is None else ref_logp[idx],
            norm,
            algo,
            temperature=temperature,
        )
        loss.backward()
        total += float(loss.detach())
        ent = meta.pop("row_entropy")
        if row_entropy is not None:
            for j, e in zip(idx.tolist(), ent.tolist(), strict=True):
                row_entropy[row_ids[j] if row_ids is not None else j] = e
        if stats is not None:
            w = float(mb.response_mask.sum())
            for k, v in meta.items():
                if k in ("ratio_min", "ratio_max"):
                    stats.extreme(k, float(v))
                else:
                    stats.add(k, float(v), w)
    return total


@torch.no_grad()
def batch_logprobs(model, batch: TrainingBatch, micro_batch_size: int, temperature: float = 1.0) -> torch.Tensor:
    """(N, T) token logprobs of `batch` under `model`, no grad, in micro-batches."""
    was_training = model.training
    model.eval()
    out = score_tokens(
        model,
        batch.input_ids,
        batch.labels,
        batch.attention_mask,
        micro_batch_size=micro_batch_size,
        temperature=temperature,
    ).logprobs
    model.train(was_training)
    return out


# ------------------------------------------------------------------------------------- scoring


def score_rollouts(rollouts, examples, reward_fn, *, workers: int = 1, timeout_s: float = 0.0,
                   isolate: bool = False) -> list[Reward]:
    """Task rewards of each rollout through rlvr.rewards.score_batch: hard deadlines, and a timeout
    or a crash becomes a TIMEOUT / ERROR status that is counted (verifier/*), never a silent 0."""
    from rlvr.rewards import score_batch

    return score_batch(reward_fn, [r.text for r in rollouts], list(examples), workers=workers,
                       timeout_s=timeout_s or None, isolate=isolate)


def shape_and_advantage(
    rewards: list[Reward], lengths: torch.Tensor, algo: AlgoConfig, group_size: int, max_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(shaped rewards (N,), advantages (N,), keep (N,) bool, share of zero-variance groups)."""
    total = torch.tensor([r.total for r in rewards], dtype=torch.float32)  # (N,)
    correct = torch.tensor([r.status is Status.CORRECT for r in rewards])
    term = LENGTH_REWARDS[algo.length_reward](
        lengths, correct, group_size=group_size, max_tokens=max_tokens, buffer=algo.overlong_buffer
    )
    shaped = total + algo.length_reward_coef * term.float()
    adv = compute_advantages(algo.advantage, shaped, group_size, eps=algo.adv_eps, std=algo.adv_std)
    groups = total.view(-1, group_size)
    zero_var = (groups.max(dim=1).values == groups.min(dim=1).values)  # (n_prompts,)
    keep = torch.ones_like(total, dtype=torch.bool)
    if algo.filter_zero_variance:
        keep = (~zero_var).repeat_interleave(group_size)
    return shaped, adv, keep, float(zero_var.float().mean())


def kl_reward_to_go(kl: torch.Tensor, coef: float, mask: torch.Tensor) -> torch.Tensor:
    """Reward-to-go (gamma = 1) of the per-token KL penalty: out[b, t] = sum_{t' >= t, valid} -coef * kl[b, t'].

    kl (B, T) any KL_ESTIMATORS value (detached), mask (B, T) response tokens -> (B, T) float, 0 where
    mask == 0. The per-token rewards come from rlvr.algo.kl_shaped_rewards with zero outcome rewards:
    the outcome part of the return is the estimator's advantage, added by token_advantages.
    """
    r = kl_shaped_rewards(torch.zeros(kl.shape[0], device=kl.device), kl, coef, mask)  # (B, T), 0 off mask
    rtg = r.flip(-1).cumsum(-1).flip(-1)  # (B, T); prompt positions would hold the whole sum
    return torch.where(mask != 0, rtg, torch.zeros((), device=rtg.device))


def token_advantages(
    adv: torch.Tensor,
    mask: torch.Tensor,
    algo: AlgoConfig,
    old_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """Final advantages of the rows that are trained: (B,) unchanged with the defaults, else (B, T).

    adv (B,) from the outcome estimator; mask (B, T) response tokens; old_logp, ref_logp (B, T),
    needed only with algo.kl_in == "reward". Then A[b, t] = adv[b] + sum_{t' >= t} -kl_coef * kl[b, t']
    with kl = algo.kl_estimator(old_logp, ref_logp) on the sampled tokens. With algo.whiten_advantages
    the result is whitened over all valid tokens of the batch (rlvr.algo.whiten: population std,
    eps 1e-8 inside the sqrt); masked-out tokens get 0.
    """
    out = adv
    if algo.kl_in == "reward":
        if old_logp is None or ref_logp is None:
            raise ValueError("algo.kl_in='reward' needs old and reference logprobs")
        # on the mask's device (the CPU in the loop): logprobs may come from an accelerator
        kl = kl_estimate(algo.kl_estimator, old_logp.detach().to(mask.device), ref_logp.detach().to(mask.device))
        out = adv.unsqueeze(1) + kl_reward_to_go(kl, algo.kl_coef, mask)
        out = torch.where(mask != 0, out, torch.zeros((), device=out.device))
    if algo.whiten_advantages:
        out = whiten(torch.broadcast_to(out.unsqueeze(1), mask.shape) if out.dim() == 1 else out, mask)
    return out


# ----------------------------------------------------------------------------------- the loop


@dataclass
class TrainResult:
    """What `train` returns: where the run is and its last metrics."""

    run_dir: Path
    steps: int
    last_metrics: dict[str, Any]
    eval: dict[str, float] = field(default_factory=dict)


def _ref_path(run_path: Path, step: int) -> Path:
    return run_path / "ref_policy" / f"step_{step:06d}.pt"


def _save_ref(ref_model, run_path: Path, step: int, keep_from: int) -> None:
    """Snapshot the refreshed reference (checkpoints hold only the policy), so a resume from any
    checkpoint restores the reference the uninterrupted run had then. Snapshots older than
    `keep_from` (the refresh step of the newest checkpoint) can never be needed and are deleted."""
    path = _ref_path(run_path, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(ref_model.state_dict(), tmp)
    os.replace(tmp, path)
    for old in path.parent.glob("step_*.pt"):
        if int(old.stem.split("_")[1]) < keep_from:
            old.unlink(missing_ok=True)


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    data=None,
    on_step: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Run policy-gradient training as configured; resume=True continues cfg.run.out_dir from its
    latest checkpoint. data: optional TaskData (train/eval examples, prompts, reward fn) to use
    instead of loading cfg.data (the demo and tests pass one). Returns TrainResult."""
    from rlvr.rollout import HFGenerator, SamplingSpec
    from rlvr.rollout.batch import rollouts_to_batch
    from rlvr.runs import checkpoint as ckpt_mod
    from rlvr.runs.progress import Progress
    from rlvr.runs.rundir import RunDir
    from rlvr.runtime import seed_everything, set_num_threads
    from rlvr.train.tasks import eval_policy, load_task_data

    plan = validate_train_config(cfg)
    set_num_threads(cfg.run.num_threads or None)
    seed_everything(cfg.run.seed)
    quiet_transformers()
    a, s, r = cfg.algo, cfg.sampling, cfg.run

    model, tokenizer = policy_from_config(cfg.model, seed=cfg.run.seed)
    task = data if data is not None else load_task_data(cfg.data, tokenizer)
    optimizer, scheduler = optimizer_from_config(
        model, cfg.optim, total_steps=r.steps * plan.optimizer_steps_per_rollout_batch
    )
    ref_model = None
    if a.kl_coef > 0:
        ref_model = copy.deepcopy(model).eval()
        ref_model.requires_grad_(False)

    # ---- run directory: new, or reopened at its last checkpoint
    start_step, data_pos = 0, 0
    if resume:
        state = ckpt_mod.load_checkpoint(r.out_dir, model=model, optimizer=optimizer, scheduler=scheduler)
        start_step, data_pos = int(state["step"]), int(state["data_pos"])
        run = RunDir.resume(r.out_dir, start_step)
        if ref_model is not None and a.ref_refresh_every:
            # the reference of step s is the policy of the last refresh step <= s
            ref_step = start_step - start_step % a.ref_refresh_every
            ref_model.load_state_dict(torch.load(_ref_path(run.path, ref_step), weights_only=True))
    else:
        run = RunDir.create(r.out_dir, config=cfg, exist_ok=r.overwrite)
        if ref_model is not None and a.ref_refresh_every:
            _save_ref(ref_model, run.path, 0, keep_from=0)

    last_ckpt = start_step  # step of the newest checkpoint on disk
    generator = HFGenerator(model, tokenizer, batch_size=max(64, s.n_prompts * s.group_size))
    max_tokens = s.max_tokens
    norm_length = a.norm_length or max_tokens
    last: dict[str, Any] = {}
    progress = Progress(r.steps, "rl", start=start_step, mode=None if r.progress else "off")
    try:
        for step in range(start_step + 1, r.steps + 1):
            t_step = time.perf_counter()
            # ---- 1. sample n_prompts x G rollouts from the current policy
            examples = take(task.train, data_pos, s.n_prompts, cfg.data.seed)
            data_pos += s.n_prompts
            prompts = [task.prompt(ex) for ex in examples]
            spec = SamplingSpec(
                n=s.group_size,
                temperature=s.temperature,
                top_p=s.top_p,
                max_tokens=max_tokens,
                stop=tuple(s.stop),
                seed=step_seed(r.seed, step),
            )
            model.eval()
            t0 = time.perf_counter()
            rollouts = generator.generate(prompts, spec)
            t_gen = time.perf_counter() - t0
            ro_examples = [examples[ro.group] for ro in rollouts]

            # ---- 2. score, shape, advantages
            t0 = time.perf_counter()
            rewards = score_rollouts(rollouts, ro_examples, task.reward_fn, workers=cfg.data.reward_workers,
                                     timeout_s=cfg.data.reward_timeout_s, isolate=cfg.data.reward_isolate)
            lengths = torch.tensor([len(ro.response_ids) for ro in rollouts], dtype=torch.float32)
            shaped, adv, keep, zero_var = shape_and_advantage(rewards, lengths, a, s.group_size, max_tokens)
            t_score = time.perf_counter() - t0

            # ---- 3. old and reference logprobs (no grad, once per rollout batch)
            t0 = time.perf_counter()
            model.train()
            kept = torch.nonzero(keep).squeeze(1)
            stats = StepStats()
            grad_norms: list[float] = []
            row_entropy: dict[int, float] = {}  # rollout index -> mean token entropy (nats)
            losses: list[float] = []
            if kept.numel() > 0:
                batch = rollouts_to_batch([rollouts[i] for i in kept.tolist()], tokenizer.pad_token_id)
                # KL in the reward needs the old logprobs before the first training forward
                reuse = plan.on_policy and a.reuse_logprobs_on_policy and a.kl_in != "reward"
                old_logp = None if reuse else batch_logprobs(model, batch, plan.micro_batch, s.temperature)
                ref_logp = None
                if ref_model is not None:
                    ref_logp = batch_logprobs(ref_model, batch, plan.micro_batch, s.temperature)
                kadv = token_advantages(adv[kept], batch.response_mask, a, old_logp, ref_logp)  # (B,) or (B, T)

                # ---- 4. epochs x minibatches x micro-batches; one optimizer step per minibatch
                n_kept = kept.numel()
                for epoch in range(plan.epochs):
                    if plan.epochs > 1 or plan.train_batch < n_kept:
                        g = torch.Generator().manual_seed(step_seed(r.seed, step) + epoch)
                        order = torch.randperm(n_kept, generator=g)
                    else:
                        order = torch.arange(n_kept)
                    for chunk in split_indices(n_kept, plan.train_batch):
                        idx = order[chunk.start : chunk.stop]
                        loss = accumulate_gradients(
                            model,
                            batch.rows(idx),
                            kadv[idx],
                            None if old_logp is None else old_logp[idx],
                            None if ref_logp is None else ref_logp[idx],
                            a,
                            micro_batch_size=plan.micro_batch,
                            norm_length=norm_length,
                            temperature=s.temperature,
                            stats=stats,
                            row_entropy=row_entropy,
                            row_ids=kept[idx].tolist(),
                        )
                        losses.append(loss)
                        grad_norms.append(clip_and_step(model, optimizer, scheduler, cfg.optim.grad_clip))
            t_train = time.perf_counter() - t0

            # ---- 5. the generator gets the new weights
            t0 = time.perf_counter()
            generator.update_weights(model.named_parameters(), version=step)
            if ref_model is not None and a.ref_refresh_every and step % a.ref_refresh_every == 0:
                ref_model.load_state_dict(model.state_dict())
                _save_ref(ref_model, run.path, step, keep_from=last_ckpt - last_ckpt % a.ref_refresh_every)
            t_sync = time.perf_counter() - t0

            # ---- 6. metrics, samples, evaluation, checkpoint
            metrics = step_metrics(rewards, rollouts, shaped, zero_var, keep, stats, losses, grad_norms)
            metrics["lr"] = scheduler.get_last_lr()[0]
            n_tokens = int(lengths.sum())
            wall = time.perf_counter() - t_step
            metrics.update(
                {
                    "time/generate": t_gen,
                    "time/score": t_score,
                    "time/train": t_train,
                    "time/sync": t_sync,
                    "tokens_per_s": n_tokens / max(wall, 1e-9),
                }
            )
            if (r.eval_every and step % r.eval_every == 0) or step == r.steps:
                ev = eval_policy(generator, task, cfg, greedy=r.eval_greedy, step=step)
                metrics.update(eval_prefixed(ev))
            if r.log_samples_every and (step % r.log_samples_every == 0 or step == 1):
                run.log_samples(step, _samples(rollouts, ro_examples, rewards, r.num_log_samples, s.group_size, row_entropy))
            last = run.log_metrics(step, metrics)
            progress.update(1, reward=metrics["reward/mean"], acc=metrics["accuracy"], loss=metrics.get("loss"))
            if on_step is not None:
                on_step(step, metrics)
            if step == r.steps or (r.checkpoint_every and step % r.checkpoint_every == 0):
                ckpt_mod.save_checkpoint(
                    run,
                    step,
                    model=model,
                    tokenizer=tokenizer,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    trainer_state={"data_pos": data_pos},
                    keep=r.keep_checkpoints,
                )
                last_ckpt = step
                if r.debug_kill_at_step and step == r.debug_kill_at_step:
                    run.close()
                    os.kill(os.getpid(), signal.SIGKILL)  # test hook: die like a preempted job
    finally:
        progress.close()
        run.close()
    return TrainResult(run_dir=run.path, steps=r.steps, last_metrics=last, eval=finish_run(run.path, last))


def step_metrics(rewards, rollouts, shaped, zero_var, keep, stats: StepStats, losses, grad_norms) -> dict:
    """Per-step training metrics (names follow the schema of rlvr.runs.plots / docs/runs.md)."""
    n = len(rewards)
    m: dict[str, Any] = {"reward/mean": sum(r.total for r in rewards) / n}
    if not torch.equal(shaped, torch.tensor([r.total for r in rewards], dtype=torch.float32)):
        m["reward/shaped"] = float(shaped.mean())
    parts = sorted({k for r in rewards for k in r.parts})
    for p in parts:
        m[f"reward/{p}"] = sum(float(r.parts.get(p, 0.0)) for r in rewards) / n
    correct = [r.status is Status.CORRECT for r in rewards]
    m["accuracy"] = sum(correct) / n
    m["format_rate"] = sum(r.formatted for r in rewards) / n
    lens = [len(ro.response_ids) for ro in rollouts]
    m["len/mean"] = sum(lens) / n
    lc = [x for x, c in zip(lens, correct, strict=True) if c]
    li = [x for x, c in zip(lens, correct, strict=True) if not c]
    m["len/correct"] = sum(lc) / len(lc) if lc else None
    m["len/incorrect"] = sum(li) / len(li) if li else None
    m["len/truncated_frac"] = sum(ro.finish_reason == "length" for ro in rollouts) / n
    m["zero_var_groups"] = zero_var
    m["kept_frac"] = float(keep.float().mean())
    m["verifier/timeouts"] = sum(r.status is Status.TIMEOUT for r in rewards)
    m["verifier/errors"] = sum(r.status is Status.ERROR for r in rewards)
    m["loss"] = sum(losses) / len(losses) if losses else None
    m["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else None
    means = stats.means()
    m["entropy"] = means.get("entropy")
    m["kl"] = means.get("kl")
    m["clip_frac/low"] = means.get("clip_frac_low")
    m["clip_frac/high"] = means.get("clip_frac_high")
    m["ratio/mean"] = means.get("ratio_mean")
    m["ratio/min"] = stats.mins.get("ratio_min")
    m["ratio/max"] = stats.maxs.get("ratio_max")
    return {k: v for k, v in m.items() if v is not None}


def _samples(rollouts, examples, rewards, k: int, group_size: int, row_entropy: dict[int, float]) -> list[dict]:
    """First response of the first k groups: prompt, response, reference, reward parts, status,
    mean token entropy (nats; None for rows dropped before training)."""
    out = []
    for i in range(0, min(len(rollouts), k * group_size), group_size):
        ro, ex, rw = rollouts[i], examples[i], rewards[i]
        out.append(
            {
                "prompt": ro.prompt,
                "response": ro.text,
                "reference": ex.reference,
                "reward": rw.total,
                "parts": dict(rw.parts),
                "status": rw.status.value,
                "length": len(ro.response_ids),
                "entropy": row_entropy.get(i),
                "mean_logprob": (sum(ro.logprobs) / max(1, len(ro.logprobs))) if ro.logprobs else None,
            }
        )
    return out
