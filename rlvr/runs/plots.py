"""PNG plots of a run's metrics.jsonl (matplotlib, Agg backend: no display needed).

`plot_run(run_dir)` draws whichever keys of the metric schema (docs/runs.md) the run logged, one
figure per theme, and returns the PNG paths under RUN_DIR/plots/:

    reward.png        reward/mean, reward/<part>, eval/reward; accuracy, format_rate, eval/accuracy,
                      eval/format_rate, eval/pass@k vs step
    reward_time.png   the same against wall time ("time", seconds since the run started)
    length.png        len/mean, len/correct, len/incorrect (tokens); truncated fractions; median/max
    optimization.png  loss, grad_norm, entropy, kl, clip_frac/*, ratio/*, lr
    system.png        tokens_per_s, time/*, verifier/*, zero_var_groups, kept_frac
    other.png         numeric keys outside the schema (at most 12)

Noisy series (more than 20 points) are drawn faint with a moving average on top.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.runs.rundir import metric_series, read_jsonl

# (figure file, x key, [(panel title, y label, [key patterns])]); patterns are fnmatch globs.
REWARD_PANELS = [
    ("Reward", "reward", ["reward/mean", "reward/*", "eval/reward"]),
    ("Accuracy and format", "fraction", ["accuracy", "format_rate", "eval/accuracy*", "eval/format_rate*",
                                         "eval/pass@*"]),
]
FIGURES: list[tuple[str, str, list[tuple[str, str, list[str]]]]] = [
    ("reward.png", "step", REWARD_PANELS),
    ("reward_time.png", "time", REWARD_PANELS),
    ("length.png", "step", [
        ("Response length", "tokens", ["len/mean", "len/correct", "len/incorrect", "eval/len/mean",
                                       "eval/len/correct", "eval/len/incorrect"]),
        ("Truncated at max_tokens", "fraction", ["len/truncated_frac", "eval/truncated_rate"]),
        ("Length spread", "tokens", ["len/median", "len/max", "eval/len/median", "eval/len/max"]),
    ]),
    ("optimization.png", "step", [
        ("Loss", "loss", ["loss", "loss/*"]),
        ("Gradient norm (before clipping)", "L2 norm", ["grad_norm"]),
        ("Entropy", "nats / token", ["entropy"]),
        ("KL to reference", "nats / token", ["kl"]),
        ("Clip fraction", "fraction of tokens", ["clip_frac/*", "clip_frac"]),
        ("Importance ratio", "ratio", ["ratio/*"]),
        ("Learning rate", "lr", ["lr"]),
    ]),
    ("system.png", "step", [
        ("Throughput", "tokens / s", ["tokens_per_s"]),
        ("Time per step", "seconds", ["time/*"]),
        ("Verifier failures", "count", ["verifier/*"]),
        ("Zero-variance groups", "groups", ["zero_var_groups"]),
        ("Rollouts kept for the loss", "fraction", ["kept_frac"]),
    ]),
]
MAX_OTHER = 12


def _numeric_keys(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if k not in ("step", "time") and isinstance(v, int | float) and not isinstance(v, bool):
                keys[k] = None
    return list(keys)


def _match(keys: Sequence[str], patterns: Sequence[str], taken: set[str]) -> list[str]:
    out: list[str] = []
    for pat in patterns:
        for k in keys:
            if k not in out and k not in taken and fnmatch.fnmatchcase(k, pat):
                out.append(k)
    return out


def _moving_average(ys: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _draw(path: Path, rows, x: str, panels: list[tuple[str, str, list[str]]], title: str) -> bool:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not panels:
        return False
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (panel_title, ylabel, keys) in zip(axes.flat, panels, strict=False):
        for key in keys:
            xs, ys = metric_series(rows, key, x=x)
            if not xs:
                continue
            if len(xs) > 20:
                (line,) = ax.plot(xs, ys, alpha=0.3, linewidth=1)
                window = max(3, len(xs) // 20)
                ax.plot(xs, _moving_average(ys, window), color=line.get_color(), linewidth=1.8,
                        label=f"{key} (avg {window})")
            else:
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, label=key)
        ax.set_title(panel_title, fontsize=11)
        ax.set_xlabel("wall time (s)" if x == "time" else x)
        if x == "step":
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_run(run_dir: Any, out_dir: str | Path | None = None) -> list[Path]:
    """Write PNGs for the metrics present in RUN_DIR/metrics.jsonl; returns their paths (possibly
    empty when nothing numeric was logged). out_dir defaults to RUN_DIR/plots."""
    run_path = Path(getattr(run_dir, "path", run_dir))
    metrics = run_path / "metrics.jsonl"
    if not metrics.exists():
        raise FileNotFoundError(f"{metrics} does not exist: is {run_path} a run directory?")
    rows = read_jsonl(metrics)
    keys = _numeric_keys(rows)
    out = Path(out_dir) if out_dir is not None else run_path / "plots"
    written: list[Path] = []
    taken: set[str] = set()
    for fname, x, spec in FIGURES:
        if x == "time" and not any(isinstance(r.get("time"), int | float) for r in rows):
            continue
        panels = []
        used: set[str] = set()
        for title, ylabel, patterns in spec:
            matched = _match(keys, patterns, used)
            used.update(matched)
            if matched:
                panels.append((title, ylabel, matched))
        taken |= used
        if panels and _draw(out / fname, rows, x, panels, f"{run_path.name}: {fname[:-4].replace('_', ' ')}"):
            written.append(out / fname)
    other = [k for k in keys if k not in taken][:MAX_OTHER]
    if other and _draw(out / "other.png", rows, "step", [(k, k, [k]) for k in other], f"{run_path.name}: other"):
        written.append(out / "other.png")
    for fname in [f for f, _, _ in FIGURES] + ["other.png"]:  # figures of an earlier call, now stale
        if out / fname not in written:
            (out / fname).unlink(missing_ok=True)
    return written
