"""Evaluation for any task and any generator: accuracy, pass@k, maj@k, format rate, length
statistics, before/after comparison tables and one-row-per-result (sweep) tables. Definitions: rlvr/eval/metrics.py and docs/runs.md."""

from rlvr.eval.compare import (
    DEFAULT_METRICS,
    comparison_markdown,
    comparison_rows,
    comparison_table,
    comparison_text,
    results_markdown,
    results_rows,
    results_table,
    results_text,
)
from rlvr.eval.evaluate import EvalResult, EvalSample, evaluate, graded_answer, summarize
from rlvr.eval.metrics import (
    default_ks,
    is_formatted,
    length_stats,
    maj_at_k,
    majority_vote,
    mean_maj_at_k,
    mean_pass_at_k,
    pass_at_k,
    status_counts,
    vote_key,
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
    "graded_answer",
    "is_formatted",
    "length_stats",
    "maj_at_k",
    "majority_vote",
    "mean_maj_at_k",
    "mean_pass_at_k",
    "pass_at_k",
    "results_markdown",
    "results_rows",
    "results_table",
    "results_text",
    "status_counts",
    "summarize",
    "vote_key",
]
