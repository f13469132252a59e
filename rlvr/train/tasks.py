"""A task for the trainers: `load_task_data` builds an rlvr.data.TaskData (examples, prompt contract,
checker) from a `DataConfig` through rlvr.data's task registry, or from data.env's environment; held-out
evaluation of a generator on it (`eval_policy`, `evaluate_examples`: a trainer's door to the one evaluation
core, rlvr.eval.evaluate; rlvr.train.evaluation.evaluate_policy is the stage's); the task's scorer with the
data section's verifier limits (`task_scorer`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rlvr.data import get_task, load_hf
from rlvr.data.jsonl import DataError, scan_jsonl
from rlvr.data.task_data import TaskData, TaskDataError  # noqa: F401 - re-exported
from rlvr.data.tasks.base import map_columns, source_keys
from rlvr.data.templates import mode_tagged
from rlvr.envs.external import external_task_data, verifiers_task_data
from rlvr.envs.task import env_task_data
from rlvr.eval import cpu_chunks, evaluate
from rlvr.rewards import score_batch
from rlvr.rewards.batch import resolve_reward_fn
from rlvr.rewards.judge import judge_metrics, reward_uses_judge
from rlvr.rewards.registry import bind_reward, with_tolerance
from rlvr.rollout.types import SamplingSpec
from rlvr.train.config.external import EXTERNAL_ENV, VERIFIERS_PREFIX, ExternalConfig
from rlvr.train.judge import build_judge


def load_task_data(data_cfg, tokenizer=None, *, train: bool = True, episodes: bool = False, judge=None,
                   judge_device: str = "cpu", external=None) -> TaskData:
    """TaskData for a DataConfig; any failure is a TaskDataError whose message starts with the key.
    train=False (evaluation) reads or generates no training split. episodes=True: the caller runs
    multi-turn episodes for data.env (rlvr train); other callers get a clear refusal. judge: the run's
    judge section (JudgeConfig): when data.reward names the judge, it is built (a local judge model loads
    on judge.device or `judge_device`) and bound into the reward; None leaves the registry's unconfigured
    judge (every call an ERROR naming the keys). external: the run's external section (ExternalConfig) for
    data.env=external / verifiers:<env> (None: its defaults)."""
    if data_cfg.env and not episodes:
        raise TaskDataError(f"data.env={data_cfg.env!r}: multi-turn environments run in `rlvr train` only so far "
                            "(its periodic and final evaluation covers held-out episodes); unset data.env here")
    try:
        if data_cfg.env == EXTERNAL_ENV:  # the task's problems and checker, episodes by external.command
            return external_task_data(_load_task_data(data_cfg, tokenizer, train, judge, judge_device), data_cfg,
                                      external or ExternalConfig(), tokenizer)
        if data_cfg.env.startswith(VERIFIERS_PREFIX):
            return verifiers_task_data(data_cfg, external or ExternalConfig(), tokenizer, train=train)
        if data_cfg.env:
            return env_task_data(data_cfg, tokenizer, train=train)
        return _load_task_data(data_cfg, tokenizer, train, judge, judge_device)
    except TaskDataError:
        raise
    except (ValueError, KeyError, OSError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        if "missing key" in msg and not (data_cfg.question_key or data_cfg.answer_key):
            msg += "; map your own column names with data.question_key / data.answer_key"
        raise TaskDataError(f"data (task={data_cfg.task!r}): {msg}") from exc


# data.hf_dataset splits read by check_data_files before the model loads, handed to the loader that follows
# (popped there: read once, held only in between); keyed by everything the rows depend on
_CHECKED_HF: dict[tuple, list] = {}


def _hf_key(data_cfg, split: str, columns: dict[str, str]) -> tuple:
    return (data_cfg.task, data_cfg.hf_dataset, data_cfg.hf_config, split, tuple(sorted(columns.items())))


def _load_hf(data_cfg, split: str, columns: dict[str, str]) -> list:
    """Rows of data.hf_dataset's `split` as the task's Examples; a failure of `datasets` (no such dataset or
    split, offline, ...) becomes a one-line TaskDataError naming data.hf_dataset."""
    if (checked := _CHECKED_HF.pop(_hf_key(data_cfg, split, columns), None)) is not None:
        return checked
    try:
        return load_hf(data_cfg.task, data_cfg.hf_dataset, split, config=data_cfg.hf_config or None, columns=columns)
    except DataError as exc:  # a row the task cannot read: dataset[split]:row and why
        raise TaskDataError(f"data.hf_dataset={data_cfg.hf_dataset!r}: {exc}") from None
    except TaskDataError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many types (FileNotFoundError, DatasetNotFoundError...)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TaskDataError(f"data.hf_dataset={data_cfg.hf_dataset!r} (split {split!r}): {type(exc).__name__}: "
                            f"{first}") from exc

def _eval_columns(data_cfg, columns: dict[str, str]) -> dict[str, str]:
    """The held-out rows' column mapping: data.eval_question_key / eval_answer_key where set, else the training
    rows' (data.question_key / answer_key)."""
    return {"question": data_cfg.eval_question_key or columns["question"],
            "answer": data_cfg.eval_answer_key or columns["answer"]}


BAD_LINES_SHOWN = 3  # bad lines quoted in the one-line error of check_data_files (the count says how many)


def check_data_files(data_cfg, *, train: bool = True) -> None:
    """Before any model is loaded: every line of data.train_path (when `train`) and data.eval_path is read
    and parsed as the task's loader will, and all the bad ones are reported in one TaskDataError naming the
    key, the file and the first lines (a file used to report only its first bad line, after the model had
    loaded); a file with no problems is named too (it was "task 'gsm8k' has no training examples")."""
    if data_cfg.env_makes_problems():
        required, parse = ("question", "reference"), None  # rlvr.envs.task reads these two keys
    else:
        try:
            reg = get_task(data_cfg.task)
        except KeyError:
            return  # the config check names an unknown task
        if reg.parse_row is None:
            return  # a synthetic task without a row format: its loader says so

        train_columns = {"question": data_cfg.question_key,
                         "answer": data_cfg.answer_key}
        by_key = {"train_path": train_columns, "eval_path": _eval_columns(data_cfg, train_columns)}

    for key, split in (("train_path", "training"), ("eval_path", "held-out")):
        path = getattr(data_cfg, key)
        if not path or (key == "train_path" and not train):
            continue
        if not data_cfg.env_makes_problems():  # the task's row format, under this file's column mapping
            columns = by_key[key]
            required = source_keys(reg.required_keys, columns)

            def parse(row, where, i, _parse=reg.parse_row, _columns=columns):
                return _parse(map_columns(row, _columns, where), where, i)
        try:
            good, errors = scan_jsonl(path, required, parse)
        except DataError as exc:
            raise TaskDataError(f"data.{key}={path}: {exc.reason}") from None
        except OSError as exc:
            raise TaskDataError(f"data.{key}={path}: cannot read it ({exc.strerror or exc})") from None
        if errors:
            shown = "; ".join(f"line {e.line}: {e.reason}" for e in errors[:BAD_LINES_SHOWN])
            more = f" (and {len(errors) - BAD_LINES_SHOWN} more)" if len(errors) > BAD_LINES_SHOWN else ""
            hint = ""
            if any("missing key" in e.reason for e in errors) and not (
                    data_cfg.question_key or data_cfg.answer_key):
                hint = "; map your own column names with data.question_key / data.answer_key"
            raise TaskDataError(f"data.{key}={path}: {len(errors)} bad line{'s' if len(errors) > 1 else ''} of "
                                f"{good + len(errors)}: {shown}{more}{hint}")
        if not good and key == "train_path":  # an empty held-out file is a run without evaluation (said at start)
            raise TaskDataError(f"data.{key}={path}: no {split} problems (the file has no non-blank lines)")
    if data_cfg.hf_dataset and not data_cfg.env_makes_problems():
        _check_hf(data_cfg, train=train)


def _check_hf(data_cfg, *, train: bool) -> None:
    """data.hf_dataset read and parsed before any model loads, like the JSONL files: a missing dataset or split,
    a missing column, a corrupt file or a row the task cannot read is a TaskDataError now, not after the model
    loaded. The rows are kept for the loader that follows (_CHECKED_HF)."""
    columns = {"question": data_cfg.question_key, "answer": data_cfg.answer_key}
    splits = []
    if train:
        splits.append((data_cfg.hf_split, columns))
    if data_cfg.hf_eval_split and not data_cfg.eval_path:
        splits.append((data_cfg.hf_eval_split, _eval_columns(data_cfg, columns)))
    _CHECKED_HF.clear()
    for split, cols in splits:
        rows = _load_hf(data_cfg, split, cols)
        if not rows and split == data_cfg.hf_split and train:
            raise TaskDataError(f"data.hf_dataset={data_cfg.hf_dataset!r} (split {split!r}): no training problems")
        _CHECKED_HF[_hf_key(data_cfg, split, cols)] = rows


def _load_task_data(data_cfg, tokenizer=None, need_train: bool = True, judge=None,
                    judge_device: str = "cpu") -> TaskData:
    """TaskData for a DataConfig via rlvr.data's task registry.

    Synthetic tasks (arithmetic, countdown, ...) generate data.num_train training and
    data.num_eval held-out problems from data.seed (arithmetic also takes data.digits); file
    tasks read data.train_path / data.eval_path (JSONL). The template and reward default to the
    task's own, so the training reward and the evaluation metric cannot drift apart.
    """
    task = get_task(data_cfg.task)
    template = data_cfg.template or task.default_template
    columns = {"question": data_cfg.question_key, "answer": data_cfg.answer_key}
    eval_columns = _eval_columns(data_cfg, columns)
    hf = data_cfg.hf_dataset
    if not need_train:
        train = []
    elif data_cfg.train_path or hf:
        train = (_load_hf(data_cfg, data_cfg.hf_split, columns) if hf else
                 task.load(data_cfg.train_path, columns=columns))
        if data_cfg.num_train:
            train = train[: data_cfg.num_train]
    elif task.generate is not None:
        count = data_cfg.generated_train_count() if hasattr(data_cfg, "generated_train_count") else data_cfg.num_train
        train = task.generate(count, "train", data_cfg.seed, **_difficulty(data_cfg))
    else:
        raise ValueError(f"data.train_path is required for task {data_cfg.task!r} (it has no built-in generator)")
    if data_cfg.eval_path:
        held_out = task.load(data_cfg.eval_path, columns=eval_columns)
    elif hf and data_cfg.hf_eval_split:
        held_out = _load_hf(data_cfg, data_cfg.hf_eval_split, eval_columns)
    elif task.generate is not None:
        held_out = task.generate(data_cfg.num_eval, "test", data_cfg.seed, **_difficulty(data_cfg))
    else:
        held_out = []
    reward_fn = resolve_reward_fn(data_cfg.reward) if data_cfg.reward else task.reward_fn(template)
    if judge is not None and reward_uses_judge(data_cfg.reward):  # the model judge, on the task's own checker
        reward_fn = bind_reward(reward_fn, "judge", build_judge(judge, task.reward_fn(template), device=judge_device,
                                                                seed=data_cfg.seed))
    if data_cfg.verifier_tolerance:
        reward_fn = with_tolerance(reward_fn, data_cfg.verifier_tolerance)
    return TaskData(
        name=task.name,
        train=train,
        eval=held_out,
        prompt=mode_prompt(lambda ex: task.prompt(ex, template, tokenizer), data_cfg.thinking_mode),
        reward_fn=reward_fn,
        target=lambda ex: task.target(ex, template),
        stop=task.stop_strings(template),
        template=template,
    )


def mode_prompt(prompt, mode: str):
    """The prompt function with Qwen3's thinking-mode tag appended to each question (rlvr.data.templates.mode_tagged;
    '' = `prompt` itself)."""
    if not mode:
        return prompt
    return lambda ex: prompt(dataclasses.replace(ex, question=mode_tagged(ex.question, mode)))


def _difficulty(data_cfg) -> dict:
    # Only arithmetic reads `digits`; a reasoning-gym dataset its data.rg; other generators get their defaults.
    if data_cfg.task.startswith("reasoning_gym:"):
        return {"rg": dict(data_cfg.rg)}
    if data_cfg.task != "arithmetic":
        return {}
    return {"digits": data_cfg.digits, "operands": data_cfg.operands}


def eval_examples(task: TaskData, num_eval: int) -> list:
    """The held-out problems evaluation uses: the first num_eval (0 = all)."""
    return list(task.eval[:num_eval] if num_eval else task.eval)


def eval_policy(generator, task: TaskData, cfg, *, greedy: bool = True, step: int = 0,
                samples: int = 0) -> dict[str, Any]:
    """rlvr.eval metrics (accuracy, format_rate, reward, len/mean, ...) on task.eval (first
    data.num_eval examples) with one decoding mode: greedy (temperature 0) or sampled at
    run.eval_temperature with a seed fixed per run, so before/after comparisons sample alike.
    {} when the task has no held-out problems (the trainer says so at start). samples > 0 adds
    "samples": the first that many graded responses as rows for samples.jsonl."""
    examples = eval_examples(task, cfg.data.num_eval)
    if not examples:
        return {}
    spec = SamplingSpec.for_task(task, cfg.sampling, n=1, temperature=0.0 if greedy else cfg.run.eval_temperature,
                              seed=cfg.run.seed + 99991, logprobs=False)
    if task.env is not None:  # multi-turn episodes (rlvr.envs)
        return task.env.evaluate(generator, examples, spec, chunk_size=cfg.run.eval_batch_size, samples=samples)
    judge_metrics(task.reward_fn)  # the judge's counts from here on are the evaluation's (the step took its own)
    out = evaluate_examples(generator, task, examples, spec, chunk_size=cfg.run.eval_batch_size,
                            scorer=task_scorer(task, cfg.data), samples=samples,
                            chunks=_cpu_eval_chunks(generator, task, examples, cfg))
    return out | judge_metrics(task.reward_fn)


def _cpu_eval_chunks(generator, task: TaskData, examples: Sequence[Any], cfg) -> list[int] | None:
    """Problems per generate call of a trainer's evaluation on CPU, sized by tokens (rlvr.eval.cpu_chunks);
    None (run.eval_batch_size per call) on a GPU, with vLLM, or when the engine's tokenizer is not at hand."""
    gen, tokenizer = generator, None
    while gen is not None and tokenizer is None:  # through sampling wrappers (thinking budget) to the engine
        tokenizer, gen = getattr(gen, "tokenizer", None), getattr(gen, "gen", None)
    if tokenizer is None:
        return None
    budget = max(cfg.sampling.thinking_budget, 0)
    return cpu_chunks(tokenizer, [task.prompt(ex) for ex in examples], n=1, max_tokens=cfg.sampling.max_tokens + budget,
                      max_prompts=cfg.run.eval_batch_size, device=cfg.model.device, backend=cfg.rollout.backend)


def task_scorer(task: TaskData, data_cfg):
    """A batch scorer `(responses, examples) -> list[Reward]` with the data section's verifier limits
    (reward_workers, reward_timeout_s, reward_isolate): evaluation is bounded exactly like training."""
    def scorer(responses, examples):
        return score_batch(task.reward_fn, responses, examples, workers=data_cfg.reward_workers,
                           timeout_s=data_cfg.reward_timeout_s or None, isolate=data_cfg.reward_isolate)

    return scorer


def evaluate_examples(generator, task: TaskData, examples: Sequence[Any], spec, chunk_size: int = 0,
                      scorer=None, samples: int = 0, chunks: Sequence[int] | None = None) -> dict:
    """rlvr.eval.evaluate on `examples` with `spec`; the model is put in eval mode and back. chunks: problems
    per generate call (rlvr.eval.token_chunks), else chunk_size each."""
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
            chunks=chunks,
        )
    finally:
        if model is not None:
            model.train(was_training)
    out: dict[str, Any] = {k: v for k, v in result.metrics().items() if not k.startswith("status/")}
    if samples:
        out["samples"] = [{"source": "eval", **row} for row in result.sample_rows(samples)]
    return out
