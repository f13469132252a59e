"""`rlvr eval [RUN_DIR | CONFIG.yaml] [key=value ...] [--thinking-budget B1,B2,...]`: accuracy, pass@k,
maj@k, format rate, lengths and timing of a policy on a task's held-out problems.

The policy is a model folder or hub id (`model.name=PATH`), or a run directory / checkpoint
(`model.init_from=RUN`: its latest checkpoint; `rlvr eval RUN` and `rlvr eval RUN/config.yaml` say the same). A run's own config.yaml supplies what the run was
trained on (every data.* key and sampling max_tokens / top_p / stop / keep_stop / thinking_budget /
stop_thinking_text) as the lowest layer under an eval YAML file and command-line overrides, so
`rlvr eval model.init_from=RUN` evaluates the run's task the way it was sampled, not eval's defaults.
Decoding (sampling.n, sampling.temperature) is eval's own: greedy unless asked.

Everything that can fail on the command line (keys, the task, a missing held-out split) fails
before the model is loaded, with exit status 2.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from rlvr.commands._config_cli import fail, load_or_exit, with_keys_help
from rlvr.train.config import DataConfig, EvalConfig

# The sampling keys a run's config.yaml hands to `rlvr eval`: how the run's responses end and
# how long they are. Temperature and n are not taken: evaluation decodes its own way.
RUN_SAMPLING_KEYS = ("max_tokens", "top_p", "stop", "keep_stop", "thinking_budget", "stop_thinking_text")


# Evaluation reads no training split, so the training-set size is 0 whatever a run or the
# defaults say: the config check "data.num_train exceeds the distinct problems" must not stop an
# evaluation (it is the lowest layer; an explicit data.num_train still wins, and is unused).
NO_TRAIN = {"data": {"num_train": 0}}


def find_run_dir(init_from: str | Path) -> Path | None:
    """The run directory behind model.init_from, or None (a plain model folder / hub id): the path
    itself when it holds config.yaml, else the run of a checkpoint (RUN/checkpoints/step_N) or of a
    checkpoint's model folder (RUN/checkpoints/step_N/model)."""
    p = Path(init_from)
    candidates = [p]
    if p.parent.name == "checkpoints":
        candidates.append(p.parent.parent)
    if p.name == "model" and p.parent.parent.name == "checkpoints":
        candidates.append(p.parent.parent.parent)
    return next((c for c in candidates if (c / "config.yaml").is_file()), None)


def run_settings(run_dir: Path) -> dict[str, Any]:
    """{"data": {...}, "sampling": {...}} from a run's config.yaml (a TrainConfig or SFTConfig
    dump): the keys EvalConfig also has, so a run written by another trainer or an older version
    never trips the strict loader with a key eval does not know."""
    import dataclasses

    import yaml

    path = run_dir / "config.yaml"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        fail(f"{path}: cannot read the run's config: {exc}")
    data_keys = {f.name for f in dataclasses.fields(DataConfig)}
    data = {k: v for k, v in (raw.get("data") or {}).items() if k in data_keys}
    sampling = {k: v for k, v in (raw.get("sampling") or {}).items() if k in RUN_SAMPLING_KEYS}
    return {"data": {**data, **NO_TRAIN["data"]}, "sampling": sampling}


def policy_positionals(args: list[str] | None) -> list[str]:
    """The natural spellings of the policy to evaluate, as overrides: a run directory or checkpoint
    (`rlvr eval runs/grpo`) is `model.init_from=DIR`, a model folder (config.json) `model.name=DIR`, and a
    run's own config.yaml (`rlvr eval runs/grpo/config.yaml`: a trainer's dump, not an eval config) is
    `model.init_from=` its run. Everything else is passed on as it was."""
    out = []
    for arg in args or ():
        p = Path(arg)
        if "=" not in arg and p.is_dir():
            if (p / "config.json").is_file():
                out.append(f"model.name={arg}")
                continue
            if find_run_dir(p) is None and not (p / "model" / "config.json").is_file():
                fail(f"{arg}: a directory, but neither a run directory (config.yaml) nor a checkpoint or model "
                     "folder (config.json)")
            out.append(f"model.init_from={arg}")
        elif p.name == "config.yaml" and p.is_file() and find_run_dir(p.parent) is not None:
            out.append(f"model.init_from={p.parent}")
        else:
            out.append(arg)
    return out


def parse_budgets(text: str) -> list[int]:
    """"0,256,1024" -> [0, 256, 1024]; each >= -1 (-1 = no budget)."""
    try:
        budgets = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        fail(f"--thinking-budget {text!r}: expected comma-separated integers, e.g. 0,256,1024")
    if not budgets or any(b < -1 for b in budgets):
        fail(f"--thinking-budget {text!r}: budgets are token counts >= 0 (-1 = off)")
    return list(dict.fromkeys(budgets))


def _say(message: str) -> None:
    # Progress goes to stderr so that stdout (the table) can be redirected on its own.
    typer.echo(message, err=True)


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


def _budget_label(budget: int) -> str:
    return "off" if budget < 0 else str(budget)


@with_keys_help(EvalConfig)
def eval(  # noqa: A001 - the command is called `eval`
    args: list[str] = typer.Argument(None, help="Optional RUN_DIR (a run, checkpoint or model folder) or CONFIG.yaml, then dotted key=value overrides."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (sets run.num_threads)."),
    thinking_budget: str = typer.Option(
        "", "--thinking-budget",
        help="Comma-separated thinking budgets in tokens (0 = no thinking, -1 = off), one table row each; "
             "overrides sampling.thinking_budget."),
) -> None:
    """Evaluate a policy on held-out problems: accuracy, pass@k, maj@k, format rate, lengths, timing.

    A run directory or checkpoint (model.init_from=RUN) is evaluated on the run's task and response settings.

    Examples: `rlvr eval runs/sft` (= model.init_from=runs/sft), `rlvr eval model.init_from=runs/grpo sampling.n=8
    sampling.temperature=1 run.out=eval.json`, `rlvr eval model.name=Qwen/Qwen3-1.7B data.task=math
    data.eval_path=math500.jsonl --thinking-budget 0,256,1024`.
    """
    import json

    from rlvr.train.common import resolve_model_dir

    extra = [f"run.num_threads={threads}"] if threads else []
    args = policy_positionals(args)  # `rlvr eval runs/grpo`, `rlvr eval runs/grpo/config.yaml`
    cfg = load_or_exit(EvalConfig, args, base=NO_TRAIN, extra=extra)
    init_from = cfg.model.init_from
    name = cfg.model.name
    if not init_from and name != "tiny" and Path(name).is_dir() and not (Path(name) / "config.json").exists():
        # model.name=RUN: a run directory or checkpoint is not a model folder; read it as init_from.
        init_from = name
        extra.append(f"model.init_from={name}")
        cfg = load_or_exit(EvalConfig, args, base=NO_TRAIN, extra=extra)
    model_dir: Path | None = None
    run_dir: Path | None = None
    if init_from:
        try:
            model_dir = resolve_model_dir(init_from)
        except FileNotFoundError as exc:
            fail(str(exc))
        run_dir = find_run_dir(init_from)
        if run_dir is not None:
            base = run_settings(run_dir)
            cfg = load_or_exit(EvalConfig, args, base=base, extra=extra)
            if cfg.data.task != base["data"].get("task", DataConfig.task):
                # The file or command line asked for another task than the run's: the run's data
                # section (its files, template, reward, difficulty) belongs to its own task.
                base["data"] = dict(NO_TRAIN["data"])
                cfg = load_or_exit(EvalConfig, args, base=base, extra=extra)
            taken = "data and response settings" if base["data"] != NO_TRAIN["data"] else "response settings"
    budgets = parse_budgets(thinking_budget) if thinking_budget else [cfg.sampling.thinking_budget]

    from rlvr.runtime import set_num_threads
    from rlvr.train.tasks import TaskDataError, check_data_files, eval_examples, load_task_data

    # The task first (cheap): a missing held-out split or a bad file (every bad line) fails before the model loads.
    try:
        check_data_files(cfg.data, train=False)
        check = load_task_data(cfg.data, None, train=False)
    except (TaskDataError, ValueError, KeyError, OSError) as exc:
        fail(str(exc))
    available = len(check.eval)
    if not available:
        fail(f"task {cfg.data.task!r} has no built-in held-out problems: set data.eval_path=FILE "
             f"(a JSONL file of {cfg.data.task} problems)")

    set_num_threads(cfg.run.num_threads or None)
    from rlvr.train.common import policy_from_config, quiet_transformers

    quiet_transformers()
    # What vLLM loads (None: a tiny model built in memory) and what the messages call the policy.
    model_source = str(model_dir) if model_dir is not None else (None if name == "tiny" else name)
    source = model_source or "tiny (fresh random weights)"
    _say(f"loading model {source} ...")
    t0 = time.perf_counter()
    try:
        model, tok = policy_from_config(cfg.model, seed=cfg.run.seed)
        task = load_task_data(cfg.data, tok, train=False)
    except (TaskDataError, ValueError, KeyError, OSError) as exc:
        fail(str(exc))
    model.eval()
    examples = eval_examples(task, cfg.data.num_eval)
    prompts = [task.prompt(ex) for ex in examples]
    from rlvr.rollout.types import SamplingSpec

    spec = SamplingSpec.for_task(task, cfg.sampling, seed=cfg.run.seed, logprobs=False)
    from rlvr.config import ConfigError
    from rlvr.models.positions import check_positions

    tokens, keys = cfg.sampling.max_tokens, f"sampling.max_tokens={cfg.sampling.max_tokens}"
    if max(budgets) > 0:
        tokens, keys = tokens + max(budgets), f"{keys} + a thinking budget of {max(budgets)}"
    try:  # before any generation: prompt + response within the model's positions
        named = [(str(getattr(ex, "id", i)), p) for i, (ex, p) in enumerate(zip(examples, prompts, strict=True))]
        check_positions(model, tok, named, tokens, response_keys=keys,
                        model_desc=f"model.init_from={init_from}" if init_from else f"model.name={name}")
    except ConfigError as exc:
        fail(str(exc))

    from rlvr.data import get_task

    reward = cfg.data.reward or get_task(cfg.data.task).reward_name(task.template)
    count = f"{len(examples)} held-out problems" + (
        f" (first {len(examples)} of {available}; data.num_eval=0 for all)" if len(examples) < available else "")
    what = f"{source} (run {run_dir})" if run_dir is not None else source
    if model_source is None:
        what = "a fresh tiny model (model.name=tiny, random weights)"
    budget_note = "" if budgets == [-1] else f", thinking budget {'/'.join(_budget_label(b) for b in budgets)}"
    settings = f"; {taken} from {run_dir / 'config.yaml'}" if run_dir is not None else ""
    typer.echo(f"evaluating {what} on {task.name} (template {task.template}, reward {reward}): {count}, "
               f"{_decoding(cfg, spec)}{budget_note}{settings}")

    from rlvr.rollout import build_generator, with_thinking_budget
    from rlvr.rollout.types import EngineError

    if cfg.rollout.backend != "hf":
        _say(f"starting the {cfg.rollout.backend} engine ...")
    try:
        base_gen = build_generator(cfg.rollout, model, tok, model_source=model_source, seed=cfg.run.seed,
                                   default_batch_size=cfg.sampling.batch_size)
    except (KeyError, ImportError, ValueError, EngineError) as exc:
        fail(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
    load_s = time.perf_counter() - t0
    from rlvr.eval import CPU_EVAL_TOKENS, cpu_chunks, evaluate
    from rlvr.train.tasks import task_scorer

    # On CPU, prompts per generate call sized by tokens (a fixed 256 long prompts was several times slower)
    chunks = cpu_chunks(tok, prompts, n=spec.n, max_tokens=tokens, max_prompts=cfg.sampling.batch_size,
                        device=cfg.model.device, backend=cfg.rollout.backend)
    calls = len(chunks) if chunks is not None else -(-len(examples) // cfg.sampling.batch_size)
    how = (f"{calls} generate calls of at most {CPU_EVAL_TOKENS} tokens (CPU)" if chunks is not None
           else f"{calls} generate calls of at most {cfg.sampling.batch_size} problems")
    _say(f"loaded in {load_s:.1f} s; generating {len(examples)} x {spec.n} responses, {how} ...")
    results = {}
    for budget in budgets:
        generator = with_thinking_budget(base_gen, budget, cfg.sampling.stop_thinking_text, template=task.template)
        started = time.perf_counter()

        def progress(done: int, total: int, started=started) -> None:
            if calls > 1:  # one generate call needs no progress line
                _say(f"  {done}/{total} problems, {time.perf_counter() - started:.0f} s")

        try:
            results[budget] = evaluate(generator, examples, prompts, None, spec, chunk_size=cfg.sampling.batch_size,
                                       chunks=chunks, scorer=task_scorer(task, cfg.data), on_chunk=progress)
        except (ValueError, EngineError) as exc:  # e.g. a thinking budget with a backend that cannot take prompt ids
            fail(str(exc))

    def metrics_of(budget: int) -> dict[str, Any]:
        r = results[budget]
        return {**r.metrics(), "time/eval_s": r.seconds}

    title = f"{task.name}: {len(examples)} held-out problems"
    from rlvr.eval import comparison_text, results_text

    if len(budgets) == 1:
        label = "greedy" if cfg.sampling.temperature == 0 else f"T={cfg.sampling.temperature:g}, n={cfg.sampling.n}"
        if budgets[0] >= 0:
            label += f", budget {budgets[0]}"
        typer.echo(comparison_text({label: metrics_of(budgets[0])}, title=title))
    else:
        # One row per budget: pass@1 is left out, it is the accuracy column again.
        ks = [k for k in results[budgets[0]].pass_at_k if k > 1]
        columns = ["accuracy", *(f"pass@{k}" for k in ks), "maj@*", "format_rate", "reward", "len/mean",
                   "len/correct", "len/incorrect", "truncated_rate", "time/eval_s"]
        typer.echo(results_text({_budget_label(b): metrics_of(b) for b in budgets}, columns, title=title,
                                label="thinking budget"))
    from rlvr.rewards.errors import error_summary

    for budget in budgets:  # a reward that raised scored 0: say how often, and why (its first message)
        smp = results[budget].samples
        if (line := error_summary(smp, [x.example_id for x in smp])) is not None:
            typer.echo(line if len(budgets) == 1 else f"thinking budget {_budget_label(budget)}: {line}")
    n_samples = sum(len(r.samples) for r in results.values())
    eval_s = sum(r.seconds for r in results.values())
    typer.echo(f"time: loading {load_s:.1f} s, generation and scoring {eval_s:.1f} s "
               f"({n_samples} responses, {n_samples / max(eval_s, 1e-9):.1f}/s)")

    if cfg.run.out:
        out = Path(cfg.run.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if len(budgets) == 1:
            payload: dict[str, Any] = {**metrics_of(budgets[0]), "time/load_s": load_s}
        else:
            payload = {f"thinking_budget={b}": metrics_of(b) for b in budgets}
        out.write_text(json.dumps(_json_safe(payload), indent=1))
        samples_path = out.with_suffix(".samples.jsonl")
        with open(samples_path, "w", encoding="utf-8") as f:
            for budget in budgets:
                for row in results[budget].sample_rows():
                    if budget >= 0:
                        row["thinking_budget"] = budget
                    row["correct"] = row["status"] == "correct"
                    f.write(json.dumps(row) + "\n")
        typer.echo(f"wrote {out} and {samples_path}")
