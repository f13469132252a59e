"""The `rlvr` command. Each subcommand lives in rlvr/commands/<name>.py and is registered here."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="rlvr",
    help="Reinforcement learning from verifiable rewards for language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

from rlvr.commands.plot import plot  # noqa: E402
from rlvr.commands.grade import grade  # noqa: E402

app.command()(plot)
app.command()(grade)
from rlvr.commands.demo import demo  # noqa: E402
from rlvr.commands.eval import eval as eval_cmd  # noqa: E402
from rlvr.commands.recipes import recipes  # noqa: E402
from rlvr.commands.sft import sft  # noqa: E402
from rlvr.commands.train import train  # noqa: E402

app.command()(train)
app.command()(sft)
app.command(name="eval")(eval_cmd)
app.command()(demo)
app.command()(recipes)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
