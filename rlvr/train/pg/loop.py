"""Policy-gradient training, the GRPO family: `rlvr train`.

Everything variable is resolved before the loop: the task (prompt contract, reward), the objective
(rlvr.train.pg.objective.Objective), the learner (optimizer and schedule, reference policy, critic, the
forward spec, the gradient function: one process or data-parallel workers), the generator (hf or
vllm, in-process or Ray actors: rlvr.distributed) and the rollout source (synchronous, environment
episodes, sampling ahead or partial rollouts: rlvr.train.pg.rollout_source). One step then reads as the
documents' pseudocode:

    sampled = source.collect(step, data_pos, timer)     # rollouts, rewards (never raise), advantages
    batch   = rollouts_to_batch(kept rollouts)          # the rows that enter the loss
    learned = learn(learner, batch, ...)     # old/ref logprobs once, then epochs x minibatches x micro-batches
    source.after_update(step, model)         # weights to the engine (rollouts carry their version), push check
    loop.log(step, metrics); loop.checkpoint(step, ...)

Metrics, samples, checkpoints and plots go to the run directory (rlvr.runs).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.algo import Truncation
from rlvr.distributed import build_placement
from rlvr.models.packed import use_packing
from rlvr.rewards.judge import judge_metrics
from rlvr.rewards.types import Status
from rlvr.rollout import rollouts_to_batch
from rlvr.rollout.types import sampled_length, sampled_mean_logprob, unsampled_length
from rlvr.runtime import FlopCounter, memory_stats, peak_tflops, reset_peak_memory
from rlvr.train import session
from rlvr.train.batching import BatchPlan, ForwardSpec, minibatch_rows, split_indices
from rlvr.train.config import TrainConfig
from rlvr.train.optimizer import clip_and_step, optimizer_from_config
from rlvr.train.pg import sharded
from rlvr.train.pg.critic import Critic
from rlvr.train.pg.curriculum import ProblemSource
from rlvr.train.pg.objective import (
    Minibatch,
    Objective,
    StepStats,
    accumulate_gradients,
    forward_logprobs,
)
from rlvr.train.pg.reference import ReferencePolicy, load_teacher
from rlvr.train.pg.rollout_source import Sampled, build_rollout_source, training_rows
from rlvr.train.session import (
    Timer,
    TrainResult,
    eval_prefixed,
    reward_error_log,
    sample_metrics,
    step_seed,
)
from rlvr.train.tasks import eval_policy

# --------------------------------------------------------------------------------- validation


def validate_train_config(cfg: TrainConfig) -> BatchPlan:
    """Every cross-field check of a TrainConfig (TrainConfig.validate, which rlvr.config already ran for a
    loaded config) and its batch plan, before any work. Raises ConfigError naming the key."""
    cfg.validate()
    return cfg.batch_plan()


def objective_length_cap(cfg: TrainConfig) -> int:
    """TrainConfig.loss_length_cap(): the most sampled tokens one response can have when sampling.max_tokens
    does not bound them, else 0 (Dr. GRPO's constant takes it)."""
    return cfg.loss_length_cap()


# ------------------------------------------------------------------------------------- records


@dataclass
class Learned:
    """What one learner update over a rollout batch produced."""

    losses: list[float] = field(default_factory=list)  # one per optimizer step
    grad_norms: list[float] = field(default_factory=list)  # one per optimizer step, before clipping
    stats: StepStats = field(default_factory=StepStats)  # token-weighted loss statistics
    row_entropy: dict[int, float] = field(default_factory=dict)  # rollout index -> mean token entropy
    trained_tokens: int = 0  # real (unpadded) tokens through the training forward, all epochs
    critic_grad_norms: list[float] = field(default_factory=list)  # PPO: one per optimizer step
    extra: dict[str, float] = field(default_factory=dict)  # more step metrics (critic/explained_var, ...)


@dataclass
class Learner:
    """The learner's side of a run, resolved before the loop (build_learner)."""

    model: Any
    optimizer: Any
    scheduler: Any
    objective: Objective
    reference: ReferencePolicy
    critic: Critic | None  # PPO's value model (algo.critic), None without one
    forward: ForwardSpec  # how every forward of a rollout batch runs
    grad_fn: Callable  # accumulate_gradients, or the data-parallel workers' (rlvr.distributed.dp), or the shards'
    grad_clip: float
    seed: int  # run.seed: each step's minibatch order is drawn from step_seed(seed, step) + epoch
    step_fn: Callable = clip_and_step  # clip and step (the sharded learner's: rlvr.train.pg.sharded.clip_and_step)

    def extras(self) -> dict:
        """Checkpoint extras of the learner: the critic's head, trunk and optimizer."""
        return {"critic": self.critic} if self.critic is not None else {}

    def flop_counter(self) -> FlopCounter:
        """The FLOP counter over the policy's forwards and the reference's (a LoRA reference is the policy itself
        with its adapter off: counted once)."""
        ref = self.reference.model
        return FlopCounter(self.model, None if ref is None or ref is self.model else ref)


def compile_layout_warning(cfg: TrainConfig, model) -> str | None:
    """What model.compile_layers costs on the layout the learner will run, when it is not the packed one it is made
    for. The shared-prefix cascade (algo.shared_prefix with packing off: the CPU default, or a model the packed
    forward does not support) calls each layer with the prompt's KV cache being filled and then with the cascade's
    per-shape masks, and dynamo guards on both: a 2-layer model's layers compiled 4 times per grad mode (8 when old
    or reference logprobs are scored too: dynamo's default recompile limit, past which a layer runs eager), 74 s
    before the first step of `rlvr train` on CPU, against one compile packed (30 s)."""
    a = cfg.algo
    if not cfg.model.compile_layers or not a.shared_prefix or use_packing(model, a.packing):
        return None
    return ("model.compile_layers=true with algo.shared_prefix's cascade (algo.packing is off here): dynamo compiles "
            "the layers several times (the prompt's KV cache and the cascade's masks are guarded: 4 graphs per grad "
            "mode for a 2-layer model, 8 is its recompile limit), a minute or more before the first step on a CPU; "
            "set algo.packing=true "
            "(the layout compile_layers is made for, auto on CUDA) or algo.shared_prefix=false")


def build_learner(cfg: TrainConfig, model, objective: Objective, plan: BatchPlan, placement, shards=None,
                  tokenizer=None) -> Learner:
    """Reference policy, critic, optimizer and schedule (over run.steps x optimizer steps per rollout batch),
    the forward spec and the gradient function (distributed.num_learners > 1: data-parallel workers;
    shards, distributed.learner=fsdp2: the policy and reference sharded in place, rlvr.train.pg.sharded)."""
    a, s = cfg.algo, cfg.sampling
    if why := compile_layout_warning(cfg, model):
        warnings.warn(why, stacklevel=2)
    teacher = load_teacher(cfg.teacher, cfg.model, tokenizer) if objective.needs_reference else None
    reference = ReferencePolicy(model, enabled=objective.needs_reference, refresh_every=a.ref_refresh_every,
                                teacher=teacher,  # teacher.model: on-policy distillation
                                persist=shards is None)  # (a sharded reference is not saved whole)
    critic = (Critic(model, mode=a.critic, lr=a.critic_lr or cfg.optim.lr, grad_clip=cfg.optim.grad_clip)
              if objective.needs_critic else None)
    grad_fn, step_fn = placement.learners(model, accumulate_gradients) or accumulate_gradients, clip_and_step
    if shards is not None:
        sharded.shard(model, cfg.model)
        if reference.model is not None and not reference.adapter_off:  # (LoRA: the reference is the policy itself)
            sharded.shard(reference.model, cfg.model)
        grad_fn, step_fn = sharded.ShardedGradients(shards), sharded.clip_and_step
    optimizer, scheduler = optimizer_from_config(
        model, cfg.optim, total_steps=cfg.run.steps * plan.optimizer_steps_per_rollout_batch,
        master_weights=cfg.model.master_weights)
    # every forward scores the distribution the sampler drew from (temperature, and top_k / top_p when on)
    forward = ForwardSpec.of(a, plan.micro_batch, temperature=s.temperature, truncation=objective.truncation)
    return Learner(model, optimizer, scheduler, objective, reference, critic, forward, grad_fn=grad_fn,
                   grad_clip=cfg.optim.grad_clip, seed=cfg.run.seed, step_fn=step_fn)


# ----------------------------------------------------------------------------------- the loop


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    data=None,
    on_step: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Run policy-gradient training as configured; resume=True continues cfg.run.out_dir from its
    latest checkpoint. data: optional TaskData (train/eval examples, prompts, reward fn) to use
    instead of loading cfg.data (the demo and tests pass one). Returns TrainResult.

    Config problems raise ValueError (BatchConfigError, TaskDataError) and an existing run
    FileExistsError, all before the run directory is touched."""
    plan = validate_train_config(cfg)
    if (done := session.already_done(cfg, resume)) is not None:
        return done
    shards = sharded.start(cfg)  # distributed.learner=fsdp2: this process's rank (None: the one-process learner)
    cfg, model, tokenizer, task = session.start(sharded.rank_config(cfg, shards), data=data, episodes=True,
                                                resume=resume, reference_kept=not resume or ReferencePolicy.kept(cfg),
                                                judge=cfg.judge, external=cfg.external)
    s, r = cfg.sampling, cfg.run
    # auto resolved here, once (rlvr.train.pg.objective.resolve_rollout_correction)
    objective = Objective(cfg.algo, s.group_size, s.max_tokens, plan, rollout_backend=cfg.rollout.backend,
                          truncation=Truncation.of(s.top_k, s.top_p), loss_tokens=objective_length_cap(cfg))
    # where generators and reward scoring run: in-process (default) or Ray actors (rlvr.distributed)
    placement = build_placement(cfg.distributed, num_threads=r.num_threads)
    sampling_model = sharded.generator_model(model, shards)  # sharded: rank 0's full copy, None on the others
    learner = build_learner(cfg, model, objective, plan, placement, shards, tokenizer)
    problems = ProblemSource(task.train, cfg.data, r.seed)  # the stream, or an online band / curriculum
    source, loop_ctx = _source_and_loop(cfg, shards, placement, sampling_model, learner, tokenizer, task, problems,
                                        plan, resume=resume)
    with loop_ctx as loop:
        loop.on_close(placement.shutdown)
        loop.on_close(source.close)
        start = loop.start_step
        source.start(start, model)
        learner.reference.start(loop.path, start)
        # a raising reward is printed, logged, stops (ranks > 0 of a sharded run only stop)
        reward_errors = reward_error_log(cfg.data, task, loop.path if loop.writes else None)
        problems.load_state_dict(loop.state.get("pass_rates"))
        data_pos = int(loop.state.get("data_pos", 0))
        notes = _Notes(cfg, plan.on_policy)  # what the progress line cannot say itself, once each
        n_params, peak = count_params(model), peak_tflops(cfg.model.device, r.peak_tflops)  # perf/mfu's terms
        flops = learner.flop_counter()  # perf/flops: what the learner's forwards and backwards really did
        for step in range(start + 1, r.steps + 1):
            timer = Timer()
            reset_peak_memory(cfg.model.device)
            sampled = source.collect(step, data_pos, timer)
            reward_errors.observe(step, sampled.rewards, sampled.examples)  # > half errors: RewardErrorsStop
            problems.observe(sampled.examples, sampled.rewards, s.group_size, step)
            source.sleep()  # colocated vLLM hands its memory to the learner
            data_pos = sampled.data_pos
            with timer("train"):
                rows, adv, kept = training_rows(sampled)  # the kept rollouts (+ agent episodes' earlier segments)
                batch, masked = _loss_batch(rows, s.mask_truncated, tokenizer.pad_token_id)
                notes.correction(objective.correction_note(batch))
                with flops.counting():  # the FLOPs the learner's forwards and backwards did (perf/flops)
                    learned = learn(learner, batch, adv, kept, step,
                                    steps=objective.step_marks(sampled.rollouts, sampled.rewards, kept, tokenizer),
                                    old_logp_fn=source.old_logprobs_fn(rows, step))
            session.check_finite(step, loss=session.mean(learned.losses), grad_norm=session.mean(learned.grad_norms))
            notes.no_update(step, learned)
            with timer("sync"):
                source.after_update(step, model)
                learner.reference.after_step(step, model, loop.path, loop.stop.last_ckpt)
            metrics = step_metrics(sampled.rewards, sampled.rollouts, sampled.shaped, sampled.zero_var, sampled.keep,
                                   learned, step)
            metrics.update(judge_metrics(task.reward_fn))  # data.reward=judge: the step's judge/* counts
            metrics.update(_loop_metrics(cfg, sampled, masked, len(kept), problems, learner.scheduler, timer))
            if loop.due(step, r.eval_every):  # (sharded: rank 0's engine; never due on the other ranks)
                metrics.update(_evaluate(source.sampler, task, cfg, step, timer))
            metrics.update(timer.metrics() | memory_stats(cfg.model.device) | placement.metrics())
            metrics["perf/flops"] = flops.flops()
            metrics.update(perf_metrics(metrics, n_params, peak) | source.metrics())
            if r.log_samples_every and (step % r.log_samples_every == 0 or step == 1):
                loop.run.log_samples(step, _samples(sampled.rollouts, sampled.examples, sampled.rewards,
                                                    r.num_log_samples, s.group_size, learned.row_entropy,
                                                    sampled.adv))
            notes.loss(step, metrics)
            loop.log(step, metrics, on_step, **_shown(metrics))
            loop.checkpoint(step, {"data_pos": data_pos} | problems.checkpoint_state())
            loop.stop.check(step)
    return loop.result(r.steps)


def _source_and_loop(cfg: TrainConfig, shards, placement, sampling_model, learner: Learner, tokenizer, task, problems,
                     plan: BatchPlan, *, resume: bool):
    """Where the step's rollouts come from and the run loop. Sharded (distributed.learner=fsdp2): rank 0
    builds the engine on its full copy, samples and broadcasts (ShardedSource); every rank joins the pushes
    and checkpoints (rlvr.train.pg.sharded.run_loop); the other ranks have no engine and write no files."""
    r, source = cfg.run, None
    if sampling_model is not None:
        engine = placement.generator(cfg.rollout, sampling_model, tokenizer, seed=r.seed,
                                     model_source=session.model_source(cfg.model), default_batch_size=plan.rollout_batch)
        source = build_rollout_source(cfg, engine, sampling_model, tokenizer, task, learner.objective, problems,
                                      placement.score, forward_logprobs)
    loop_args = dict(resume=resume, model=learner.model, tokenizer=tokenizer, optimizer=learner.optimizer,
                     scheduler=learner.scheduler, task=task, extras=learner.extras())
    if shards is not None:
        return sharded.ShardedSource(source, shards), sharded.run_loop(shards, cfg, "train", **loop_args)
    return source, session.RunLoop(cfg, "train", **(loop_args | {"extras": loop_args["extras"] | source.extras()}))


def learn(learner: Learner, batch, adv: torch.Tensor, kept: torch.Tensor, step: int, *, steps=None,
          old_logp_fn=None) -> Learned:
    """The learner's update on the kept rollouts (batch: their TrainingBatch, adv (B,), kept: their
    indices in the step's rollouts): old and reference logprobs (and with a critic the values) once, no
    grad; the loss's targets; then epochs x minibatches (one optimizer step each, and one critic step) x
    micro-batches (one backward each). steps: with algo.advantage=process the kept rows' StepMarks
    (rlvr.train.pg.process). old_logp_fn: the behaviour policy's old logprobs (rollouts of older policy
    versions, rlvr.distributed.staleness.BehaviourPolicy), None = the model's. Nothing happens when every
    row was filtered out. The schedule is put at the step's position before and after (schedule_at)."""
    out = Learned()
    model, objective, critic, fwd = learner.model, learner.objective, learner.critic, learner.forward
    plan, n = objective.plan, kept.numel()
    # the schedule follows the RL step: step t's updates start at position (t - 1) * K whatever earlier steps
    # did (a step without an update still advances it; docs/training.md)
    schedule_at(learner.scheduler, (step - 1) * plan.optimizer_steps_per_rollout_batch)
    if n == 0:
        schedule_at(learner.scheduler, step * plan.optimizer_steps_per_rollout_batch)
        return out
    model.train()
    if old_logp_fn is not None:  # off-policy rows (sampling ahead, partial rollouts): always recomputed
        # the behaviour policy forwards each row with its own prompt, packing on auto
        old_logp = old_logp_fn(model, batch, dataclasses.replace(fwd, shared_prefix=False, packing="auto"))
    elif objective.needs_old_logprobs:
        old_logp = forward_logprobs(model, batch, fwd)
    else:
        old_logp = None
    ref_logp = learner.reference.logprobs(batch, fwd)
    kl_logp = old_logp  # the policy side of a KL penalty in the reward: the old policy, untruncated
    if (kl_fwd := objective.kl_forward(fwd)) is not None:
        kl_logp = (old_logp_fn(model, batch, dataclasses.replace(kl_fwd, shared_prefix=False, packing="auto"))
                   if old_logp_fn is not None else forward_logprobs(model, batch, kl_fwd))
    old_values = critic.values(model, batch, fwd.micro_batch, fwd.micro_batch_tokens) if critic is not None else None
    targets = objective.targets(adv, batch.response_mask, kl_logp, ref_logp, old_values, steps=steps)
    token_adv = targets.advantages  # (B,) or (B, T)
    if targets.returns is not None:
        out.extra.update(_value_stats(targets.returns, old_values, batch.response_mask))
    out.trained_tokens = plan.epochs * int(batch.attention_mask.sum())
    for epoch in range(plan.epochs):
        shuffle = plan.epochs > 1 or plan.train_batch < n
        g = torch.Generator().manual_seed(step_seed(learner.seed, step) + epoch)
        order = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
        for chunk in split_indices(n, minibatch_rows(n, plan)):
            idx = order[chunk.start : chunk.stop]
            mb = Minibatch(batch.rows(idx), token_adv[idx], _rows(old_logp, idx), _rows(ref_logp, idx),
                           _rows(targets.old_values, idx), _rows(targets.returns, idx), row_ids=kept[idx].tolist())
            mb = objective.select_tokens(model, mb, fwd)  # algo.entropy_mask_quantile: one threshold per minibatch
            out.losses.append(learner.grad_fn(model, mb, objective.parts, fwd, norm_length=objective.norm_length,
                                              critic=critic, stats=out.stats, row_entropy=out.row_entropy))
            if not all(map(_finite, out.losses)):
                break  # the caller stops the run; do not step an optimizer on NaN gradients
            out.grad_norms.append(learner.step_fn(model, learner.optimizer, learner.scheduler, learner.grad_clip))
            if critic is not None:
                out.critic_grad_norms.append(critic.step())
    schedule_at(learner.scheduler, step * plan.optimizer_steps_per_rollout_batch)
    return out


def _loss_batch(rows: list, mask_truncated: bool, pad_id: int):
    """(TrainingBatch of the kept rollouts as they enter the loss, or None when none is kept; how many were
    masked). sampling.mask_truncated: a response cut at max_tokens (finish_reason "length") gets loss_mask
    all False, so none of its tokens carries a gradient (policy term, KL, entropy) while its reward still
    entered its group's advantages (TRL's mask_truncated_completions); the row still counts in a
    per-sequence mean's number of rows."""
    masked = sum(ro.finish_reason == "length" for ro in rows) if mask_truncated else 0
    if mask_truncated:
        rows = [dataclasses.replace(ro, loss_mask=[False] * len(ro.response_ids)) if ro.finish_reason == "length"
                else ro for ro in rows]
    return (rollouts_to_batch(rows, pad_id) if rows else None), masked


def _loop_metrics(cfg: TrainConfig, sampled: Sampled, masked: int, n_kept: int, problems, scheduler,
                  timer: Timer) -> dict[str, Any]:
    """The step's metrics from outside the learner: DAPO's dynamic sampling (with algo.filter_zero_variance),
    the share of masked truncated rows (sampling.mask_truncated), the problem source's, lr, tokens/s."""
    m: dict[str, Any] = sampled.metrics(cfg.sampling.group_size) if cfg.algo.filter_zero_variance else {}
    if cfg.sampling.mask_truncated:  # share of the rows that entered the loss whose tokens were masked
        m["masked_truncated_frac"] = masked / max(1, n_kept)
    m.update(problems.metrics())
    m["lr"] = scheduler.get_last_lr()[0]
    m["tokens_per_s"] = sum(len(ro.response_ids) for ro in sampled.rollouts) / max(time.perf_counter() - timer.t0, 1e-9)
    return m


def _evaluate(sampler, task, cfg: TrainConfig, step: int, timer: Timer) -> dict[str, float]:
    """The periodic held-out evaluation (run.eval_every, and after the last step), as eval/* metrics."""
    if step == cfg.run.steps:
        session.say_final_evaluation(task, cfg)
    with timer("eval"):
        return eval_prefixed(eval_policy(sampler, task, cfg, greedy=cfg.run.eval_greedy, step=step))


def _shown(metrics: dict) -> dict[str, Any]:
    """The progress line's fields: reward, accuracy, loss ('skipped' for a step without an update)."""
    loss = metrics.get("loss")
    return {"reward": metrics["reward/mean"], "acc": metrics["accuracy"], "loss": "skipped" if loss is None else loss}


def schedule_at(scheduler, position: int) -> None:
    """Put a LambdaLR scheduler (and its optimizer's lr) at `position` optimizer steps. The trainer calls
    it around each RL step with position (step - 1) * K and step * K (K = optimizer steps per rollout
    batch), so the schedule counts RL steps: a step whose groups were all filtered out, or whose partial
    batch took fewer than K optimizer steps, still moves it on, and the last step ends at
    optim.min_lr_ratio. A no-op when the scheduler is already there (every step made its K updates)."""
    if scheduler.last_epoch == position:
        return
    scheduler.last_epoch = position
    groups = scheduler.optimizer.param_groups
    for g, base, fn in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        g["lr"] = base * fn(position)
    scheduler._last_lr = [g["lr"] for g in groups]


def _rows(t: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[idx]


def _value_stats(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean return and value over valid tokens, and the explained variance 1 - Var(R - V) / Var(R)
    of the rollout-time values (1 = perfect critic, 0 = no better than a constant)."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    if r.numel() == 0:
        return {}
    var = float(r.var(unbiased=False))
    out = {"critic/returns": float(r.mean()), "critic/values_old": float(v.mean())}
    if var > 0:
        out["critic/explained_var"] = 1.0 - float((r - v).var(unbiased=False)) / var
    return out


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


class _Notes:
    """Status lines said once per run, for what the progress line cannot say itself."""

    # the estimators whose advantages are exactly 0 in a group of equal rewards (each group centred on its mean)
    CENTRED = ("grpo", "group_mean", "rloo", "batch_std")
    FLAT_STEPS = 3  # the first steps of a run (all of a shorter one) without any reward spread: one warning

    def __init__(self, cfg: TrainConfig, on_policy: bool):
        self.cfg, self.on_policy = cfg, on_policy
        self.noted: set[str] = set()
        self.verbose = cfg.run.progress
        self.first_step: int | None = None  # the first step this process ran (1, or the one after a resume)
        self.flat_from_start = True  # every step so far had no reward spread

    def correction(self, note: str | None) -> None:
        if note is not None:
            session.say(note, self.verbose)

    def no_update(self, step: int, learned: Learned) -> None:
        if not learned.losses and "filtered" not in self.noted:
            self.noted.add("filtered")
            session.say(f"step {step}: every group had equal rewards and algo.filter_zero_variance dropped "
                        "them all: no update (loss is empty until a group has a reward spread)", self.verbose)

    def loss(self, step: int, metrics: dict) -> None:
        if self.no_signal(step, metrics) and metrics.get("loss") is not None:
            return  # its loss is ~0 because every advantage is 0, not "by construction": no_signal says so
        if (note := _loss_note(step, metrics, self.cfg.algo, self.noted, on_policy=self.on_policy)) is not None:
            session.say(note, self.verbose)

    def no_signal(self, step: int, metrics: dict) -> bool:
        """Whether the step had no learning signal from the reward: every group's rewards were equal
        (zero_var_groups 1) under an estimator that centres each group (CENTRED) and no length term shaped them
        apart (reward/shaped absent). When the first FLAT_STEPS steps of the run (every step of a shorter one)
        had none, a warning says why and what to check, once, whatever run.progress (a reward that is always 0,
        a temperature too low for a group to differ, a task every response fails or solves)."""
        if self.first_step is None:
            self.first_step = step
        flat = (metrics.get("zero_var_groups") == 1.0 and self.cfg.algo.advantage in self.CENTRED
                and "reward/shaped" not in metrics)
        self.flat_from_start = self.flat_from_start and flat
        first, last = self.first_step, self.cfg.run.steps
        if (self.flat_from_start and "no_signal" not in self.noted
                and step - first + 1 >= min(self.FLAT_STEPS, last - first + 1)):
            self.noted.add("no_signal")
            mean = metrics.get("reward/mean")
            steps = f"step {step}" if step == first else f"steps {first}-{step}"
            session.say(
                f"warning: no learning signal in {steps}: in every group all responses got the same reward "
                f"(reward/mean {'n/a' if mean is None else f'{mean:.3g}'}), so every advantage is 0 and the reward "
                "teaches the policy nothing (the loss is ~0 for that reason). Check the reward function (does any "
                "response score differently?), sampling.temperature (too low: a group's responses are alike), "
                f"sampling.group_size (now {self.cfg.sampling.group_size}) and the task's difficulty (every "
                "response wrong, or every one right: an easier or harder data split, or SFT first)")
        return flat


def count_params(model) -> int:
    """N of MFU's 6 N per token: the model's parameters, a tied embedding / LM head counted once (it is the
    LM head's matmul; the embedding lookup costs no FLOPs)."""
    return sum(p.numel() for p in model.parameters())  # parameters() lists a shared tensor once


def perf_metrics(m: dict, n_params: int, peak_tflops: float) -> dict[str, float]:
    """Throughput of a step from its logged counts and wall times (no device sync of its own):
    perf/rollout_tokens_per_s = tokens/generated / time/generate; perf/learner_tokens_per_s =
    tokens/trained / time/train; perf/mfu = perf/flops / time/train / peak, perf/flops being the FLOPs the
    learner really did (rlvr.runtime.FlopCounter over its forward calls: the tokens each forward got per the
    pack plan, a group's prompt once per micro-batch with algo.shared_prefix, no pad token in a packed forward,
    the LM head at the positions it ran, attention's query-key pairs, the backward of each forward with grad:
    input gradients plus the weight gradients of what trains; the no-grad old-logprob and reference forwards as
    forwards); 6 N tokens/trained where nothing was counted (data-parallel workers in other processes).
    Only when the peak is known (> 0)."""
    out: dict[str, float] = {}
    gen, t_gen = m.get("tokens/generated"), m.get("time/generate")
    if gen is not None and t_gen:
        out["perf/rollout_tokens_per_s"] = gen / t_gen
    trained, t_train = m.get("tokens/trained"), m.get("time/train")
    if trained and t_train:
        out["perf/learner_tokens_per_s"] = trained / t_train
        if peak_tflops > 0:
            done = m.get("perf/flops") or 6.0 * n_params * trained
            out["perf/mfu"] = done / t_train / (peak_tflops * 1e12)
    return out


def _loss_note(step: int, metrics: dict, a, noted: set[str], *, on_policy: bool) -> str | None:
    """Once per run, what the progress line's loss cannot say itself: a step without an update (loss shown as
    'skipped'; DAPO's dynamic sampling showed loss=None) and an on-policy loss of ~0 (GRPO's 5.6e-09 on the
    demo's line, which reads like a bug)."""
    loss = metrics.get("loss")
    if loss is None and "skipped" not in noted:
        noted.add("skipped")
        why = ("every group's responses scored alike and algo.filter_zero_variance drops such groups (no "
               "learning signal; algo.refill_rounds samples more problems to replace them)"
               if a.filter_zero_variance and not metrics.get("kept_frac") else "no response entered the loss")
        return f"note: step {step} made no update (loss shows 'skipped'): {why}"
    if loss is not None and on_policy and abs(loss) < 1e-6 and "zero" not in noted:
        noted.add("zero")
        return (f"note: loss={loss:.2g} is ~0 by construction, not a bug: on-policy the importance ratio is 1 and "
                "each group's advantages average to 0, so the loss value is ~0 whatever the gradient (which is not "
                "0 where a group's rewards differ); learning shows in reward and acc")
    return None


def step_metrics(rewards, rollouts, shaped, zero_var, keep, learned: Learned, step: int) -> dict:
    """Per-step training metrics (names follow the schema of rlvr.runs.plots / docs/runs.md)."""
    stats, losses, grad_norms = learned.stats, learned.losses, learned.grad_norms
    n = len(rewards)
    scored = [r for r in rewards if r.status is not Status.ERROR]  # an unscored reward is no 0 (Shaping)
    m: dict[str, Any] = {"reward/mean": sum(r.total for r in scored) / len(scored) if scored else None}
    if not torch.equal(shaped, torch.tensor([r.total for r in rewards], dtype=torch.float32)):
        m["reward/shaped"] = float(shaped.mean())
    m.update(sample_metrics(rewards, rollouts))
    lens = [len(ro.response_ids) for ro in rollouts]
    m["zero_var_groups"] = zero_var
    m["kept_frac"] = float(keep.float().mean())
    m["verifier/timeouts"] = sum(r.status is Status.TIMEOUT for r in rewards)
    m["verifier/errors"] = n - len(scored)  # unscored: kept out of their groups' baselines, advantage 0
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
    m["loss/entropy_kept_frac"] = means.get("entropy_kept_frac")  # algo.entropy_mask_quantile < 1 only
    # PPO's critic (algo.critic): value loss and clip share over the minibatch updates, the values it
    # predicts during the updates, its gradient norm, and the returns / explained variance of the batch
    m["critic/value_loss"] = means.get("value_loss")
    m["critic/value_clip_frac"] = means.get("value_clip_frac")
    m["critic/values"] = means.get("values")
    m["critic/grad_norm"] = session.mean(learned.critic_grad_norms)
    m.update(learned.extra)
    # sampler vs trainer logprobs of the sampled tokens (before any update of this step): ~0 when the
    # generator holds the learner's weights; large after a failed weight push or a dtype mismatch
    m["rollout/logprob_diff_mean"] = means.get("logprob_diff")
    m["rollout/logprob_diff_max"] = stats.maxs.get("logprob_diff_max")
    # algo.rollout_correction: the ratio trainer/sampler per token or response before truncation, and the
    # shares whose weight was capped / that left the loss (absent when the correction is off)
    m["rollout/correction_ratio_mean"] = means.get("correction_ratio_mean")
    m["rollout/correction_ratio_min"] = stats.mins.get("correction_ratio_min")
    m["rollout/correction_ratio_max"] = stats.maxs.get("correction_ratio_max")
    m["rollout/correction_truncated"] = means.get("correction_truncated")
    m["rollout/correction_masked"] = means.get("correction_masked")
    # rollouts are sampled by the weights of the previous step (version step - 1) in this synchronous loop
    versions = [ro.weight_version for ro in rollouts]
    m["rollout/policy_version"] = min(versions)
    m["rollout/staleness"] = (step - 1) - min(versions)
    m["tokens/generated"] = sum(lens)
    # prompt + response tokens of the rows that entered the loss, once per epoch (what MFU counts)
    m["tokens/trained"] = learned.trained_tokens
    return {k: v for k, v in m.items() if v is not None}


def _samples(rollouts, examples, rewards, k: int, group_size: int, row_entropy: dict[int, float],
             adv: torch.Tensor | None = None) -> list[dict]:
    """First response of the first k groups: prompt, response, reference, reward parts, status, its outcome
    advantage (adv (N,): before per-token terms; 0 for an unscored reward), the tokens the policy sampled
    (`length`) and those it did not (`unsampled`: a thinking budget's forced text, an episode's tool output),
    mean token entropy (nats; None for rows dropped before training) and the mean sampler logprob of the
    sampled tokens (a forced token's 0.0 is no choice of the policy's)."""
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
                "advantage": None if adv is None else float(adv[i]),
                "length": sampled_length(ro),
                "unsampled": unsampled_length(ro),
                "entropy": row_entropy.get(i),
                "mean_logprob": sampled_mean_logprob(ro),
            }
        )
    return out
