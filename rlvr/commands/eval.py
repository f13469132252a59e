"""`rlvr eval [RUN_DIR | CONFIG.yaml] [key=value ...] [--thinking-budget B1,B2,...]`: parse the config, call
rlvr.train.evaluation.evaluate_policy, print the table (accuracy, pass@k, maj@k, format rate, lengths,
timing) of a policy on a task's held-out problems.

The policy is a model folder or hub id (`model.name=PATH`), or a run directory / checkpoint
(`model.init_from=RUN`: its latest checkpoint; `rlvr eval RUN` and `rlvr eval RUN/config.yaml` say the same).
A run's own config.yaml supplies what the run was trained on (every data.* key and sampling max_tokens /
top_p / stop / keep_stop / thinking_budget / stop_thinking_text; rlvr.train.run_settings) as the lowest layer
under an eval YAML file and command-line overrides, so `rlvr eval model.init_from=RUN` evaluates the run's
task the way it was sampled, not eval's defaults. Decoding (sampling.n, sampling.temperature) is eval's own:
greedy unless asked.

Everything that can fail on the command line (keys, the task, a missing held-out split) fails before the
model is loaded, with exit status 2.
"""

from __future__ import annotations

from pathlib import Path

import typer

from rlvr.commands.config_cli import (
    check_user_reward,
    fail,
    load_from_run,
    load_or_exit,
    policy_positionals,
    run_stage,
    threads_override,
    with_keys_help,
)
from rlvr.train.config import EvalConfig


def parse_budgets(text: str) -> list[int]:
    """"0,256,1024" -> [0, 256, 1024]; each >= -1 (-1 = no budget)."""
    try:
        budgets = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        fail(f"--thinking-budget {text!r}: expected comma-separated integers, e.g. 0,256,1024")
    if not budgets or any(b < -1 for b in budgets):
        fail(f"--thinking-budget {text!r}: budgets are token counts >= 0 (-1 = off)")
    return list(dict.fromkeys(budgets))


@with_keys_help(EvalConfig)
def eval(  # noqa: A001 - the command is called `eval`
    args: list[str] = typer.Argument(None, help="Optional RUN_DIR (a run, checkpoint or model folder) or CONFIG.yaml, then dotted key=value overrides."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (sets run.num_threads)."),
    thinking_budget: str = typer.Option(
        "", "--thinking-budget",
        help="Comma-separated thinking budgets in tokens (0 = no thinking, -1 = off), one table row each; "
             "overrides sampling.thinking_budget."),
    thinking_mode: str = typer.Option(
        "", "--thinking-mode",
        help="Comma-separated thinking modes (think, no_think: Qwen3's /think and /no_think tags on each question; "
             "no_think also starts the answer with a closed, empty think block), one table row each."),
) -> None:
    """Evaluate a policy on held-out problems: accuracy, pass@k, maj@k, format rate, lengths, timing.

    A run directory or checkpoint (model.init_from=RUN) is evaluated on the run's task and response settings.

    Examples: `rlvr eval runs/sft` (= model.init_from=runs/sft), `rlvr eval model.init_from=runs/grpo sampling.n=8
    sampling.temperature=1 run.out=eval.json`, `rlvr eval model.name=Qwen/Qwen3-1.7B data.task=math
    data.eval_path=math500.jsonl --thinking-budget 0,256,1024`, `... --thinking-mode think,no_think` (Qwen3's
    mode switch, side by side).
    """
    from rlvr.eval import comparison_text, results_text
    from rlvr.rewards.errors import error_summary
    from rlvr.train.evaluation import budget_label, evaluate_policy
    from rlvr.train.run_settings import NO_TRAIN

    extra = threads_override(threads)
    args = policy_positionals(args)  # `rlvr eval runs/grpo`, `rlvr eval runs/grpo/config.yaml`
    cfg = load_or_exit(EvalConfig, args, base=NO_TRAIN, extra=extra)
    name = cfg.model.name
    if not cfg.model.init_from and name != "tiny" and Path(name).is_dir() and not (Path(name) / "config.json").exists():
        # model.name=RUN: a run directory or checkpoint is not a model folder (the path as it is, typed)
        extra.append(("model.init_from", name, f"model.name={name} (a run directory: model.init_from)"))
    cfg, _run_dir = load_from_run(EvalConfig, args, extra, training=False)
    check_user_reward(cfg.data.reward)  # a reward function of the user's: one call before the model loads
    modes = [m.strip() for m in thinking_mode.split(",") if m.strip()]
    if modes and thinking_budget:
        fail("--thinking-mode and --thinking-budget: give one of them (a mode row sets its own budget)")
    budgets = parse_budgets(thinking_budget) if thinking_budget else [cfg.sampling.thinking_budget]
    ev = run_stage(evaluate_policy, cfg, budgets=None if modes else budgets, modes=modes or None)
    budgets = ev.budgets  # the rows: thinking budgets, or thinking modes

    title = f"{ev.task}: {ev.problems} held-out problems"
    if len(budgets) == 1:
        label = "greedy" if cfg.sampling.temperature == 0 else f"T={cfg.sampling.temperature:g}, n={cfg.sampling.n}"
        if isinstance(budgets[0], str):
            label += f", {budgets[0]}"
        elif budgets[0] >= 0:
            label += f", budget {budgets[0]}"
        typer.echo(comparison_text({label: ev.metrics()}, title=title))
    else:
        # One row per budget: pass@1 is left out, it is the accuracy column again.
        ks = [k for k in ev.results[budgets[0]].pass_at_k if k > 1]
        columns = ["accuracy", *(f"pass@{k}" for k in ks), "maj@*", "format_rate", "reward", "len/mean",
                   "len/correct", "len/incorrect", "truncated_rate", "time/eval_s"]
        typer.echo(results_text({budget_label(b): ev.metrics(b) for b in budgets}, columns, title=title,
                                label="thinking mode" if modes else "thinking budget"))
    for budget in budgets:  # a reward that raised scored 0: say how often, and why (its first message)
        smp = ev.results[budget].samples
        if (line := error_summary(smp, [x.example_id for x in smp])) is not None:
            typer.echo(line if len(budgets) == 1 else
                       f"thinking {'mode' if modes else 'budget'} {budget_label(budget)}: {line}")
    n_samples = sum(len(r.samples) for r in ev.results.values())
    eval_s = sum(r.seconds for r in ev.results.values())
    typer.echo(f"time: loading {ev.load_s:.1f} s, generation and scoring {eval_s:.1f} s "
               f"({n_samples} responses, {n_samples / max(eval_s, 1e-9):.1f}/s)")
    if ev.out is not None:
        typer.echo(f"wrote {ev.out} and {ev.samples_path}")
