"""Evaluation for any task and any generator: accuracy, pass@k, format rate, length statistics,
and before/after comparison tables. Definitions: rlvr/eval/metrics.py and docs/runs.md."""

from rlvr.eval.compare import (
    DEFAULT_METRICS,
    comparison_markdown,
    comparison_rows,
    comparison_table,
    comparison_text,
)
from rlvr.eval.evaluate import EvalResult, EvalSample, evaluate, summarize
from rlvr.eval.metrics import (
    default_ks,
    is_formatted,
    length_stats,
    mean_pass_at_k,
    pass_at_k,
    status_counts,
)

__all__ = [
    "DEFAULT_METRICS",
    "EvalResult",
    "EvalSample",
    "comparison_markdown",
    "comparison_rows",
    "comparison_table",
    "comparison_text",
    "default_ks",
    "evaluate",
    "is_formatted",
    "length_stats",
    "mean_pass_at_k",
    "pass_at_k",
    "status_counts",
    "summarize",
]
