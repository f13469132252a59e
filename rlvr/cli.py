"""The `rlvr` command. Each subcommand lives in rlvr/commands/<name>.py and is registered here."""

from __future__ import annotations

import inspect
import sys

import typer
from rich.markup import escape

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


def plain_help(fn):
    """`fn` with its docstring and every option's help escaped for rich's markup, which typer's --help
    renders: `pip install 'rlvr[lora]'` would otherwise print as `pip install 'rlvr'` (rich reads `[lora]`
    as a style tag and drops it)."""
    if fn.__doc__ and not getattr(fn, "_rlvr_help_escaped", False):
        fn.__doc__ = escape(inspect.cleandoc(fn.__doc__))
        for param in inspect.signature(fn).parameters.values():
            info = param.default
            if isinstance(info, typer.models.ParameterInfo) and isinstance(info.help, str):
                info.help = escape(info.help)
        fn._rlvr_help_escaped = True
    return fn


app.command()(plain_help(demo))
app.command()(plain_help(train))
app.command()(plain_help(sft))
app.command()(plain_help(ei))
app.command()(plain_help(distill))
app.command(name="eval")(plain_help(eval_cmd))
app.command(name="filter")(plain_help(filter_cmd))
app.command()(plain_help(grade))
app.command()(plain_help(pipeline))
app.command()(plain_help(recipes))
app.command()(plain_help(plot))


def main() -> None:
    """Console-script entry point. A command that started the sharded learner's process group (rlvr train with
    distributed.learner=fsdp2) ends through rlvr.train.pg.sharded.exit_process: its atexit handlers run, then
    the process ends without the interpreter's teardown, where the process group's threads would abort it."""
    try:
        app()
    except BaseException as exc:  # typer ends every command with SystemExit (0 on success)
        sharded = sys.modules.get("rlvr.train.pg.sharded")  # (never imported: no group was started)
        if sharded is not None and sharded.group_started():
            sharded.exit_process(exc)
        raise


if __name__ == "__main__":
    main()
