"""`evaluate_policy(cfg: EvalConfig) -> PolicyEvaluation`: accuracy, pass@k, maj@k, format rate, lengths and
timing of a policy on a task's held-out problems, the stage behind `rlvr eval` and a pipeline's eval stage.

Evaluation has one core and two doors:

- `rlvr.eval.evaluate(generator, examples, prompts, ...)`: the core. Generate, grade, and the metrics of
  rlvr/eval/metrics.py; it knows no config.
- `evaluate_policy(cfg)` (this module): the stage. Loads the policy of cfg.model and the held-out problems
  of cfg.data, checks them before any generation, runs the core once per thinking budget and writes
  run.out (metrics JSON) and the scored samples next to it. `rlvr eval` and `rlvr pipeline` call it.
- `rlvr.train.tasks.eval_policy(generator, task, cfg)`: a trainer's evaluation between steps, on the
  generator it already holds (greedy or at run.eval_temperature); the same core underneath.

The policy is a model folder or hub id (model.name), or a run directory / checkpoint (model.init_from: its
latest checkpoint). Everything that can fail on the user's input (the task, a missing held-out split, a
prompt longer than the model's positions) raises ConfigError / TaskDataError before any generation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlvr.config import ConfigError
from rlvr.data import get_task
from rlvr.data.templates import THINKING_MODES
from rlvr.eval import CPU_EVAL_TOKENS, EvalResult, cpu_chunks, evaluate
from rlvr.rewards.judge import judge_failure_note, judge_metrics
from rlvr.rollout import with_thinking_budget
from rlvr.rollout.types import SamplingSpec
from rlvr.train import session
from rlvr.train.config import DataConfig, EvalConfig
from rlvr.train.run_settings import find_run_dir, run_settings
from rlvr.train.session import say
from rlvr.train.tasks import (
    TaskDataError,
    check_data_files,
    eval_examples,
    load_task_data,
    mode_prompt,
    task_scorer,
)


@dataclass
class PolicyEvaluation:
    """The results of one evaluation: one rlvr.eval.EvalResult per row, a thinking budget (-1 = off) or a thinking
    mode (think / no_think: `rlvr eval --thinking-mode`)."""

    results: dict[int | str, EvalResult]
    task: str  # the task's name
    problems: int  # held-out problems evaluated
    load_s: float  # loading the model and starting the engine
    out: Path | None = None  # run.out, when written
    samples_path: Path | None = None  # the scored samples next to it
    budgets: list[int] = field(default_factory=list)
    judge: dict[int, dict[str, float]] = field(default_factory=dict)  # data.reward=judge: judge/* per budget

    def metrics(self, budget: int | None = None) -> dict[str, Any]:
        """rlvr.eval metrics of one budget (the first by default), with time/eval_s (and judge/* with a judge)."""
        b = self.budgets[0] if budget is None else budget
        r = self.results[b]
        return {**r.metrics(), **self.judge.get(b, {}), "time/eval_s": r.seconds}


def budget_label(budget: int | str) -> str:
    """A row's label: a thinking budget ("off" for -1) or a thinking mode (think / no_think)."""
    if isinstance(budget, str):
        return budget
    return "off" if budget < 0 else str(budget)


def evaluate_policy(cfg: EvalConfig, *, budgets: Sequence[int] | None = None, modes: Sequence[str] | None = None,
                    resume: bool = False) -> PolicyEvaluation:
    """Evaluate cfg.model on the first data.num_eval held-out problems of cfg.data with cfg.sampling's decoding
    (greedy by default), once per thinking budget (default: sampling.thinking_budget); print what is evaluated
    (stdout) and the progress (stderr); write run.out and its .samples.jsonl when set. resume is accepted for
    the stage contract and has no effect: an evaluation is re-run whole."""
    del resume
    cfg, budget_of = _rows(cfg, budgets, modes)
    budgets = list(budget_of)  # the rows: thinking budgets, or thinking modes
    init_from = cfg.model.init_from
    model_source = session.sampling_model_source(cfg.model)  # FileNotFoundError before any work
    run_dir = find_run_dir(init_from) if init_from else None
    available = _check_held_out(cfg)  # the task first (cheap): before the model loads

    t0 = time.perf_counter()
    model, tok = session.sampling_policy(cfg.model, seed=cfg.run.seed, threads=cfg.run.num_threads,
                                        source=model_source)
    try:
        task = load_task_data(cfg.data, tok, train=False, judge=cfg.judge, judge_device=cfg.model.device)
    except TaskDataError:
        raise
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    examples = eval_examples(task, cfg.data.num_eval)
    prompts_of = {k: [(mode_prompt(task.prompt, k) if modes else task.prompt)(ex) for ex in examples] for k in budgets}
    spec = SamplingSpec.for_task(task, cfg.sampling, seed=cfg.run.seed, logprobs=False)
    tokens, keys = cfg.sampling.max_tokens, f"sampling.max_tokens={cfg.sampling.max_tokens}"
    if max(budget_of.values()) > 0:
        top = max(budget_of.values())
        tokens, keys = tokens + top, f"{keys} + a thinking budget of {top}"
    for rows in prompts_of.values():  # before any generation: prompt + response within the model's positions
        named = [(str(getattr(ex, "id", i)), p) for i, (ex, p) in enumerate(zip(examples, rows, strict=True))]
        session.check_prompts(model, tok, cfg.model, named, tokens, keys)
    _say_plan(cfg, task, examples, available, spec, model_source, run_dir, budgets, bool(modes))

    base_gen = session.sampler(cfg.rollout, model, tok, model_source=model_source, seed=cfg.run.seed,
                               batch_size=cfg.sampling.batch_size)
    load_s = time.perf_counter() - t0
    # On CPU, prompts per generate call sized by tokens: 256 long prompts in one call are several times slower
    chunks = cpu_chunks(tok, prompts_of[budgets[-1]], n=spec.n, max_tokens=tokens, max_prompts=cfg.sampling.batch_size,
                        device=cfg.model.device, backend=cfg.rollout.backend)
    calls = len(chunks) if chunks is not None else -(-len(examples) // cfg.sampling.batch_size)
    how = (f"{calls} generate calls of at most {CPU_EVAL_TOKENS} tokens (CPU)" if chunks is not None
           else f"{calls} generate calls of at most {cfg.sampling.batch_size} problems")
    say(f"loaded in {load_s:.1f} s; generating {len(examples)} x {spec.n} responses, {how} ...")
    results, judged = {}, {}
    for budget in budgets:
        generator = with_thinking_budget(base_gen, budget_of[budget], cfg.sampling.stop_thinking_text,
                                         template=task.template)
        started = time.perf_counter()

        def progress(done: int, total: int, started=started) -> None:
            if calls > 1:  # one generate call needs no progress line
                say(f"  {done}/{total} problems, {time.perf_counter() - started:.0f} s")

        try:
            results[budget] = evaluate(generator, examples, prompts_of[budget], None, spec,
                                       chunk_size=cfg.sampling.batch_size, chunks=chunks,
                                       scorer=task_scorer(task, cfg.data), on_chunk=progress)
        except ValueError as exc:  # e.g. a thinking budget with a backend that cannot take prompt ids
            raise ConfigError(str(exc)) from None
        # data.reward=judge: failed judge requests are said (an unreachable judge graded nothing), then counted
        if (note := judge_failure_note(task.reward_fn)) is not None:
            say(note if len(budgets) == 1 else f"thinking {'mode' if modes else 'budget'} {budget_label(budget)}: {note}")
        judged[budget] = judge_metrics(task.reward_fn)
    out = PolicyEvaluation(results=results, task=task.name, problems=len(examples), load_s=load_s, budgets=budgets,
                           judge={b: m for b, m in judged.items() if m})
    if cfg.run.out:
        _write(cfg, out)
    return out


def _rows(cfg: EvalConfig, budgets: Sequence[int] | None, modes: Sequence[str] | None
          ) -> tuple[EvalConfig, dict[int | str, int]]:
    """The evaluation's rows, each with its thinking budget: one per thinking mode (Qwen3's /think, /no_think:
    the rows tag the questions themselves, so data.thinking_mode is cleared), else one per budget (default:
    sampling.thinking_budget)."""
    if not modes:
        return cfg, {b: b for b in (dict.fromkeys(budgets) if budgets else [cfg.sampling.thinking_budget])}
    modes = list(dict.fromkeys(modes))
    bad = [m for m in modes if m not in THINKING_MODES]
    if bad or budgets:
        raise ConfigError(f"--thinking-mode {','.join(modes)}: " + (
            f"known modes are {', '.join(THINKING_MODES)}" if bad else "not together with --thinking-budget"))
    cfg = replace(cfg, data=replace(cfg.data, thinking_mode=""))
    return cfg, {m: 0 if m == "no_think" else cfg.sampling.thinking_budget for m in modes}


def _check_held_out(cfg: EvalConfig) -> int:
    """The held-out problems available, every bad line of the task's files reported first; a task without a
    held-out split is a TaskDataError naming data.eval_path. Cheap: runs before the model loads."""
    try:
        check_data_files(cfg.data, train=False)
        check = load_task_data(cfg.data, None, train=False)
    except TaskDataError:
        raise
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    if not check.eval:
        raise TaskDataError(f"task {cfg.data.task!r} has no built-in held-out problems: set data.eval_path=FILE "
                            f"(a JSONL file of {cfg.data.task} problems)")
    return len(check.eval)


def _say_plan(cfg: EvalConfig, task, examples, available: int, spec, model_source: str | None,
              run_dir: Path | None, budgets: list, modes: bool) -> None:
    """The header line: the policy, the task, its template and reward, how many problems, the decoding."""
    reward = cfg.data.reward or get_task(cfg.data.task).reward_name(task.template)
    count = f"{len(examples)} held-out problems" + (
        f" (first {len(examples)} of {available}; data.num_eval=0 for all)" if len(examples) < available else "")
    source = model_source or "tiny (fresh random weights)"
    what = f"{source} (run {run_dir})" if run_dir is not None else source
    if model_source is None:
        what = "a fresh tiny model (model.name=tiny, random weights)"
    budget_note = "" if budgets == [-1] else (f", thinking mode {'/'.join(budgets)}" if modes else
                                              f", thinking budget {'/'.join(budget_label(b) for b in budgets)}")
    print(f"evaluating {what} on {task.name} (template {task.template}, reward {reward}): {count}, "
          f"{_decoding(cfg, spec)}{budget_note}{_taken(cfg, run_dir)}")


def _taken(cfg: EvalConfig, run_dir: Path | None) -> str:
    """Which of a run's settings were the lowest layer (rlvr.train.run_settings): its data section only when
    the evaluation is of the run's own task."""
    if run_dir is None:
        return ""
    run_task = run_settings(run_dir)["data"].get("task", DataConfig.task)
    taken = "data and response settings" if cfg.data.task == run_task else "response settings"
    return f"; {taken} from {run_dir / 'config.yaml'}"


def _decoding(cfg: EvalConfig, spec) -> str:
    s = cfg.sampling
    mode = "greedy" if s.temperature == 0 else f"sampled T={s.temperature:g}" + (
        f" top_p={s.top_p:g}" if s.top_p < 1 else "")
    parts = [f"{mode}, n={s.n}" if s.n > 1 or s.temperature else mode, f"max_tokens={s.max_tokens}"]
    if spec.stop:
        parts.append("stop=" + ",".join(repr(x) for x in spec.stop))
    parts.append(f"backend={cfg.rollout.backend}")
    return ", ".join(parts)


def _json_safe(value: Any) -> Any:
    # Strict JSON has no NaN: a format rate of a reward without a format part is written as null.
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:
        return None
    return value


def _write(cfg: EvalConfig, ev: PolicyEvaluation) -> None:
    """run.out: the metrics (one budget: flat, with time/load_s and problems; several: one mapping per
    budget), and every scored sample next to it as .samples.jsonl."""
    out = Path(cfg.run.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if len(ev.budgets) == 1:
        payload: dict[str, Any] = {**ev.metrics(), "time/load_s": ev.load_s, "problems": ev.problems}
    else:
        payload = {(f"thinking_mode={b}" if isinstance(b, str) else f"thinking_budget={b}"): ev.metrics(b)
                   for b in ev.budgets}
    out.write_text(json.dumps(_json_safe(payload), indent=1))
    samples_path = out.with_suffix(".samples.jsonl")
    with open(samples_path, "w", encoding="utf-8") as f:
        for budget in ev.budgets:
            for row in ev.results[budget].sample_rows():
                if isinstance(budget, str):
                    row["thinking_mode"] = budget
                elif budget >= 0:
                    row["thinking_budget"] = budget
                row["correct"] = row["status"] == "correct"
                f.write(json.dumps(row) + "\n")
    ev.out, ev.samples_path = out, samples_path

