"""`rlvr pipeline PIPELINE.yaml [key=value ...] [--resume]`: named stages (sft, rl, ei, eval, filter) in
order, each starting from the previous stage's checkpoint (docs/pipeline.md)."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from rlvr.commands.config_cli import check_user_reward, fail, run_trainer


def pipeline(
    args: list[str] = typer.Argument(
        None, help="PIPELINE.yaml, then overrides: out_dir=DIR, overwrite=true, shared.KEY=VALUE, "
                   "stages.NAME.KEY=VALUE."),
    resume: bool = typer.Option(
        False, "--resume",
        help="Continue an earlier run of this pipeline: finished stages are skipped, an interrupted one continues "
             "from its last checkpoint."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads of every stage (sets shared run.num_threads)."),
) -> None:
    """Run a multi-stage recipe: cold-start SFT, RL, rejection sampling (ei), evaluation, ... in order.

    Each stage gets its own run directory under the pipeline's out_dir and starts from the last
    checkpoint of the stage before it; summary.md and summary.json in out_dir list every stage's
    steps, held-out accuracy, wall time and run directory. Bad keys fail before the first stage runs.

    Examples: `rlvr pipeline examples/pipelines/r1_tiny.yaml`, `rlvr pipeline examples/pipelines/r1_tiny.yaml
    --resume`, `rlvr pipeline stages.yaml out_dir=runs/p2 stages.rl.run.steps=50`.
    """
    from rlvr.config import ConfigError
    from rlvr.train.pipeline import load_pipeline, run_pipeline

    files = [a for a in args or () if a.lower().endswith((".yaml", ".yml")) and "=" not in a]
    overrides = [a for a in args or () if a not in files]
    if len(files) != 1:
        fail("give one pipeline file (PIPELINE.yaml), then overrides such as out_dir=DIR or stages.NAME.KEY=VALUE"
             if not files else f"two pipeline files given ({', '.join(files)}); pass one and use overrides")
    bad = [a for a in overrides if "=" not in a]
    if bad:
        fail(f"argument {bad[0]!r} is neither a pipeline file (.yaml) nor an override key=value")
    if not Path(files[0]).is_file():
        fail(f"{files[0]}: no such pipeline file")
    try:
        spec = load_pipeline(files[0], overrides, threads=threads)
    except ConfigError as exc:
        fail(str(exc))
    rewards = [spec.shared.get("data.reward"), *(stage.overrides.get("data.reward") for stage in spec.stages)]
    for reward in dict.fromkeys(r for r in rewards if isinstance(r, str) and r):
        check_user_reward(reward)  # a reward function of the user's: one call before the first stage starts
    result = run_trainer(run_pipeline, spec, resume=resume, resume_command=_resume_command(files[0], overrides,
                                                                                         spec.overwrite, threads))
    summary = Path(result.out_dir) / "summary.md"
    typer.echo(summary.read_text(encoding="utf-8").rstrip())
    typer.echo(f"summary: {summary} (and summary.json)")


def _resume_command(file: str, overrides: list[str], overwrite: bool, threads: int) -> str:
    """The command that continues this pipeline after a Ctrl-C (finished stages skipped, the interrupted one
    from its checkpoint): the same file and overrides, overwrite=... dropped (a resume keeps what is there)."""
    kept = [o for o in overrides if o.partition("=")[0].strip() != "overwrite"]
    if overwrite:  # the file itself says overwrite: true, which --resume refuses
        kept.append("overwrite=false")
    extra = [f"--threads={threads}"] if threads else []
    return shlex.join(["rlvr", "pipeline", file, *kept, *extra, "--resume"])
