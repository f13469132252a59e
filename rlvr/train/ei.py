"""Expert iteration (rejection-sampling fine-tuning): `rlvr ei`.

One round, in the order data flows (the round is the run's "step": metrics, samples, checkpoints,
resume and the learning-rate schedule count rounds):

    examples = take(task.train, data_pos, n_prompts, data.seed)             # shuffled stream
    rollouts = sampler.generate(prompts, SamplingSpec.for_task(task, cfg.sampling, seed=step_seed(seed, round)))
    rewards  = score_batch(reward_fn, rollouts)                              # never raises, counts timeouts
    kept     = select_verified(rollouts, rewards, max_per_question=k, dedup=...)   # status CORRECT only
    entropy  = sampled_entropy(rollouts)          # -mean sampler logprob: the sampling distribution's entropy
                                                  # (algo.exact_entropy: a forward, the truncated model's)
    fit(model, rows_of(kept))   # E epochs x minibatches (one AdamW step each) x micro-batches: response NLL
    generator.update_weights(model.named_parameters(), version=round)

The kept pairs are the sampler's own token ids (prompt_ids + response_ids, EOS or the stop string
included), so the fine-tuning target is exactly what was sampled and verified; the loss is the
response-token NLL of `rlvr sft` (rlvr.train.sft.sft_loss, algo.aggregation). Rounds continue from
the current policy with one optimizer whose state carries over (CS336's expert iteration); STaR and
ReST-EM instead restart each iteration's fine-tuning from the base model on everything gathered so
far. A round in which nothing was verified makes no update (and says so once).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.algo import Truncation
from rlvr.models import score_tokens
from rlvr.models.export import push_tensors
from rlvr.models.scoring import sft_loss
from rlvr.rewards.batch import score_rollouts
from rlvr.rewards.types import Reward, Status
from rlvr.rollout import rollouts_to_batch, with_thinking_budget
from rlvr.rollout.types import SamplingSpec, sampled_length, sampled_mean_logprob, unsampled_length
from rlvr.runtime import memory_stats, reset_peak_memory
from rlvr.train import session
from rlvr.train.batching import split_indices
from rlvr.train.config import EIConfig
from rlvr.train.optimizer import clip_and_step, optimizer_from_config
from rlvr.train.session import (
    Timer,
    TrainResult,
    eval_prefixed,
    reward_error_log,
    sample_metrics,
    step_seed,
    take,
)
from rlvr.train.tasks import eval_policy

# ----------------------------------------------------------------------------------- validation


def validate_ei_config(cfg: EIConfig) -> None:
    """The checks of the sections expert iteration reads and EIConfig.validate's, also for a config built
    in Python (the YAML path ran them already). Raises ConfigError naming the key."""
    for section in (cfg.model, cfg.data, cfg.sampling, cfg.rollout, cfg.algo, cfg.optim, cfg.run):
        section.validate()
    cfg.validate()


# ----------------------------------------------------------------------------------- selection


@dataclass
class Selection:
    """Which rollouts of a round are kept for fine-tuning, and why the others were not."""

    kept: list[int]  # indices into the round's rollouts, in sample order
    questions: int  # questions sampled this round
    solved: int  # questions with at least one verified (status correct) sample
    verified: int  # samples whose status is correct
    duplicates: int  # verified samples dropped as a repeat of a kept text of the same question
    capped: int  # verified, distinct samples dropped by algo.max_per_question


def select_verified(rollouts: Sequence[Any], rewards: Sequence[Reward], *, max_per_question: int = 0,
                    dedup: bool = True, questions: int | None = None) -> Selection:
    """Keep the samples the verifier judged correct: per question (Rollout.group), in sample order,
    a text already kept for that question is skipped when `dedup`, and at most `max_per_question`
    (0 = no cap) are kept. `questions`: how many were sampled (default: the distinct groups seen)."""
    if len(rollouts) != len(rewards):
        raise ValueError(f"{len(rollouts)} rollouts but {len(rewards)} rewards")
    kept: list[int] = []
    texts: dict[int, set[str]] = {}
    count: dict[int, int] = {}
    solved: set[int] = set()
    verified = duplicates = capped = 0
    for i, (ro, rw) in enumerate(zip(rollouts, rewards, strict=True)):
        if rw.status is not Status.CORRECT:
            continue
        verified += 1
        solved.add(ro.group)
        seen = texts.setdefault(ro.group, set())
        if dedup and ro.text in seen:
            duplicates += 1
            continue
        if max_per_question and count.get(ro.group, 0) >= max_per_question:
            capped += 1
            continue
        seen.add(ro.text)
        count[ro.group] = count.get(ro.group, 0) + 1
        kept.append(i)
    n_questions = questions if questions is not None else len({ro.group for ro in rollouts})
    return Selection(kept, n_questions, len(solved), verified, duplicates, capped)


# ------------------------------------------------------------------------------------ learning


@dataclass
class Fitted:
    """What the round's fine-tuning produced."""

    losses: list[float] = field(default_factory=list)  # one per optimizer step
    grad_norms: list[float] = field(default_factory=list)  # one per optimizer step, before clipping
    trained_tokens: int = 0  # prompt + response tokens of the kept rows, times the epochs


class _PerRound:
    """Stands in for the scheduler inside clip_and_step: expert iteration steps its schedule once
    per round (how many optimizer steps a round makes depends on how many answers were verified,
    so a schedule over optimizer steps would have no known end)."""

    def step(self) -> None:
        pass


def fit(model, optimizer, batch, *, epochs: int, batch_size: int, micro_batch_size: int, aggregation: str,
        norm_length: int, grad_clip: float, seed: int) -> Fitted:
    """SFT on the kept rows `batch` (a TrainingBatch, or None when nothing was kept): `epochs`
    passes, each in a fresh order drawn from `seed + epoch`, minibatches of `batch_size` rows (one
    optimizer step each), backward per micro-batch (rlvr.train.sft.sft_loss: the response-token
    NLL aggregated over the minibatch)."""
    out = Fitted()
    if batch is None:
        return out
    n = batch.input_ids.shape[0]
    model.train()
    out.trained_tokens = epochs * int(batch.attention_mask.sum())
    for epoch in range(epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
        for chunk in split_indices(n, batch_size):
            mb = batch.rows(order[chunk.start : chunk.stop])
            loss = sft_loss(model, mb, aggregation, micro_batch_size or batch_size, norm_length)
            out.losses.append(loss)
            if not (loss == loss and abs(loss) != float("inf")):
                optimizer.zero_grad(set_to_none=True)
                return out  # the caller stops the run; never step on NaN gradients
            out.grad_norms.append(clip_and_step(model, optimizer, _PerRound(), grad_clip))
    return out


def sampled_entropy(rollouts: Sequence[Any]) -> float:
    """Mean negative sampler logprob of the sampled tokens (nats / token; forced tokens, loss_mask
    False, excluded); free, the sampler returns the logprobs. Each term -log q(y_t | y_<t) has
    expectation H(q_t), where q_t is the distribution the sampler drew from and reports logprobs under:
    logits / temperature cut to top_k / top_p AND, before sampling.min_tokens, with end-of-sequence
    banned. So it estimates the entropy of the sampling distribution, not of the model: under top_p < 1
    or top_k it is the truncated distribution's (lower than the model's), and under min_tokens it is not
    what `sample_entropy` (algo.exact_entropy) computes, which keeps EOS. An engine that reports raw
    (untruncated) logprobs (vLLM before 0.10.2) makes it the cross-entropy E_q[-log p] instead, above both."""
    total, tokens = 0.0, 0
    for ro in rollouts:
        mask = ro.loss_mask if ro.loss_mask is not None else [True] * len(ro.logprobs)
        for lp, m in zip(ro.logprobs, mask, strict=True):
            if m:
                total -= lp
                tokens += 1
    return total / max(1, tokens)


def sample_entropy(model, batch, *, micro_batch_size: int, temperature: float,
                   truncation=None) -> tuple[float, list[float]]:
    """Mean token entropy (nats) of the sampling distribution (logits / temperature, truncated to the
    sampler's top-k / top-p with truncation: rlvr.algo.logprobs.Truncation) over the
    response tokens of `batch` (all of a round's samples), from one no-grad forward per micro-batch
    under the weights that sampled them; also each row's mean. Token-weighted, like `entropy` of
    `rlvr train`."""
    was_training = model.training
    model.eval()
    total, tokens, rows = 0.0, 0, []
    try:
        with torch.no_grad():
            for s in range(0, batch.input_ids.shape[0], micro_batch_size):
                mb = batch.rows(torch.arange(s, min(s + micro_batch_size, batch.input_ids.shape[0])))
                ent = score_tokens(model, mb.input_ids, mb.labels, mb.attention_mask, with_entropy=True,
                                   temperature=temperature, truncation=truncation).entropy.float().cpu()
                mask = mb.response_mask
                per_row = (ent * mask).sum(-1)
                total += float(per_row.sum())
                tokens += int(mask.sum())
                rows += [float(e) / max(1, int(m)) for e, m in zip(per_row, mask.sum(-1), strict=True)]
    finally:
        model.train(was_training)
    return total / max(1, tokens), rows


# ------------------------------------------------------------------------------------- the loop


def train_ei(
    cfg: EIConfig,
    *,
    resume: bool = False,
    data=None,
    on_step: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Run expert iteration as configured; resume=True continues cfg.run.out_dir from its latest
    checkpoint. data: optional TaskData instead of loading cfg.data. Returns the TrainResult of
    `rlvr train` (run_dir, steps = rounds, last metrics, final held-out evaluation).

    Config problems raise ConfigError (TaskDataError for data) and an existing run FileExistsError,
    all before the run directory is touched."""
    validate_ei_config(cfg)
    if (done := session.already_done(cfg, resume)) is not None:
        return done
    cfg, model, tokenizer, task = session.start(cfg, data=data, resume=resume)
    a, s, r = cfg.algo, cfg.sampling, cfg.run
    optimizer, scheduler = optimizer_from_config(model, cfg.optim, total_steps=r.steps,
                                                 master_weights=cfg.model.master_weights)
    generator = session.sampler(cfg.rollout, model, tokenizer, model_source=session.model_source(cfg.model),
                                seed=r.seed, batch_size=s.n_prompts * s.group_size)
    sampler = with_thinking_budget(generator, s.thinking_budget, s.stop_thinking_text)
    with session.RunLoop(cfg, "ei", resume=resume, model=model, tokenizer=tokenizer, optimizer=optimizer,
                         scheduler=scheduler, task=task) as loop:
        if loop.start_step:  # the checkpoint's weights replaced those the generator was built with
            generator.update_weights(push_tensors(model), version=loop.start_step)
        data_pos, noted_empty = int(loop.state.get("data_pos", 0)), False
        reward_errors = reward_error_log(cfg.data, task, loop.path)  # a raising reward is printed, logged, stops
        micro = a.micro_batch_size or a.batch_size
        for rnd in range(loop.start_step + 1, r.steps + 1):
            timer = Timer()
            reset_peak_memory(cfg.model.device)
            examples = take(task.train, data_pos, s.n_prompts, cfg.data.seed)
            data_pos += s.n_prompts
            with timer("generate"):
                spec = SamplingSpec.for_task(task, s, seed=step_seed(r.seed, rnd))
                rollouts = sampler.generate([task.prompt(ex) for ex in examples], spec)
                generator.sleep()  # colocated vLLM hands its memory to the learner
            ro_examples = [examples[ro.group] for ro in rollouts]
            with timer("score"):
                rewards = score_rollouts(rollouts, ro_examples, task.reward_fn, workers=cfg.data.reward_workers,
                                         timeout_s=cfg.data.reward_timeout_s, isolate=cfg.data.reward_isolate)
                reward_errors.observe(rnd, rewards, ro_examples)  # most are errors: RewardErrorsStop
                sel = select_verified(rollouts, rewards, max_per_question=a.max_per_question, dedup=a.dedup,
                                      questions=len(examples))
            if a.exact_entropy or any(ro.logprobs is None for ro in rollouts):
                with timer("entropy"):
                    entropy, row_entropy = sample_entropy(model, rollouts_to_batch(rollouts, tokenizer.pad_token_id),
                                                          micro_batch_size=micro, temperature=s.temperature or 1.0,
                                                          truncation=Truncation.of(s.top_k, s.top_p))
            else:
                entropy, row_entropy = sampled_entropy(rollouts), None
            with timer("train"):
                kept = rollouts_to_batch([rollouts[i] for i in sel.kept], tokenizer.pad_token_id) if sel.kept else None
                fitted = fit(model, optimizer, kept, epochs=a.epochs, batch_size=a.batch_size,
                             micro_batch_size=micro, aggregation=a.aggregation, norm_length=s.max_tokens,
                             grad_clip=cfg.optim.grad_clip, seed=step_seed(r.seed, rnd))
            session.check_finite(rnd, loss=session.mean(fitted.losses), grad_norm=session.mean(fitted.grad_norms))
            with warnings.catch_warnings():  # a round without an update still advances the schedule
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                scheduler.step()  # the schedule counts rounds (see _PerRound)
            if fitted.grad_norms:
                with timer("sync"):
                    generator.update_weights(push_tensors(model), version=rnd)
            elif not noted_empty:
                noted_empty = True
                session.say(
                    f"round {rnd}: none of the {len(rollouts)} samples ({len(examples)} questions x "
                    f"{s.group_size}) was verified correct: nothing to fine-tune on, no update. A policy that "
                    "never solves the task needs a warm start (rlvr sft, then model.init_from=RUN_DIR) or "
                    "more tries (sampling.group_size)")  # said even with run.progress=false: nothing is learned

            metrics = round_metrics(rewards, rollouts, sel, fitted, entropy)
            metrics["lr"] = scheduler.get_last_lr()[0]
            metrics["tokens_per_s"] = metrics["tokens/generated"] / max(time.perf_counter() - timer.t0, 1e-9)
            if loop.due(rnd, r.eval_every):
                if rnd == r.steps:
                    session.say_final_evaluation(task, cfg)
                with timer("eval"):
                    metrics.update(eval_prefixed(eval_policy(sampler, task, cfg, greedy=r.eval_greedy, step=rnd)))
            metrics.update(timer.metrics() | memory_stats(cfg.model.device))
            if r.log_samples_every and (rnd % r.log_samples_every == 0 or rnd == 1):
                loop.run.log_samples(rnd, _samples(rollouts, ro_examples, rewards, set(sel.kept), row_entropy,
                                                   r.num_log_samples, s.group_size))
            loop.log(rnd, metrics, on_step, acc=metrics["accuracy"], kept=metrics["kept_frac"],
                     loss=metrics.get("loss"))
            loop.checkpoint(rnd, {"data_pos": data_pos})
            loop.stop.check(rnd)
    return loop.result(r.steps)


def round_metrics(rewards: Sequence[Reward], rollouts: Sequence[Any], sel: Selection, fitted: Fitted,
                  entropy: float) -> dict[str, Any]:
    """Per-round metrics (docs/runs.md): the samples' reward and accuracy under the names `rlvr
    train` uses, what was kept, and the fine-tuning's loss."""
    n = len(rewards)
    m: dict[str, Any] = {"reward/mean": sum(r.total for r in rewards) / n}
    m.update(sample_metrics(rewards, rollouts))
    m["entropy"] = entropy
    m["kept_frac"] = len(sel.kept) / n
    m["ei/kept"] = len(sel.kept)
    m["ei/solved_frac"] = sel.solved / max(1, sel.questions)
    m["ei/duplicates"] = sel.duplicates
    m["ei/capped"] = sel.capped
    m["ei/sft_steps"] = len(fitted.grad_norms)
    m["verifier/timeouts"] = sum(r.status is Status.TIMEOUT for r in rewards)
    m["verifier/errors"] = sum(r.status is Status.ERROR for r in rewards)
    m["loss"] = session.mean(fitted.losses)
    m["grad_norm"] = session.mean(fitted.grad_norms)
    m["tokens/generated"] = sum(len(ro.response_ids) for ro in rollouts)
    m["tokens/trained"] = fitted.trained_tokens
    return {k: v for k, v in m.items() if v is not None}


def _samples(rollouts, examples, rewards, kept: set[int], row_entropy: list[float] | None, k: int,
             group_size: int) -> list[dict]:
    """First response of the first k questions: prompt, response, reference, reward parts, status,
    whether it was kept for fine-tuning, the tokens the policy sampled (`length`) and those it did not
    (`unsampled`: a thinking budget's forced text), mean token entropy (nats; with algo.exact_entropy) and
    mean sampler logprob of the sampled tokens."""
    out = []
    for i in range(0, min(len(rollouts), k * group_size), group_size):
        ro, ex, rw = rollouts[i], examples[i], rewards[i]
        out.append({
            "prompt": ro.prompt,
            "response": ro.text,
            "reference": ex.reference,
            "reward": rw.total,
            "parts": dict(rw.parts),
            "status": rw.status.value,
            "kept": i in kept,
            "length": sampled_length(ro),
            "unsampled": unsampled_length(ro),
            "entropy": None if row_entropy is None else row_entropy[i],
            "mean_logprob": sampled_mean_logprob(ro),
        })
    return out
