"""Before/after comparison tables of evaluation results (rich table for the terminal, markdown
for files): one row per metric, one column per result, and a delta column (last minus first)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.eval.evaluate import EvalResult
from rlvr.eval.metrics import format_delta, format_metric

# Rows shown by default, when present: the headline numbers of an evaluation.
DEFAULT_METRICS = ("accuracy", "pass@*", "format_rate", "reward", "len/mean", "len/correct", "len/incorrect",
                   "truncated_rate")


def _as_metrics(value: EvalResult | Mapping[str, Any]) -> dict[str, Any]:
    return value.metrics() if isinstance(value, EvalResult) else dict(value)


def _rows(columns: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None):
    import fnmatch

    tables = {label: _as_metrics(v) for label, v in columns.items()}
    keys: list[str] = []
    for t in tables.values():
        keys += [k for k in t if k not in keys]
    wanted: list[str] = []
    for pat in metrics if metrics is not None else DEFAULT_METRICS:
        wanted += [k for k in keys if fnmatch.fnmatchcase(k, pat) and k not in wanted]
    return tables, wanted


def comparison_rows(
    columns: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None = None
) -> list[list[str]]:
    """[[metric, value per column..., delta], ...] as display strings. `columns` maps a label
    ("after SFT", "after RL") to an EvalResult or a flat metric dict; `metrics` lists metric names
    or globs (default DEFAULT_METRICS). The delta column (last - first) appears for 2+ columns;
    fractions are shown in percent and their deltas in percentage points."""
    tables, wanted = _rows(columns, metrics)
    labels = list(tables)
    out = []
    for key in wanted:
        vals = [tables[label].get(key) for label in labels]
        row = [key] + [format_metric(key, v) for v in vals]
        if len(labels) >= 2:
            row.append(format_delta(key, vals[0], vals[-1]))
        out.append(row)
    return out


def _header(columns: Mapping[str, Any]) -> list[str]:
    labels = list(columns)
    return ["metric", *labels] + ([f"delta ({labels[-1]} - {labels[0]})"] if len(labels) >= 2 else [])


def comparison_table(
    columns: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None = None,
    title: str | None = None,
):
    """A rich.table.Table of `comparison_rows` (print it with a rich Console)."""
    from rich.table import Table

    table = Table(title=title)
    for i, name in enumerate(_header(columns)):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in comparison_rows(columns, metrics):
        table.add_row(*row)
    return table


def comparison_text(columns: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None = None,
                    title: str | None = None, width: int = 100) -> str:
    """The rich table rendered to plain text (no colors)."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(
        comparison_table(columns, metrics, title))
    return buf.getvalue()


def comparison_markdown(
    columns: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None = None
) -> str:
    """The same table as GitHub markdown."""
    header = _header(columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for row in comparison_rows(columns, metrics):
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
