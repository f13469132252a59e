"""`rlvr plot RUN_DIR`: draw PNG plots of a run's metrics.jsonl under RUN_DIR/plots/."""

from __future__ import annotations

from pathlib import Path

import typer


def plot(
    run_dir: Path = typer.Argument(..., help="Run directory (holds metrics.jsonl)."),
    out: Path | None = typer.Option(None, "--out", help="Write the PNGs here instead of RUN_DIR/plots."),
) -> None:
    """Plot reward, accuracy, length, loss, entropy, KL, clip fraction, ... of a run (whichever it logged)."""
    from rlvr.runs.plots import plot_run

    try:
        paths = plot_run(run_dir, out_dir=out)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if not paths:
        typer.echo(f"{run_dir}/metrics.jsonl has no numeric metrics yet; nothing to plot")
        return
    for p in paths:
        typer.echo(str(p))
