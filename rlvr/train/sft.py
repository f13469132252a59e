"""Supervised fine-tuning on prompt/response pairs: `rlvr sft`.

One step: take batch_size examples from the shuffled stream -> tokenize prompt and target
separately (target + EOS) -> per-token negative log-likelihood on response tokens only ->
aggregation over the whole batch (algo.aggregation, normalizers from the full batch, so
micro-batching does not change the gradient) -> backward per micro-batch -> clip -> AdamW step.
Every run.eval_every steps the policy is evaluated with a generator on held-out problems.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rlvr.config import ConfigError
from rlvr.data import load_sft
from rlvr.models import TrainingBatch, build_training_batch
from rlvr.models.export import push_tensors
from rlvr.models.positions import max_positions, prompt_lengths
from rlvr.models.scoring import sft_loss  # noqa: F401 - re-exported (rlvr sft's loss)
from rlvr.rollout import with_thinking_budget
from rlvr.runtime import memory_stats
from rlvr.train import session
from rlvr.train.config import SFTConfig
from rlvr.train.optimizer import clip_and_step, optimizer_from_config
from rlvr.train.session import TrainResult, eval_prefixed, take
from rlvr.train.tasks import TaskDataError, eval_policy


def validate_sft_config(cfg: SFTConfig) -> tuple[int, int]:
    """Cross-field checks (SFTConfig.validate, which rlvr.config already ran for a loaded config); returns
    (batch_size, micro_batch_size). Raises ConfigError naming the key."""
    cfg.validate()
    return cfg.batch_sizes()


def sft_batch(examples, prompt_fn, target_fn, tokenizer, max_length: int) -> TrainingBatch:
    """Prompt and target tokenized separately (target + EOS); truncated to max_length tokens.
    prompt_fn / target_fn: example -> text."""
    prompt_ids, response_ids = [], []
    for ex in examples:
        p = tokenizer.encode(prompt_fn(ex))
        t = tokenizer.encode(target_fn(ex), add_special_tokens=False) + [tokenizer.eos_token_id]
        room = max(0, max_length - len(p))
        prompt_ids.append(p[:max_length])
        response_ids.append(t[:room])
    return build_training_batch(prompt_ids, response_ids, tokenizer.pad_token_id)


def _check_sft_positions(model, tokenizer, pairs, prompt_fn, target_fn, cfg) -> None:
    """A training sequence (prompt + target, cut at algo.max_length) longer than the model's positions is
    refused before any work, naming algo.max_length and the longest pair (an absolute-position model
    raised an IndexError from inside the forward)."""
    limit = max_positions(model)
    if limit is None or cfg.algo.max_length <= limit:
        return  # every sequence is cut at max_length
    texts = [prompt_fn(e) + target_fn(e) for e in pairs]
    lengths = prompt_lengths(tokenizer, texts)
    i = max(range(len(lengths)), key=lengths.__getitem__)
    if lengths[i] > limit:
        raise ConfigError(
            f"algo.max_length={cfg.algo.max_length}: the longest training pair (prompt + target, {lengths[i]} "
            f"tokens, example {getattr(pairs[i], 'id', i)}) exceeds the model's {limit} positions "
            f"(max_position_embeddings): lower algo.max_length to at most {limit}")


def train_sft(
    cfg: SFTConfig,
    *,
    resume: bool = False,
    data=None,
    on_step: Callable[[int, dict], None] | None = None,
    stop_at_accuracy: float = 0.0,
    stop_after: int = 0,
    eval_name: str = "eval",
) -> TrainResult:
    """Run SFT as configured (resume=True continues cfg.run.out_dir from its latest checkpoint).
    data: optional TaskData instead of loading cfg.data. stop_at_accuracy > 0 stops early once a
    periodic greedy evaluation reaches it (the demo's "until partly right"). stop_after > 0 ends the
    run after that step with a checkpoint, as a preempted job would (the schedule still spans run.steps).
    eval_name: the prefix of the periodic evaluation's metrics; "val" when data's eval split is a validation
    slice of the training problems rather than held-out ones (the demo), logged as val/accuracy, ...)."""
    batch_size, micro = validate_sft_config(cfg)
    if (done := session.already_done(cfg, resume)) is not None:
        return done
    # the task's held-out problems and checker drive the periodic evaluation; its training split is read only
    # when the training pairs are the task's own targets (no data.sft_path)
    cfg, model, tokenizer, task = session.start(cfg, data=data, train=not cfg.data.sft_path, rl=False, resume=resume)
    r = cfg.run
    if cfg.data.sft_path:
        # a conversational row ({"messages"}) through the tokenizer's chat template when it has one
        pairs, prompt_fn, target_fn = (load_sft(cfg.data.sft_path), (lambda e: e.prompt_text(tokenizer)),
                                       (lambda e: e.response))
    else:
        pairs, prompt_fn, target_fn = task.train, task.prompt, task.target
    if not pairs:
        raise TaskDataError(f"data.sft_path={cfg.data.sft_path}: no training examples" if cfg.data.sft_path
                            else f"data: task {task.name!r} has no training examples")
    _check_sft_positions(model, tokenizer, pairs, prompt_fn, target_fn, cfg)  # the training sequences too
    o = cfg.optim
    optimizer, scheduler = optimizer_from_config(model, o, total_steps=r.steps, master_weights=cfg.model.master_weights)
    # evaluation samples through the configured engine; the learner's weights are pushed before each one
    generator = session.sampler(cfg.rollout, model, tokenizer, model_source=session.model_source(cfg.model),
                                seed=r.seed, batch_size=r.eval_batch_size)
    sampler = with_thinking_budget(generator, cfg.sampling.thinking_budget, cfg.sampling.stop_thinking_text,
                                   template=getattr(task, "template", ""))
    with session.RunLoop(cfg, "sft", resume=resume, model=model, tokenizer=tokenizer, optimizer=optimizer,
                         scheduler=scheduler, task=task) as loop:
        step = loop.start_step
        for step in range(loop.start_step + 1, r.steps + 1):
            t0 = time.perf_counter()
            model.train()
            examples = take(pairs, (step - 1) * batch_size, batch_size, cfg.data.seed)
            batch = sft_batch(examples, prompt_fn, target_fn, tokenizer, cfg.algo.max_length)
            if not batch.response_mask.any():
                raise TaskDataError(
                    f"step {step}: every response was cut off: the prompts are longer than "
                    f"algo.max_length={cfg.algo.max_length} tokens; raise algo.max_length")
            loss = sft_loss(model, batch, cfg.algo.aggregation, micro, cfg.algo.max_length)
            session.check_finite(step, loss=loss)
            grad_norm = clip_and_step(model, optimizer, scheduler, o.grad_clip)
            session.check_finite(step, grad_norm=grad_norm)
            n_tok = int(batch.response_mask.sum())
            dt = time.perf_counter() - t0
            metrics: dict[str, Any] = {
                "loss": loss,
                "grad_norm": grad_norm,
                "lr": scheduler.get_last_lr()[0],
                "tokens_per_s": n_tok / max(dt, 1e-9),
                "time/train": dt,
            }
            done = step == r.steps or step == stop_after
            if loop.due(step, r.eval_every):
                if step == r.steps:
                    session.say_final_evaluation(task, cfg)
                generator.update_weights(push_tensors(model), version=step)
                ev = eval_policy(sampler, task, cfg, greedy=r.eval_greedy, step=step,
                                 samples=r.num_log_samples if r.log_samples_every else 0)
                samples = ev.pop("samples", [])
                if samples:
                    loop.run.log_samples(step, samples)
                metrics.update(eval_prefixed(ev, eval_name))
                generator.sleep()
                if stop_at_accuracy and ev.get("accuracy", 0.0) >= stop_at_accuracy:
                    done = True
            metrics.update(memory_stats(cfg.model.device))
            acc = metrics.get(f"{eval_name}/accuracy")
            loop.log(step, metrics, on_step, loss=loss, **({"acc": acc} if acc is not None else {}))
            loop.checkpoint(step, {"data_pos": step * batch_size}, force=done)
            if done:
                break
            loop.stop.check(step)
    return loop.result(step)
