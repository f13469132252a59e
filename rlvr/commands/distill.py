"""`rlvr distill [CONFIG.yaml] teacher.model=TEACHER [key=value ...] [--resume RUN_DIR]`: offline distillation."""

from __future__ import annotations

from pathlib import Path

import typer

from rlvr.commands.config_cli import load_run_config, report, run_trainer, with_keys_help
from rlvr.train.config import DistillConfig


@with_keys_help(DistillConfig)
def distill(
    args: list[str] = typer.Argument(None, help="Optional CONFIG.yaml, then dotted key=value overrides."),
    resume: Path = typer.Option(None, "--resume", help="Continue this run directory (its traces, the student's SFT)."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (sets run.num_threads)."),
    help_config: bool = typer.Option(False, "--help-config", help="Print every config key as a table and exit."),
) -> None:
    """Offline distillation: a teacher answers the training problems, the verified answers train the student.

    Writes RUN/traces.jsonl (the kept {prompt, response} pairs) and traces.json, then fine-tunes model.* on them
    as `rlvr sft` does, in RUN/student. Example: `rlvr distill teacher.model=runs/big model.name=tiny
    traces.samples=4 run.steps=200`. On-policy distillation (the student samples, the teacher scores every
    token) is `rlvr train teacher.model=... algo.kl_in=reward algo.kl_coef=1`.
    """
    from rlvr.config import config_help

    if help_config:
        typer.echo(config_help(DistillConfig))
        return
    cfg = load_run_config(DistillConfig, args, resume=resume, threads=threads)
    from rlvr.train.distill import distill as run_distill

    result = run_trainer(run_distill, cfg, resume=resume is not None)
    c = result.report["counts"]
    typer.echo(f"traces: {c['kept']} teacher answers kept of {c['samples']} -> {result.traces}")
    report(result.student)
