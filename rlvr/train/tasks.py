"""What a trainer needs of a task, in one record: examples, prompt rendering, the checker, the SFT
target, and held-out evaluation with a generator.

`load_task_data` builds it from a `DataConfig` through rlvr.data's task registry; tests and the
demo may build one directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.rewards.types import RewardFn


@dataclass
class TaskData:
    """Examples and functions of one task (examples follow rlvr.data.Example: id, question,
    reference, meta)."""

    name: str
    train: Sequence[Any]  # training examples
    eval: Sequence[Any]  # held-out examples
    prompt: Callable[[Any], str]  # example -> prompt text
    reward_fn: RewardFn  # (response, example) -> Reward
    target: Callable[[Any], str]  # example -> SFT response text (the tokens after the prompt)
    stop: tuple[str, ...] = ()  # stop strings of the task's responses (besides EOS)


class TaskDataError(ValueError):
    """The data section cannot be turned into examples (unknown task, bad file, too many asked)."""


def load_task_data(data_cfg, tokenizer=None) -> TaskData:
    """TaskData for a DataConfig; any failure is a TaskDataError whose message starts with the key."""
    try:
        return _load_task_data(data_cfg, tokenizer)
    except TaskDataError:
        raise
    except (ValueError, KeyError, OSError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise TaskDataError(f"data (task={data_cfg.task!r}): {msg}") from exc


def _load_task_data(data_cfg, tokenizer=None) -> TaskData:
    """TaskData for a DataConfig via rlvr.data's task registry.

    Synthetic tasks (arithmetic, countdown, ...) generate data.num_train training and
    data.num_eval held-out problems from data.seed (arithmetic also takes data.digits); file
    tasks read data.train_path / data.eval_path (JSONL). The template and reward default to the
    task's own, so the training reward and the evaluation metric cannot drift apart.
    """
    from rlvr.data import get_task
    from rlvr.rewards import get_reward_fn

    task = get_task(data_cfg.task)
    template = data_cfg.template or task.default_template
    if data_cfg.train_path:
        train = task.load(data_cfg.train_path)
        if data_cfg.num_train:
            train = train[: data_cfg.num_train]
    elif task.generate is not None:
        train = task.generate(data_cfg.num_train, "train", data_cfg.seed, **_difficulty(data_cfg))
    else:
        raise ValueError(f"data.train_path is required for task {data_cfg.task!r} (it has no built-in generator)")
    if data_cfg.eval_path:
        held_out = task.load(data_cfg.eval_path)
    elif task.generate is not None:
        held_out = task.generate(data_cfg.num_eval, "test", data_cfg.seed, **_difficulty(data_cfg))
    else:
        held_out = []
    reward_fn = get_reward_fn(data_cfg.reward) if data_cfg.reward else task.reward_fn(template)
    return TaskData(
        name=task.name,
        train=train,
        eval=held_out,
        prompt=lambda ex: task.prompt(ex, template, tokenizer),
        reward_fn=reward_fn,
        target=lambda ex: task.target(ex, template),
    )


def _difficulty(data_cfg) -> dict:
    # Only arithmetic reads `digits`; other generators get their defaults.
    if data_cfg.task != "arithmetic":
        return {}
    return {"digits": data_cfg.digits, "operands": data_cfg.operands}


def eval_policy(generator, task: TaskData, cfg, *, greedy: bool = True, step: int = 0) -> dict[str, float]:
    """rlvr.eval metrics (accuracy, format_rate, reward, len/mean, ...) on task.eval (first
    data.num_eval examples) with one decoding mode: greedy (temperature 0) or sampled at
    run.eval_temperature with a seed fixed per run, so before/after comparisons sample alike."""
    from rlvr.rollout import SamplingSpec

    examples = list(task.eval[: cfg.data.num_eval] if cfg.data.num_eval else task.eval)
    spec = SamplingSpec(
        n=1,
        temperature=0.0 if greedy else cfg.run.eval_temperature,
        max_tokens=cfg.sampling.max_tokens,
        stop=tuple(cfg.sampling.stop) or tuple(task.stop),
        seed=cfg.run.seed + 99991,
        logprobs=False,
    )
    return evaluate_examples(generator, task, examples, spec, chunk_size=cfg.run.eval_batch_size,
                             scorer=task_scorer(task, cfg.data))


def task_scorer(task: TaskData, data_cfg):
    """A batch scorer `(responses, examples) -> list[Reward]` with the data section's verifier limits
    (reward_workers, reward_timeout_s, reward_isolate): evaluation is bounded exactly like training."""
    from rlvr.rewards import score_batch

    def scorer(responses, examples):
        return score_batch(task.reward_fn, responses, examples, workers=data_cfg.reward_workers,
                           timeout_s=data_cfg.reward_timeout_s or None, isolate=data_cfg.reward_isolate)

    return scorer


def evaluate_examples(generator, task: TaskData, examples: Sequence[Any], spec, chunk_size: int = 0,
                      scorer=None) -> dict:
    """rlvr.eval.evaluate on `examples` with `spec`; the model is put in eval mode and back."""
    from rlvr.eval import evaluate

    model = getattr(generator, "model", None)
    was_training = bool(model is not None and model.training)
    try:
        result = evaluate(
            generator,
            examples,
            [task.prompt(ex) for ex in examples],
            None if scorer is not None else task.reward_fn,
            spec,
            scorer=scorer,
            chunk_size=chunk_size or None,
        )
    finally:
        if model is not None:
            model.train(was_training)
    return {k: v for k, v in result.metrics().items() if not k.startswith("status/")}
