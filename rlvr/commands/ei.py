"""`rlvr ei [CONFIG.yaml] [key=value ...] [--resume RUN_DIR]`: expert iteration."""

from __future__ import annotations

from pathlib import Path

import typer

from rlvr.commands.config_cli import load_run_config, report, run_trainer, with_keys_help
from rlvr.train.config import EIConfig


@with_keys_help(EIConfig)
def ei(
    args: list[str] = typer.Argument(None, help="Optional CONFIG.yaml, then dotted key=value overrides."),
    resume: Path = typer.Option(None, "--resume", help="Continue this run directory from its last checkpoint."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (sets run.num_threads)."),
    help_config: bool = typer.Option(False, "--help-config", help="Print every config key as a table and exit."),
) -> None:
    """Expert iteration: sample answers, keep the verified ones, fine-tune on them, repeat.

    Each round (run.steps of them) samples sampling.group_size answers to each of sampling.n_prompts
    questions, keeps those the task's checker marks correct (algo.dedup, algo.max_per_question) and
    fine-tunes on them for algo.epochs passes. Example: `rlvr ei model.init_from=runs/sft run.steps=10`.
    """
    from rlvr.config import config_help

    if help_config:
        typer.echo(config_help(EIConfig))
        return
    cfg = load_run_config(EIConfig, args, resume=resume, threads=threads)
    from rlvr.train.ei import train_ei

    report(run_trainer(train_ei, cfg, resume=resume is not None))
