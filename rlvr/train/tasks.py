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


def load_task_data(data_cfg, tokenizer=None) -> TaskData:
    """TaskData for `data_cfg` (rlvr.train.config.DataConfig) via rlvr.data.get_task."""
    from rlvr.data import load_task_data as _load

    return _load(data_cfg, tokenizer)


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
    return evaluate_examples(generator, task, examples, spec, chunk_size=cfg.run.eval_batch_size)


def evaluate_examples(generator, task: TaskData, examples: Sequence[Any], spec, chunk_size: int = 0) -> dict:
    """rlvr.eval.evaluate on `examples` with `spec`; the model is put in eval mode and back."""
    from rlvr.eval import evaluate

    model = getattr(generator, "model", None)
    was_training = bool(model is not None and model.training)
    try:
        result = evaluate(
            generator,
            examples,
            [task.prompt(ex) for ex in examples],
            task.reward_fn,
            spec,
            chunk_size=chunk_size or None,
        )
    finally:
        if model is not None:
            model.train(was_training)
    return {k: v for k, v in result.metrics().items() if not k.startswith("status/")}
