"""`rlvr recipes`: the named presets and the exact knobs each one sets."""

from __future__ import annotations

import typer


def recipes(
    markdown: bool = typer.Option(False, "--markdown", help="Print the table as markdown (docs/recipes.md)."),
    wide: bool = typer.Option(False, "--wide", help="One table, a column per knob (about 190 columns wide)."),
) -> None:
    """Print every recipe (use one with `rlvr train --recipe NAME`) and the knobs it sets.

    By default each recipe is a block of `knob=value` pairs wrapped at the terminal's width (80
    columns read fine); --wide prints the single table, --markdown the table of docs/recipes.md."""
    from rlvr.train.pg.recipes import ELSEWHERE, RECIPE_KEYS, recipe_rows, recipes_markdown

    if markdown:
        typer.echo(recipes_markdown(), nl=False)
        return
    from rich.console import Console
    from rich.table import Table

    title = "rlvr train --recipe NAME (then any key=value override wins)"
    if not wide:
        import textwrap

        console = Console(highlight=False)
        width = max(40, console.width)
        console.print(f"[bold]{title}[/bold]", width=width)
        short = [key.split(".", 1)[1] for key in RECIPE_KEYS]
        for name, *values in recipe_rows():
            console.print()
            console.print(f"[bold]{name}[/bold]")
            pairs = "  ".join(f"{k}={v}" for k, v in zip(short, values, strict=True))
            for line in textwrap.wrap(pairs, width=width - 2, break_long_words=False, break_on_hyphens=False):
                console.print("  " + line, markup=False, soft_wrap=True)
            if name in ELSEWHERE:
                for line in textwrap.wrap(f"elsewhere: {ELSEWHERE[name]}", width=width - 2):
                    console.print("  " + line, markup=False, soft_wrap=True)
        return
    table = Table(title=title)
    table.add_column("recipe", style="bold", no_wrap=True)
    for key in RECIPE_KEYS:
        # fold, never "…": a recipe table that hides its knobs defeats its purpose
        table.add_column(key.split(".", 1)[1], overflow="fold")
    for row in recipe_rows():
        table.add_row(*row)
    console = Console(width=max(200, Console().width))
    console.print(table)
    for name, text in ELSEWHERE.items():
        console.print(f"[bold]{name}[/bold] elsewhere: {text}")
