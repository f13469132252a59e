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


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
