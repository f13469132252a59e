"""`rlvr recipes`: the named presets and the exact knobs each one sets."""

from __future__ import annotations

import typer


def recipes(
    markdown: bool = typer.Option(False, "--markdown", help="Print the table as markdown (docs/recipes.md)."),
) -> None:
    """Print every recipe (use one with `rlvr train --recipe NAME`) and the knobs it sets."""
    from rlvr.train.recipes import ELSEWHERE, RECIPE_KEYS, recipe_rows, recipes_markdown

    if markdown:
        typer.echo(recipes_markdown(), nl=False)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rlvr train --recipe NAME (then any key=value override wins)")
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
