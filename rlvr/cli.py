"""The `rlvr` command. Each subcommand lives in rlvr/commands/<name>.py and is registered here."""

from __future__ import annotations

import typer

from rlvr.commands.demo import demo
from rlvr.commands.distill import distill
from rlvr.commands.ei import ei
from rlvr.commands.eval import eval as eval_cmd
from rlvr.commands.filter import filter as filter_cmd
from rlvr.commands.grade import grade
from rlvr.commands.pipeline import pipeline
from rlvr.commands.plot import plot
from rlvr.commands.recipes import recipes
from rlvr.commands.sft import sft
from rlvr.commands.train import train

app = typer.Typer(
    name="rlvr",
    help="Reinforcement learning from verifiable rewards for language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command()(demo)
app.command()(train)
app.command()(sft)
app.command()(ei)
app.command()(distill)
app.command(name="eval")(eval_cmd)
app.command(name="filter")(filter_cmd)
app.command()(grade)
app.command()(pipeline)
app.command()(recipes)
app.command()(plot)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
