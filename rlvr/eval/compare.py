"""Tables of evaluation results (rich table for the terminal, markdown for files).

- comparison_*: before/after tables, one row per metric, one column per result, and a delta
  column (last minus first).
- results_*: one row per result (e.g. per thinking budget of a sweep), one column per metric.

Every table formats values with rlvr.eval.metrics.format_metric: fractions in percent, and a
format rate that is NaN (the reward has no format part) as "n/a".
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.eval.evaluate import EvalResult
from rlvr.eval.metrics import format_delta, format_metric

# Rows shown by default, when present: the headline numbers of an evaluation.
DEFAULT_METRICS = ("accuracy", "pass@*", "maj@*", "format_rate", "reward", "len/mean", "len/correct",
                   "len/incorrect", "truncated_rate", "time/*")


def _as_metrics(value: EvalResult | Mapping[str, Any]) -> dict[str, Any]:
    return value.metrics() if isinstance(value, EvalResult) else dict(value)


def _natural(key: str) -> tuple:
    # pass@2 before pass@16: numbers inside a name compare as numbers
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key))


def _rows(columns: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None):
    import fnmatch

    tables = {label: _as_metrics(v) for label, v in columns.items()}
    keys: list[str] = []
    for t in tables.values():
        keys += [k for k in t if k not in keys]
    wanted: list[str] = []
    for pat in metrics if metrics is not None else DEFAULT_METRICS:
        matched = [k for k in keys if fnmatch.fnmatchcase(k, pat) and k not in wanted]
        wanted += sorted(matched, key=_natural) if any(c in pat for c in "*?[") else matched
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

    # min_width: rich wraps a title to the table's width, and a one-column table is narrow.
    table = Table(title=title, min_width=len(title) + 4 if title else None)
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


def results_rows(
    rows: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """(metric names, [[label, value per metric...], ...]): one row per result. `rows` maps a
    label ("budget 256") to an EvalResult or a flat metric dict; `metrics` as in comparison_rows."""
    tables, wanted = _rows(rows, metrics)
    return wanted, [[label, *(format_metric(k, t.get(k)) for k in wanted)] for label, t in tables.items()]


def results_table(
    rows: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None = None,
    title: str | None = None, label: str = "",
):
    """A rich.table.Table of `results_rows`; `label` heads the first column."""
    from rich.table import Table

    names, body = results_rows(rows, metrics)
    table = Table(title=title, min_width=len(title) + 4 if title else None)
    for i, name in enumerate([label, *names]):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in body:
        table.add_row(*row)
    return table


def results_text(rows: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None = None,
                 title: str | None = None, label: str = "", width: int = 250) -> str:
    """The rich table of `results_table` rendered to plain text (no colors). A row holds many
    metrics, so the default width lets it take its natural width instead of squeezing headers."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(
        results_table(rows, metrics, title, label))
    return buf.getvalue()


def results_markdown(rows: Mapping[str, EvalResult | Mapping[str, Any]], metrics: Sequence[str] | None = None,
                     label: str = "") -> str:
    """The same table as GitHub markdown."""
    names, body = results_rows(rows, metrics)
    lines = ["| " + " | ".join([label, *names]) + " |", "|" + "|".join(["---"] + ["---:"] * len(names)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"
