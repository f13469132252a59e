"""PNG plots of a run's metrics.jsonl (matplotlib, Agg backend: no display needed).

`plot_run(run_dir)` draws whichever keys of the metric schema (docs/runs.md) the run logged, one
figure per theme, and returns the PNG paths under RUN_DIR/plots/:

    reward.png        reward/mean, reward/<part>, eval/reward; accuracy, format_rate, eval/accuracy,
                      eval/format_rate, eval/pass@k (val/* likewise) vs step
    reward_time.png   the same against wall time ("time", seconds since the run started)
    length.png        len/mean, len/correct, len/incorrect (tokens); truncated fractions; median/max
    optimization.png  loss, grad_norm, entropy, kl, clip_frac/*, ratio/*, lr, sampler-trainer log-prob
                      gap, rollout correction, critic/* (PPO)
    system.png        tokens_per_s, perf/* (rollout and learner tokens/s, MFU), time/*, tokens/*, mem/*,
                      verifier/*, zero_var_groups, kept_frac, rollout/staleness
    other.png         numeric keys outside the schema (at most 12), only when there are some

A series that stays at one value (clip fraction 0, ratio 1, no verifier failure, a constant lr) is not
drawn: the figure's footnote names it with its value, and a panel left empty is dropped. The reward
itself (reward/mean, eval/reward, val/reward: ALWAYS_DRAWN) is drawn even when flat: a reward stuck at 0
is the plot a run most needs to show. A series equal to one drawn before it in the same figure
(reward/answer = reward/mean for a one-part reward, eval/accuracy = eval/reward for a 0/1 reward) is
drawn once, its legend naming both.
rollout/policy_version is not drawn (it rises with the step; rollout/staleness is its lag). The demo's
SFT run logs its stopping check on a validation slice as val/* (not eval/*: those are held-out).

Noisy series (more than 20 points) are drawn faint with a moving average on top.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.runs.rundir import metric_series, read_jsonl

# (figure file, x key, [(panel title, y label, [key patterns])]); patterns are fnmatch globs.
REWARD_PANELS = [
    ("Reward", "reward", ["reward/mean", "reward/*", "eval/reward", "val/reward"]),
    ("Accuracy and format", "fraction", ["accuracy", "format_rate", "eval/accuracy*", "eval/format_rate*",
                                         "eval/pass@*", "eval/maj@*", "val/accuracy", "val/format_rate"]),
]
FIGURES: list[tuple[str, str, list[tuple[str, str, list[str]]]]] = [
    ("reward.png", "step", REWARD_PANELS),
    ("reward_time.png", "time", REWARD_PANELS),
    ("length.png", "step", [
        ("Response length", "tokens", ["len/mean", "len/correct", "len/incorrect", "eval/len/mean",
                                       "eval/len/correct", "eval/len/incorrect", "val/len/mean"]),
        ("Truncated at max_tokens", "fraction", ["len/truncated_frac", "eval/truncated_rate", "val/truncated_rate",
                                                 "masked_truncated_frac"]),
        ("Length spread", "tokens", ["len/median", "len/max", "eval/len/median", "eval/len/max"]),
        ("Reflection phrases", "fraction of responses", ["text/*", "eval/text/*", "val/text/*"]),
    ]),
    ("optimization.png", "step", [
        ("Entropy mask", "fraction of tokens kept", ["loss/entropy_kept_frac"]),
        ("Loss", "loss", ["loss", "loss/*"]),
        ("Gradient norm (before clipping)", "L2 norm", ["grad_norm"]),
        ("Entropy", "nats / token", ["entropy"]),
        ("KL to reference", "nats / token", ["kl"]),
        ("Clip fraction", "fraction of tokens", ["clip_frac/*", "clip_frac"]),
        ("Importance ratio", "ratio", ["ratio/*"]),
        ("Learning rate", "lr", ["lr"]),
        ("Sampler vs trainer log-prob", "nats", ["rollout/logprob_diff_*", "rollout/push_gap_*"]),
        ("Rollout correction", "ratio / fraction", ["rollout/correction_*"]),
        ("Critic (PPO)", "value", ["critic/*"]),
    ]),
    ("system.png", "step", [
        ("Throughput", "tokens / s", ["tokens_per_s", "perf/*tokens_per_s"]),
        ("Model FLOPs utilization", "fraction of peak", ["perf/mfu"]),
        ("FLOPs done by the learner", "FLOP", ["perf/flops"]),
        ("Time per step", "seconds", ["time/*"]),
        ("Tokens per step", "tokens", ["tokens/*"]),
        ("Memory", "GiB", ["mem/*"]),
        ("Verifier failures", "count", ["verifier/*"]),
        ("Model judge", "count / fraction", ["judge/*", "eval/judge/*"]),
        ("Zero-variance groups", "groups", ["zero_var_groups"]),
        ("Rollouts kept for the loss", "fraction", ["kept_frac"]),
        ("Rollout staleness", "policy versions behind", ["rollout/staleness"]),
    ]),
]
# Logged but never drawn: the oldest rollout's policy version rises with the step by construction
# (rollout/staleness, its lag behind the learner, is what carries information).
NOT_DRAWN = ("rollout/policy_version",)
# Drawn even when constant: the reward curves, where a flat line (no response ever scored, no learning
# signal) is the finding, not a detail for the footnote.
ALWAYS_DRAWN = ("reward/mean", "eval/reward", "val/reward")
MAX_OTHER = 12
# Two series are "the same" (one is drawn, labelled "= the other") or one is "constant" (not drawn,
# named in the figure's footnote) within this relative tolerance.
SAME_RTOL = 1e-9


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


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=SAME_RTOL, abs_tol=1e-12)


def _constant(series: tuple[list[float], list[float]]) -> bool:
    """Two or more points, all the same value: a flat line says nothing a footnote cannot."""
    ys = series[1]
    return len(ys) >= 2 and all(_close(y, ys[0]) for y in ys)


def _same(a: tuple[list[float], list[float]], b: tuple[list[float], list[float]]) -> bool:
    return len(a[0]) == len(b[0]) and all(_close(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1], strict=True))


def _short(v: float) -> str:
    return f"{v:.4g}"


class _Plan:
    """Which keys a run's figures draw: constant series are left out (named in a footnote) except the reward
    curves (ALWAYS_DRAWN), a series equal to one already drawn is left out too and named in that one's legend
    ("accuracy = reward/mean", also for a flat reward/mean drawn anyway)."""

    def __init__(self, rows: Sequence[Mapping[str, Any]]):
        self.rows = rows
        self.series = {k: metric_series(rows, k) for k in _numeric_keys(rows) if k not in NOT_DRAWN}
        self.alias: dict[str, list[str]] = {}

    def panels(self, spec, taken: set[str]) -> tuple[list[tuple[str, str, list[str]]], list[str]]:
        """(panels to draw, footnote of constant series) of one figure; `taken` collects every matched key."""
        keys = list(self.series)
        self.alias = {}  # per figure: a legend names the twins drawn in its own figure
        panels, constants, drawn, used = [], [], [], set()
        for title, ylabel, patterns in spec:
            matched = _match(keys, patterns, used)
            used.update(matched)
            keep = []
            for k in matched:
                ser = self.series[k]
                if not ser[0]:
                    continue
                twin = next((d for d in drawn if _same(self.series[d], ser)), None)
                if twin is not None:
                    self.alias.setdefault(twin, []).append(k)
                    continue
                if _constant(ser) and k not in ALWAYS_DRAWN:
                    constants.append(f"{k} = {_short(ser[1][0])}")
                    continue
                drawn.append(k)
                keep.append(k)
            if keep:
                panels.append((title, ylabel, keep))
        taken |= used
        return panels, constants

    def label(self, key: str) -> str:
        return " = ".join([key, *self.alias.get(key, [])])


def _draw(path: Path, rows, x: str, panels: list[tuple[str, str, list[str]]], title: str,
          label=lambda k: k, footnote: Sequence[str] = ()) -> bool:
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
                        label=f"{label(key)} (avg {window})")
            else:
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, label=label(key))
        ax.set_title(panel_title, fontsize=11)
        ax.set_xlabel("wall time (s)" if x == "time" else x)
        if x == "step":
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=12)
    if footnote:
        import textwrap

        text = textwrap.fill("constant, not drawn: " + "; ".join(footnote), width=int(30 * ncols))
        fig.text(0.01, 0.01, text, fontsize=8, va="bottom", color="0.3")
        fig.tight_layout(rect=(0, 0.035 * (text.count("\n") + 1) / nrows, 1, 1))
    else:
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


@dataclass
class Figure:
    """One PNG of a run: its panels (title, y label, keys drawn), the legend label of each key (twins
    named), and the constant series left out (named in the footnote)."""

    name: str
    x: str
    panels: list[tuple[str, str, list[str]]]
    labels: dict[str, str] = field(default_factory=dict)
    constants: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        """What the figure shows, one line per panel, then the constants: what `rlvr plot` prints."""
        lines = [f"{title}: {', '.join(self.labels.get(k, k) for k in keys)}" for title, _, keys in self.panels]
        return lines + ([f"constant, not drawn: {'; '.join(self.constants)}"] if self.constants else [])


def plan_figures(rows: Sequence[Mapping[str, Any]]) -> list[Figure]:
    """The figures plot_run draws for these metric rows (no figure without a panel)."""
    plan = _Plan(rows)
    figures: list[Figure] = []
    taken: set[str] = set()
    for fname, x, spec in FIGURES:
        if x == "time" and not any(isinstance(r.get("time"), int | float) for r in rows):
            continue
        panels, constants = plan.panels(spec, taken)
        if panels:
            figures.append(Figure(fname, x, panels, {k: plan.label(k) for _, _, ks in panels for k in ks}, constants))
    # keys outside the schema (a user's own metrics, new ones): one panel each, the same rules
    rest = [k for k in plan.series if k not in taken]
    panels, constants = plan.panels([(k, k, [k]) for k in rest], taken)
    if panels[:MAX_OTHER]:
        figures.append(Figure("other.png", "step", panels[:MAX_OTHER],
                              {k: plan.label(k) for _, _, ks in panels[:MAX_OTHER] for k in ks}, constants))
    return figures


def plot_run(run_dir: Any, out_dir: str | Path | None = None) -> list[Path]:
    """Write PNGs for the metrics present in RUN_DIR/metrics.jsonl; returns their paths (possibly
    empty when nothing numeric was logged). out_dir defaults to RUN_DIR/plots."""
    run_path = Path(getattr(run_dir, "path", run_dir))
    metrics = run_path / "metrics.jsonl"
    if not metrics.exists():
        raise FileNotFoundError(f"{metrics} does not exist: is {run_path} a run directory?")
    rows = read_jsonl(metrics)
    out = Path(out_dir) if out_dir is not None else run_path / "plots"
    written: list[Path] = []
    for fig in plan_figures(rows):
        title = f"{run_path.name}: {fig.name[:-4].replace('_', ' ')}"
        if _draw(out / fig.name, rows, fig.x, fig.panels, title, lambda k, f=fig: f.labels.get(k, k), fig.constants):
            written.append(out / fig.name)
    for fname in [f for f, _, _ in FIGURES] + ["other.png"]:  # figures of an earlier call, now stale
        if out / fname not in written:
            (out / fname).unlink(missing_ok=True)
    return written
