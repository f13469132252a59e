"""`rlvr train [CONFIG.yaml] [key=value ...] [--recipe NAME] [--resume RUN_DIR]`: GRPO-family RL."""

from __future__ import annotations

from pathlib import Path

import typer

from rlvr.commands.config_cli import fail, load_run_config, report, run_trainer, with_keys_help
from rlvr.train.config import TrainConfig


@with_keys_help(TrainConfig)
def train(
    args: list[str] = typer.Argument(None, help="Optional CONFIG.yaml, then dotted key=value overrides."),
    recipe: str = typer.Option("", "--recipe", help="Named preset (see `rlvr recipes`); file and overrides win."),
    resume: Path = typer.Option(None, "--resume", help="Continue this run directory from its last checkpoint."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (sets run.num_threads)."),
    help_config: bool = typer.Option(False, "--help-config", help="Print every config key as a table and exit."),
) -> None:
    """Policy-gradient RL (GRPO family): sample, score with the verifier, update, repeat.

    Example: a tiny model that learns on a CPU in minutes (docs/training.md).
    GRPO needs a policy that is sometimes right, so it starts from the SFT run
    of `rlvr sft --help`'s example; --resume trains it further:

    \b
      rlvr train --recipe grpo model.init_from=runs/sft data.digits=1 \\
          data.operands=4 data.num_train=4000 sampling.max_tokens=4 \\
          run.steps=100 run.out_dir=runs/grpo
      rlvr train --resume runs/grpo run.steps=200

    With a file and overrides: `rlvr train run.yaml algo.loss=grpo_clip`.
    """
    from rlvr.config import config_help

    if help_config:
        typer.echo(config_help(TrainConfig))
        return
    base = None
    if resume is not None and recipe:
        fail("--resume continues a run with its own config.yaml; drop --recipe")
    if recipe:
        from rlvr.train.pg.recipes import get_recipe

        try:
            base = get_recipe(recipe)
        except KeyError as exc:
            fail(exc.args[0])
    cfg = load_run_config(TrainConfig, args, resume=resume, threads=threads, base=base)
    from rlvr.train.pg.loop import train as run_train

    result = run_trainer(run_train, cfg, resume=resume is not None)
    report(result)
