"""`rlvr sft [CONFIG.yaml] [key=value ...] [--resume RUN_DIR]`: supervised fine-tuning."""

from __future__ import annotations

from pathlib import Path

import typer

from rlvr.commands.config_cli import fail, load_run_config, report, run_trainer, with_keys_help
from rlvr.train.config import SFTConfig


@with_keys_help(SFTConfig)
def sft(
    args: list[str] = typer.Argument(None, help="Optional CONFIG.yaml, then dotted key=value overrides."),
    resume: Path = typer.Option(None, "--resume", help="Continue this run directory from its last checkpoint."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (sets run.num_threads)."),
    help_config: bool = typer.Option(False, "--help-config", help="Print every config key as a table and exit."),
) -> None:
    """Supervised fine-tuning on prompt/response pairs, loss on response tokens only.

    Example: a tiny model that learns sums of four single digits on a CPU in
    a minute (docs/training.md; `rlvr train --help` goes on from it with GRPO):

    \b
      rlvr sft data.digits=1 data.operands=4 data.num_train=4000 \\
          model.hidden_size=128 model.intermediate_size=256 \\
          model.tie_embeddings=true algo.batch_size=64 optim.lr=3e-3 \\
          optim.schedule=constant run.steps=100 run.out_dir=runs/sft

    Your own pairs: data.sft_path=FILE.jsonl, each line {"prompt", "response"},
    TRL's {"prompt", "completion"} or TRL's conversational {"messages": [...]}.
    """
    from rlvr.config import config_help

    if help_config:
        typer.echo(config_help(SFTConfig))
        return
    cfg = load_run_config(SFTConfig, args, resume=resume, threads=threads)
    if cfg.data.sft_path:
        _check_sft_file(cfg.data.sft_path)
    from rlvr.train.sft import train_sft

    # train_sft checks the batch arithmetic first (validate_sft_config, once), before any work
    report(run_trainer(train_sft, cfg, resume=resume is not None))


def _check_sft_file(path: str) -> None:
    """Read data.sft_path once before any model or run directory exists, so a bad line or an empty file
    is one `error: data.sft_path=PATH: line N: ...` instead of a traceback (or "no training examples",
    naming no file) after the model was built."""
    from rlvr.data import DataError, load_sft

    try:
        load_sft(path)
    except DataError as exc:
        where = f"line {exc.line}: " if exc.line is not None else ""
        fail(f"data.sft_path={path}: {where}{exc.reason}")
    except OSError as exc:
        fail(f"data.sft_path={path}: cannot read it ({exc.strerror or exc})")
