"""`rlvr demo`: tiny model from scratch -> SFT until partly right -> GRPO with only the verifier."""

from __future__ import annotations

import typer

from rlvr.commands.config_cli import load_or_exit, threads_override, with_keys_help
from rlvr.train.config import DemoConfig


@with_keys_help(DemoConfig)
def demo(
    args: list[str] = typer.Argument(None, help="Optional dotted key=value overrides (or a YAML file)."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (default RLVR_NUM_THREADS, else 1)."),
) -> None:
    """README's first command: build a tiny model, warm it up with SFT on labeled additions, improve
    it with GRPO using only the verifier, and print a before/after table on held-out problems."""
    from rich.console import Console

    from rlvr.train.demo import run_demo

    cfg = load_or_exit(DemoConfig, args, extra=threads_override(threads, "num_threads"))
    run_demo(cfg, console=Console())
