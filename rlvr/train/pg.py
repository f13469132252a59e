"""Policy-gradient training, the GRPO family: `rlvr train`.

Everything variable is resolved before the loop: the task (prompt contract, reward), the generator
(hf or vllm, rlvr.rollout.build_generator), the objective (rlvr.train.objective.Objective) and the
reference policy (rlvr.train.reference.ReferencePolicy). One step then reads as the documents'
pseudocode:

    rollouts = sampler.generate(prompts, SamplingSpec.for_task(task, cfg.sampling, seed=step_seed(seed, step)))
    rewards  = score_batch(reward_fn, rollouts)                   # never raises, counts timeouts
    advantages = objective.advantages(rewards, lengths)           # length shaping + estimator
    learn(...)       # old/ref logprobs once, then epochs x minibatches (optimizer steps) x micro-batches
    generator.update_weights(model.named_parameters(), version=step)   # rollouts carry their version

Metrics, samples, checkpoints and plots go to the run directory (rlvr.runs).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.algo import Truncation
from rlvr.config import ConfigError
from rlvr.rewards.batch import score_rollouts
from rlvr.rewards.types import Reward, Status, format_rate
from rlvr.rollout.types import SamplingSpec, answer_length
from rlvr.train.batching import BatchPlan, split_indices
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
from rlvr.train.config import TrainConfig
from rlvr.train.objective import (  # noqa: F401 - re-exported: tests and users import them from here
    LENGTH_REWARDS,
    Objective,
    StepStats,
    accumulate_gradients,
    batch_logprobs,
    kl_reward_to_go,
    micro_batch_loss,
    shape_and_advantage,
    token_advantages,
)

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
class TrainResult:
    """What `train` returns: where the run is and its last metrics."""

    run_dir: Path
    steps: int
    last_metrics: dict[str, Any]
    eval: dict[str, float] = field(default_factory=dict)


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


class Timer:
    """Wall seconds per phase of a step: `with timer("generate"): ...` -> metrics time/generate."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.spent: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - t

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.spent.items()} | {"time/step": time.perf_counter() - self.t0}


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
    from rlvr.rollout import rollouts_to_batch, with_thinking_budget
    from rlvr.runs import checkpoint as ckpt_mod
    from rlvr.runs.progress import Progress
    from rlvr.runtime import memory_stats, peak_tflops, reset_peak_memory, seed_everything, set_num_threads
    from rlvr.train import session
    from rlvr.train.critic import Critic
    from rlvr.train.curriculum import ProblemSource
    from rlvr.train.reference import ReferencePolicy
    from rlvr.train.tasks import TaskDataError, check_data_files, eval_policy, load_task_data, task_scorer

    a, s, r = cfg.algo, cfg.sampling, cfg.run
    plan = validate_train_config(cfg)
    if (done := _already_done(cfg, resume)) is not None:
        return done
    set_num_threads(r.num_threads or None)
    seed_everything(r.seed)
    quiet_transformers()
    if data is None:  # every bad line of the data files, before the model loads
        check_data_files(cfg.data, train=True)
    session.say(f"loading model {cfg.model.init_from or cfg.model.name} ...", r.progress)
    model, tokenizer = policy_from_config(cfg.model, seed=r.seed)
    cfg = session.record_model_shape(cfg, model)  # config.yaml records the shape that was trained
    task = data if data is not None else load_task_data(cfg.data, tokenizer, episodes=True)
    if not task.train:
        raise TaskDataError(f"data: task {task.name!r} has no training examples")
    session.check_positions(model, tokenizer, task, cfg)  # prompt + max_tokens within the model's positions
    session.warn_repeated_problems(task, cfg)
    # auto resolved here, once (rlvr.train.objective.resolve_rollout_correction); every forward scores the
    # distribution the sampler drew from (temperature, and top_k / top_p when on)
    objective = Objective(a, s.group_size, s.max_tokens, plan, rollout_backend=cfg.rollout.backend,
                          truncation=Truncation.of(s.top_k, s.top_p), loss_tokens=objective_length_cap(cfg))
    reference = ReferencePolicy(model, enabled=objective.needs_reference, refresh_every=a.ref_refresh_every)
    critic = (Critic(model, mode=a.critic, lr=a.critic_lr or cfg.optim.lr, grad_clip=cfg.optim.grad_clip)
              if objective.needs_critic else None)
    extras = {"critic": critic} if critic is not None else None
    optimizer, scheduler = optimizer_from_config(
        model, cfg.optim, total_steps=r.steps * plan.optimizer_steps_per_rollout_batch,
        master_weights=cfg.model.master_weights)
    # where generators and reward scoring run: in-process (default) or Ray actors (rlvr.distributed)
    placement, wrap, behaviour = _placement(cfg, model, tokenizer, task, plan)
    generator = placement.generator(cfg.rollout, model, tokenizer, model_source=session.model_source(cfg.model),
                                    seed=r.seed, default_batch_size=plan.rollout_batch)
    engine = generator  # the engine itself, before any sampling wrapper
    push_check = _push_check(cfg, task)
    sampler = with_thinking_budget(generator, s.thinking_budget, s.stop_thinking_text, template=task.template)
    if wrap is not None:  # distributed.max_staleness / segment_tokens: sampling ahead, partial rollouts
        sampler = generator = wrap(generator)
        if hasattr(sampler, "checkpoint_state"):  # partial rollouts: the responses in flight are trainer state
            extras = (extras or {}) | {"partial_rollouts": sampler.checkpoint_state(behaviour, task.train)}
    grad_fn = placement.learners(model)  # distributed.num_learners > 1: data-parallel (rlvr.distributed.dp)
    run, start_step, state = session.open_run(cfg, resume=resume, model=model, optimizer=optimizer,
                                              scheduler=scheduler, verbose=r.progress, extras=extras)
    if start_step:  # the checkpoint's weights replaced those the generator was built with
        generator.update_weights(model.named_parameters(), version=start_step)
    if push_check is not None:
        push_check(engine, model, tokenizer, start_step)
    if behaviour is not None:
        behaviour.record(start_step, model)
    reference.start(run.path, start_step)
    reward_errors = reward_error_log(cfg.data, task, run.path)  # a raising reward is printed, logged, and stops
    source = ProblemSource(task.train, cfg.data, r.seed)  # the stream, or an online band / curriculum
    source.load_state_dict(state.get("pass_rates"))
    if (what := session.evaluation_plan(task, cfg)) is not None:
        session.say(what, r.progress)
    elif not task.eval:
        session.say("note: no held-out problems (set data.eval_path): the run is not evaluated", r.progress)
    data_pos, last_ckpt, last, filtered_note = int(state.get("data_pos", 0)), start_step, {}, False
    noted: set[str] = set()  # the loss notes said so far (_loss_note)
    progress = Progress(r.steps, "rl", start=start_step, mode=None if r.progress else "off")
    n_params, peak = count_params(model), peak_tflops(cfg.model.device, r.peak_tflops)  # perf/mfu's terms
    stop = session.StopOnSignal("train", r.progress).install(run.path, start_step)  # Ctrl-C: save, then stop
    try:
        for step in range(start_step + 1, r.steps + 1):
            timer = Timer()
            reset_peak_memory(cfg.model.device)
            refreshed = {}
            if source.due(step):
                with timer("filter"):
                    refreshed = source.refresh(sampler, task, s, task_scorer(task, cfg.data), data_pos, step)
                    model.train()
            if hasattr(sampler, "begin_step"):
                sampler.begin_step(step, data_pos)
            sampled = sample_groups(sampler, task, cfg, objective, step, data_pos, timer, source,
                                    score=placement.score)
            reward_errors.observe(step, sampled.rewards, sampled.examples)  # > half errors: RewardErrorsStop
            source.observe(sampled.examples, sampled.rewards, s.group_size, step)
            generator.sleep()  # colocated vLLM hands its memory to the learner
            data_pos = sampled.data_pos
            rollouts, ro_examples, rewards = sampled.rollouts, sampled.examples, sampled.rewards
            shaped, adv, keep, zero_var = sampled.shaped, sampled.adv, sampled.keep, sampled.zero_var
            with timer("train"):
                # the schedule follows the RL step: step t's updates start at position (t - 1) * K whatever
                # earlier steps did (a step without an update still advances it; docs/training.md)
                schedule_at(scheduler, (step - 1) * plan.optimizer_steps_per_rollout_batch)
                kept = torch.nonzero(keep).squeeze(1)
                rows, masked_truncated = _loss_rows([rollouts[i] for i in kept.tolist()], s.mask_truncated)
                batch = rollouts_to_batch(rows, tokenizer.pad_token_id) if len(kept) else None
                if (note := objective.correction_note(batch)) is not None:
                    session.say(note, r.progress)
                old_fn = None if behaviour is None else behaviour.old_logprobs_fn(
                    [rollouts[i] for i in kept.tolist()], current=step - 1)
                learned = learn(model, optimizer, scheduler, batch, adv[kept], kept, objective, reference,
                                cfg, step, critic=critic,
                                steps=objective.step_marks(rollouts, rewards, kept, tokenizer), old_logp_fn=old_fn,
                                grad_fn=grad_fn)
                schedule_at(scheduler, step * plan.optimizer_steps_per_rollout_batch)
            session.check_finite(step, loss=_mean(learned.losses), grad_norm=_mean(learned.grad_norms))
            if not learned.losses and not filtered_note:
                filtered_note = True
                session.say(f"step {step}: every group had equal rewards and algo.filter_zero_variance dropped "
                            "them all: no update (loss is empty until a group has a reward spread)", r.progress)
            with timer("sync"):
                generator.update_weights(model.named_parameters(), version=step)
                if push_check is not None:  # the engine samples from what was just pushed, or the run stops
                    push_check(engine, model, tokenizer, step)
                reference.after_step(step, model, run.path, last_ckpt)
                if behaviour is not None:
                    behaviour.record(step, model)

            metrics = step_metrics(rewards, rollouts, shaped, zero_var, keep, learned, step)
            metrics.update(sampled.metrics(s.group_size) if a.filter_zero_variance else {})
            if s.mask_truncated:  # share of the rows that entered the loss whose tokens were masked (cut at max_tokens)
                metrics["masked_truncated_frac"] = masked_truncated / max(1, len(kept))
            metrics.update(source.last | refreshed)
            metrics.update(task.env.metrics() if task.env is not None else {})  # env/*: turns, tool calls, flags
            metrics["lr"] = scheduler.get_last_lr()[0]
            metrics["tokens_per_s"] = sum(len(ro.response_ids) for ro in rollouts) / max(time.perf_counter() - timer.t0, 1e-9)
            if (r.eval_every and step % r.eval_every == 0) or step == r.steps:
                if step == r.steps:
                    session.say_final_evaluation(task, cfg)
                with timer("eval"):
                    metrics.update(eval_prefixed(eval_policy(sampler, task, cfg, greedy=r.eval_greedy, step=step)))
            metrics.update(timer.metrics() | memory_stats(cfg.model.device) | placement.metrics())
            metrics.update(perf_metrics(metrics, n_params, peak))
            if push_check is not None:
                metrics.update(push_check.last)
            if wrap is not None:
                metrics.update(sampler.metrics())
            if r.log_samples_every and (step % r.log_samples_every == 0 or step == 1):
                run.log_samples(step, _samples(rollouts, ro_examples, rewards, r.num_log_samples, s.group_size,
                                               learned.row_entropy))
            last = run.log_metrics(step, metrics)
            loss_note = _loss_note(step, metrics, a, noted, on_policy=plan.on_policy)
            if loss_note is not None:
                session.say(loss_note, r.progress)
            shown = metrics.get("loss")
            progress.update(1, reward=metrics["reward/mean"], acc=metrics["accuracy"],
                            loss="skipped" if shown is None else shown)
            if on_step is not None:
                on_step(step, metrics)
            if step == r.steps or (r.checkpoint_every and step % r.checkpoint_every == 0) or stop.requested:
                ckpt_mod.save_checkpoint(run, step, model=model, tokenizer=tokenizer, optimizer=optimizer,
                                         scheduler=scheduler, trainer_state={"data_pos": data_pos}
                                         | ({"pass_rates": source.state_dict()} if source.active else {}),
                                         keep=r.keep_checkpoints, extras=extras)
                last_ckpt = step
                stop.saved(step)
                session.maybe_die_after_checkpoint(step, run)
            stop.check(step)
    finally:
        stop.restore()
        progress.close()
        run.close()
        placement.shutdown()
    return TrainResult(run_dir=run.path, steps=r.steps, last_metrics=last, eval=finish_run(run.path, last))


def learn(model, optimizer, scheduler, batch, adv: torch.Tensor, kept: torch.Tensor, objective: Objective,
          reference, cfg: TrainConfig, step: int, critic=None, steps=None, old_logp_fn=None,
          grad_fn=None) -> Learned:
    """The learner's update on the kept rollouts (batch: their TrainingBatch, adv (B,)): old and
    reference logprobs (and with a critic the values) once, no grad; the loss's targets; then
    epochs x minibatches (one optimizer step each, and one critic step) x micro-batches (one
    backward each). steps: with algo.advantage=process the kept rows' rlvr.train.process.StepMarks.
    old_logp_fn: computes the old logprobs instead of the model (rollouts of older policy versions,
    rlvr.distributed.staleness.BehaviourPolicy); grad_fn: replaces accumulate_gradients (data-parallel
    learners, rlvr.distributed.dp.DataParallelGradients). Nothing happens when every row was filtered out."""
    out = Learned()
    n = kept.numel()
    if n == 0:
        return out
    a, s, plan = cfg.algo, cfg.sampling, objective.plan
    tr = objective.truncation  # sampling.top_k / top_p: every forward scores the truncated distribution
    model.train()
    if old_logp_fn is not None:  # off-policy rows (sampling ahead, partial rollouts): always recomputed
        old_logp = old_logp_fn(model, batch, plan.micro_batch, s.temperature, a.micro_batch_tokens, truncation=tr)
    elif objective.needs_old_logprobs:
        old_logp = batch_logprobs(model, batch, plan.micro_batch, s.temperature, a.micro_batch_tokens,
                                  shared_prefix=a.shared_prefix, truncation=tr, packing=a.packing)
    else:
        old_logp = None
    ref_logp = reference.logprobs(batch, plan.micro_batch, s.temperature, a.micro_batch_tokens, truncation=tr,
                                  packing=a.packing)
    old_values = critic.values(model, batch, plan.micro_batch, a.micro_batch_tokens) if critic is not None else None
    targets = objective.targets(adv, batch.response_mask, old_logp, ref_logp, old_values, steps=steps)
    token_adv = targets.advantages  # (B,) or (B, T)
    if targets.returns is not None:
        out.extra.update(_value_stats(targets.returns, old_values, batch.response_mask))
    out.trained_tokens = plan.epochs * int(batch.attention_mask.sum())
    for epoch in range(plan.epochs):
        shuffle = plan.epochs > 1 or plan.train_batch < n
        g = torch.Generator().manual_seed(step_seed(cfg.run.seed, step) + epoch)
        order = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
        for chunk in split_indices(n, plan.train_batch):
            idx = order[chunk.start : chunk.stop]
            out.losses.append((grad_fn or accumulate_gradients)(
                model, batch.rows(idx), token_adv[idx],
                None if old_logp is None else old_logp[idx], None if ref_logp is None else ref_logp[idx],
                objective.parts, micro_batch_size=plan.micro_batch, micro_batch_tokens=a.micro_batch_tokens,
                norm_length=objective.norm_length, temperature=s.temperature, truncation=tr, stats=out.stats,
                row_entropy=out.row_entropy, row_ids=kept[idx].tolist(), critic=critic,
                old_values=_rows(targets.old_values, idx), returns=_rows(targets.returns, idx)))
            if not all(map(_finite, out.losses)):
                break  # the caller stops the run; do not step an optimizer on NaN gradients
            out.grad_norms.append(clip_and_step(model, optimizer, scheduler, cfg.optim.grad_clip))
            if critic is not None:
                out.critic_grad_norms.append(critic.step())
    return out


def _loss_rows(rollouts: list, mask_truncated: bool) -> tuple[list, int]:
    """The kept rollouts as they enter the loss, and how many were masked. sampling.mask_truncated: a
    response cut at max_tokens (finish_reason "length") gets loss_mask all False, so none of its tokens
    carries a gradient (policy term, KL, entropy) while its reward still entered its group's advantages
    (TRL's mask_truncated_completions); the row still counts in a per-sequence mean's number of rows."""
    if not mask_truncated:
        return rollouts, 0
    from dataclasses import replace

    out = [replace(ro, loss_mask=[False] * len(ro.response_ids)) if ro.finish_reason == "length" else ro
           for ro in rollouts]
    return out, sum(ro.finish_reason == "length" for ro in rollouts)


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


@dataclass
class Sampled:
    """One step's rollouts, possibly from several sampling rounds (DAPO refill)."""

    rollouts: list
    examples: list  # one per rollout
    rewards: list[Reward]
    lengths: torch.Tensor  # (N,) answer tokens (rlvr.rollout.types.answer_length): what the length terms count
    shaped: torch.Tensor  # (N,)
    adv: torch.Tensor  # (N,)
    keep: torch.Tensor  # (N,) bool
    zero_var: float  # share of sampled groups with equal rewards
    data_pos: int  # position in the training stream after this step
    rounds: int = 1

    def metrics(self, group_size: int) -> dict[str, float]:
        groups = len(self.rollouts) // group_size
        return {
            "dynamic/rounds": self.rounds,
            "dynamic/groups_sampled": groups,
            "dynamic/groups_dropped": int(round(self.zero_var * groups)),
            "dynamic/groups_kept": int(self.keep.sum()) // group_size,
            "dynamic/extra_samples": len(self.rollouts) - len(self.rollouts) // self.rounds,
        }


def sample_groups(sampler, task, cfg: TrainConfig, objective: Objective, step: int, data_pos: int,
                  timer: Timer, source=None, score=None) -> Sampled:
    """Sample sampling.n_prompts problems x group_size, score them, compute advantages. With
    algo.filter_zero_variance and algo.refill_rounds = k, groups whose rewards are all equal are
    dropped and up to k more rounds of n_prompts new problems are sampled until n_prompts groups
    with a reward spread are in hand (DAPO's dynamic sampling); the batch then holds exactly
    n_prompts groups, or fewer when the budget ran out. Advantages are group-local, so groups of
    different rounds are computed together. source: a rlvr.train.curriculum.ProblemSource (the
    online band / curriculum); None = the shuffled stream. score: the placement's scorer
    (signature of score_rollouts; None = score_rollouts in this process)."""
    s, r, a = cfg.sampling, cfg.run, cfg.algo
    rollouts, examples, rewards = [], [], []
    rounds = 0
    for rnd in range(1 + (a.refill_rounds if a.filter_zero_variance else 0)):
        if source is not None:
            batch, data_pos = source.draw(s.n_prompts, data_pos, step, rnd)
        else:
            batch = take(task.train, data_pos, s.n_prompts, cfg.data.seed)
            data_pos += s.n_prompts
        rounds += 1
        with timer("generate"):
            # round 0 keeps the seed of a run without refill; later rounds get seeds of their own
            seed = step_seed(r.seed, step) if rnd == 0 else step_seed(r.seed + 7_777_777 * rnd, step)
            if task.env is not None:  # data.env: multi-turn episodes, rewarded by the environment (rlvr.envs)
                ros, env_rws = task.env.rollouts(sampler, batch, SamplingSpec.for_task(task, s, seed=seed))
                ro_examples = [batch[ro.group] for ro in ros]
            elif hasattr(sampler, "sample"):  # partial rollouts: finished groups, maybe of earlier steps' problems
                ros, ro_examples = sampler.sample(batch, [task.prompt(ex) for ex in batch],
                                                  SamplingSpec.for_task(task, s, seed=seed))
            else:
                ros = sampler.generate([task.prompt(ex) for ex in batch], SamplingSpec.for_task(task, s, seed=seed))
                ro_examples = [batch[ro.group] for ro in ros]
        with timer("score"):
            rws = env_rws if task.env is not None else (score or score_rollouts)(
                ros, ro_examples, task.reward_fn, workers=cfg.data.reward_workers,
                timeout_s=cfg.data.reward_timeout_s, isolate=cfg.data.reward_isolate)
        rollouts += ros
        examples += ro_examples
        rewards += rws
        if _spread_groups(rewards, s.group_size) >= s.n_prompts:
            break
    with timer("score"):
        # what the length terms count: the tokens the policy wrote in its answer turn(s), those max_tokens bounds
        # (a thinking budget's answer phase, an episode's model turns; not forced text or tool output)
        lengths = torch.tensor([answer_length(ro) for ro in rollouts], dtype=torch.float32)
        shaped, adv, keep, zero_var = objective.advantages(rewards, lengths, step)
        if rounds > 1 or a.refill_rounds:
            # at most n_prompts groups with a spread: the first ones sampled
            keep_groups = keep.view(-1, s.group_size)[:, 0]
            over = torch.nonzero(keep_groups).squeeze(1)[s.n_prompts:]
            keep_groups[over] = False
            keep = keep_groups.repeat_interleave(s.group_size)
    return Sampled(rollouts=rollouts, examples=examples, rewards=rewards, lengths=lengths, shaped=shaped,
                   adv=adv, keep=keep, zero_var=zero_var, data_pos=data_pos, rounds=rounds)


def _push_check(cfg: TrainConfig, task):
    """The health check after each weight push (rlvr.rollout.push_check), or None: only engines that
    hold their own copy of the weights (vllm) can drift from the learner; hf shares its module."""
    rc = cfg.rollout
    if rc.backend != "vllm" or not rc.push_check:
        return None
    from rlvr.rollout.push_check import PushCheck
    from rlvr.train import session

    prompts = [task.prompt(ex) for ex in task.train[:2]]
    return PushCheck(prompts, tol=rc.push_check_tol, max_tokens=min(16, cfg.sampling.max_tokens), seed=cfg.run.seed,
                     say=session.say)  # a warning is printed even with run.progress=false


def _placement(cfg: TrainConfig, model, tokenizer, task, plan: BatchPlan):
    """(placement, wrap, behaviour) from cfg.distributed: the rlvr.distributed placement; with
    distributed.max_staleness (sampling ahead, rlvr.distributed.staleness) or segment_tokens (partial
    rollouts, rlvr.distributed.partial) a function wrapping the generator, and the BehaviourPolicy
    that recomputes old logprobs of rollouts sampled by older versions; else None, None."""
    from rlvr.distributed import build_placement

    d = getattr(cfg, "distributed", None)
    placement = build_placement(d, num_threads=cfg.run.num_threads)
    segment = getattr(d, "segment_tokens", 0) if d is not None else 0
    if d is None or not (d.max_staleness or d.queue_size or segment):
        return placement, None, None
    from rlvr.distributed.staleness import AheadSampler, BehaviourPolicy

    s, a = cfg.sampling, cfg.algo
    what = "distributed.segment_tokens" if segment else "distributed.max_staleness"
    if s.thinking_budget >= 0:
        raise ConfigError(f"{what} does not combine with sampling.thinking_budget; leave one of them unset")
    if segment:
        if d.max_staleness or d.queue_size:
            raise ConfigError("distributed.segment_tokens (partial rollouts) and distributed.max_staleness "
                              "(sampling ahead) are two ways to go asynchronous; set only one")
        if a.filter_zero_variance and a.refill_rounds:
            raise ConfigError("distributed.segment_tokens does not combine with algo.refill_rounds")
        from rlvr.distributed.partial import PartialRollouts

        keep = -(-s.max_tokens // segment) + 4  # a response spans at most this many versions (+ backlog)
        return (placement, lambda gen: PartialRollouts(gen, tokenizer, segment),
                BehaviourPolicy(model, keep=keep))

    def planned(step: int, pos: int):
        batch = take(task.train, pos, s.n_prompts, cfg.data.seed)
        return [task.prompt(ex) for ex in batch], SamplingSpec.for_task(task, s, seed=step_seed(cfg.run.seed, step))

    def ahead(generator):
        return AheadSampler(generator, planned, max_staleness=d.max_staleness, queue_size=d.queue_size,
                            prompts_per_step=s.n_prompts)

    return placement, ahead, BehaviourPolicy(model, keep=max(d.max_staleness, d.queue_size))


def _spread_groups(rewards: list[Reward], group_size: int) -> int:
    """Groups (consecutive runs of group_size rewards) whose task rewards are not all equal."""
    totals = [r.total for r in rewards]
    return sum(len(set(totals[i:i + group_size])) > 1 for i in range(0, len(totals), group_size))


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _already_done(cfg: TrainConfig, resume: bool) -> TrainResult | None:
    """Checks of the run directory before any work: a finished run resumed returns at once
    ("nothing to do"); a run to resume must have a checkpoint; a new run must not overwrite one."""
    from rlvr.train import session

    out = Path(cfg.run.out_dir)
    if not resume:
        session.refuse_existing_run(cfg)
        return None
    step = session.checkpoint_step(out)
    if step is None:
        raise FileNotFoundError(f"--resume {out}: no checkpoint to resume from (the run stopped before its "
                                "first checkpoint); start it over with run.overwrite=true")
    if step >= cfg.run.steps:
        session.say(f"nothing to do: {out} is at step {step} and run.steps={cfg.run.steps} "
                    "(raise run.steps to train further)")
        last = session.last_metrics(out)
        return TrainResult(run_dir=out, steps=step, last_metrics=last,
                           eval={k[5:]: v for k, v in last.items() if k.startswith("eval/")})
    return None


def reward_error_log(data_cfg, task, run_dir):
    """The run's rlvr.rewards.errors.RewardErrorLog: each distinct message of an ERROR reward is printed
    once and every step's are appended to <run>/reward_errors.jsonl; a step where most rewards are errors
    stops the run (RewardErrorsStop) naming the reward (shared by `rlvr train` and `rlvr ei`)."""
    from pathlib import Path

    from rlvr.rewards.errors import RewardErrorLog

    spec = data_cfg.reward or (task.reward_fn if isinstance(task.reward_fn, str) else "")
    if not spec:
        try:
            from rlvr.data import get_task

            spec = get_task(data_cfg.task).reward_name(getattr(task, "template", None) or None)
        except (KeyError, ValueError, AttributeError):
            spec = getattr(task.reward_fn, "__name__", None) or f"of task {task.name}"
    return RewardErrorLog(str(spec), Path(run_dir) / "reward_errors.jsonl", key="data.reward" if data_cfg.reward else "")


def sample_metrics(rewards, rollouts) -> dict[str, Any]:
    """Reward parts, accuracy, format rate and lengths of a step's samples (shared by `rlvr train` and
    `rlvr ei`): reward/<part>, accuracy, format_rate (only when the reward has a format part: the
    definition of rlvr.rewards.types.format_rate), len/mean, len/correct, len/incorrect (None when
    no such sample), len/truncated_frac."""
    n = len(rewards)
    m: dict[str, Any] = {}
    for p in sorted({k for r in rewards for k in r.parts}):
        m[f"reward/{p}"] = sum(float(r.parts.get(p, 0.0)) for r in rewards) / n
    correct = [r.status is Status.CORRECT for r in rewards]
    m["accuracy"] = sum(correct) / n
    fmt = format_rate([r.parts for r in rewards])
    if not math.isnan(fmt):  # a reward without a format part: no format rate (eval prints "n/a")
        m["format_rate"] = fmt
    lens = [len(ro.response_ids) for ro in rollouts]
    m["len/mean"] = sum(lens) / n
    lc = [x for x, c in zip(lens, correct, strict=True) if c]
    li = [x for x, c in zip(lens, correct, strict=True) if not c]
    m["len/correct"] = sum(lc) / len(lc) if lc else None
    m["len/incorrect"] = sum(li) / len(li) if li else None
    m["len/truncated_frac"] = sum(ro.finish_reason == "length" for ro in rollouts) / n
    return m


def count_params(model) -> int:
    """N of MFU's 6 N per token: the model's parameters, a tied embedding / LM head counted once (it is the
    LM head's matmul; the embedding lookup costs no FLOPs)."""
    return sum(p.numel() for p in model.parameters())  # parameters() lists a shared tensor once


def perf_metrics(m: dict, n_params: int, peak_tflops: float) -> dict[str, float]:
    """Throughput of a step from its logged counts and wall times (no device sync of its own):
    perf/rollout_tokens_per_s = tokens/generated / time/generate; perf/learner_tokens_per_s =
    tokens/trained / time/train; perf/mfu = 6 N tokens/trained / time/train / peak (forward 2N + backward
    4N per trained token, the attention's quadratic term and the no-grad old-logprob forward left out),
    only when the peak is known (> 0)."""
    out: dict[str, float] = {}
    gen, t_gen = m.get("tokens/generated"), m.get("time/generate")
    if gen is not None and t_gen:
        out["perf/rollout_tokens_per_s"] = gen / t_gen
    trained, t_train = m.get("tokens/trained"), m.get("time/train")
    if trained and t_train:
        out["perf/learner_tokens_per_s"] = trained / t_train
        if peak_tflops > 0:
            out["perf/mfu"] = 6.0 * n_params * trained / t_train / (peak_tflops * 1e12)
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
    m: dict[str, Any] = {"reward/mean": sum(r.total for r in rewards) / n}
    if not torch.equal(shaped, torch.tensor([r.total for r in rewards], dtype=torch.float32)):
        m["reward/shaped"] = float(shaped.mean())
    m.update(sample_metrics(rewards, rollouts))
    lens = [len(ro.response_ids) for ro in rollouts]
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
    # PPO's critic (algo.critic): value loss and clip share over the minibatch updates, the values it
    # predicts during the updates, its gradient norm, and the returns / explained variance of the batch
    m["critic/value_loss"] = means.get("value_loss")
    m["critic/value_clip_frac"] = means.get("value_clip_frac")
    m["critic/values"] = means.get("values")
    m["critic/grad_norm"] = _mean(learned.critic_grad_norms)
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
