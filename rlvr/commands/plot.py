"""`rlvr plot RUN_DIR`: draw PNG plots of a run's metrics.jsonl under RUN_DIR/plots/."""

from __future__ import annotations

from pathlib import Path

import typer


def plot(
    run_dir: Path = typer.Argument(..., help="Run directory (holds metrics.jsonl)."),
    out: Path | None = typer.Option(None, "--out", help="Write the PNGs here instead of RUN_DIR/plots."),
) -> None:
    """Plot reward, accuracy, length, loss, entropy, KL, clip fraction, ... of a run (whichever it logged)."""
    from rlvr.runs.plots import plan_figures, plot_run
    from rlvr.runs.rundir import read_jsonl

    try:
        paths = plot_run(run_dir, out_dir=out)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if not paths:
        typer.echo(f"{run_dir}/metrics.jsonl has no numeric metrics yet; nothing to plot")
        return
    described = {f.name: f.describe() for f in plan_figures(read_jsonl(run_dir / "metrics.jsonl"))}
    for p in paths:  # each figure, then what it shows (and the constant series it leaves out)
        typer.echo(str(p))
        for line in described.get(p.name, []):
            typer.echo(f"  {line}")
