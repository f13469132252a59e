"""Study: what dividing by the group's reward std does to the weight of each group, and to learning.

    python benchmarks/studies/std_normalization.py [--steps 60] [--seeds 0,1,2] [--group-size 8]

The claim (source documents, Dr. GRPO): dividing the centered rewards by the group std reweights
prompts by their observed reward spread; for a binary-reward group with success fraction p the
population std is sqrt(p(1-p)), small near p = 0 and 1, so too-easy and too-hard prompts are
up-weighted (the second document adds: "the centered numerator changes too").

1. Weight of a group = (1/G) sum_i |A_i| (the mean magnitude of the coefficients its responses put
   on their score vectors), from the trainer's own advantage functions (rlvr.algo.advantages) for
   every success count k = 0..G, next to the closed forms 2p(1-p) (group mean, no std) and
   2 sqrt(p(1-p)) (GRPO, population std, eps -> 0), p = k/G.
2. The expected weight as a function of a prompt's TRUE success rate q (groups drawn Binomial(G, q),
   Monte Carlo with the same functions, 20,000 groups per q).
3. Learning: `rlvr train` on the demo task (sums of four digits) from one SFT checkpoint per seed with
   algo.advantage = grpo (divide by the group std), group_mean (do not) and batch_std (one std for
   the whole batch: the same overall scale as GRPO without the per-group reweighting); everything
   else equal (grpo_clip, per-response token mean, no KL, lr 5e-4, 32 prompts x 8). Held-out greedy
   accuracy (200 problems) every 10 steps.
"""

from __future__ import annotations

import argparse
import math

import torch

ARMS = ("grpo", "group_mean", "batch_std")


def group_weight(estimator: str, successes: int, group_size: int) -> float:
    """(1/G) sum_i |A_i| of one binary-reward group with `successes` ones, from rlvr.algo.advantages."""
    from rlvr.algo.advantages import compute_advantages

    r = torch.tensor([1.0] * successes + [0.0] * (group_size - successes), dtype=torch.float64)
    return float(compute_advantages(estimator, r, group_size).abs().mean())


def closed_form(estimator: str, p: float) -> float:
    """2p(1-p) for the group mean; 2 sqrt(p(1-p)) for GRPO (population std, eps -> 0)."""
    v = p * (1 - p)
    return 2 * v if estimator == "group_mean" else 2 * math.sqrt(v)


def expected_weight(estimator: str, q: float, group_size: int, groups: int = 20_000, seed: int = 0) -> float:
    """E[(1/G) sum_i |A_i|] over groups whose G rewards are Bernoulli(q): Monte Carlo."""
    from rlvr.algo.advantages import compute_advantages

    g = torch.Generator().manual_seed(seed)
    r = torch.bernoulli(torch.full((groups * group_size,), q, dtype=torch.float64), generator=g)
    return float(compute_advantages(estimator, r, group_size).abs().mean())


def binomial_expectation(estimator: str, q: float, group_size: int) -> float:
    """The same expectation summed exactly over k ~ Binomial(G, q) with the closed forms."""
    return sum(math.comb(group_size, k) * q**k * (1 - q) ** (group_size - k) * closed_form(estimator, k / group_size)
               for k in range(1, group_size))


def weights_table(group_size: int) -> list[dict]:
    rows = []
    for k in range(group_size + 1):
        p = k / group_size
        g, m = group_weight("grpo", k, group_size), group_weight("group_mean", k, group_size)
        rows.append({"k": k, "p": p, "grpo": g, "grpo_formula": closed_form("grpo", p) if 0 < k < group_size else 0.0,
                     "group_mean": m, "group_mean_formula": closed_form("group_mean", p),
                     "ratio": g / m if m > 0 else None})
    half = next(r for r in rows if r["k"] == group_size // 2)["ratio"]
    for r in rows:
        r["ratio_vs_half"] = r["ratio"] / half if r["ratio"] else None
    return rows


def learning(steps: int, seeds: list[int], group_size: int) -> dict:
    from _common import demo_rl, demo_start, series

    out: dict = {}
    for seed in seeds:
        model_dir, task = demo_start(seed)
        out[str(seed)] = {}
        for arm in ARMS:
            rs = demo_rl(f"std-{arm}-s{seed}", model_dir, task, [f"algo.advantage={arm}"], steps=steps,
                         eval_every=10, group_size=group_size, seed=seed)
            st, acc = series(rs, "eval/accuracy")
            _, zero = series(rs, "zero_var_groups")
            _, gn = series(rs, "grad_norm")
            out[str(seed)][arm] = {"steps": st, "accuracy": acc, "zero_var_groups_mean": sum(zero) / len(zero),
                                   "grad_norm_mean": sum(gn) / len(gn),
                                   "start_accuracy": _start_accuracy(model_dir, task)}
    return out


_START: dict = {}


def _start_accuracy(model_dir, task) -> float:
    """Held-out greedy accuracy of the SFT checkpoint (step 0), once per checkpoint."""
    if str(model_dir) not in _START:
        from rlvr.config import load_config
        from rlvr.models import load_policy
        from rlvr.rollout import build_generator
        from rlvr.train.config import TrainConfig
        from rlvr.train.tasks import eval_policy

        cfg = load_config(TrainConfig, None, ["sampling.max_tokens=4", "data.num_eval=200"])
        model, tok = load_policy(model_dir)
        _START[str(model_dir)] = eval_policy(build_generator(cfg.rollout, model, tok, default_batch_size=256),
                                             task, cfg, greedy=True)["accuracy"]
    return _START[str(model_dir)]


def markdown(res: dict) -> str:
    g = res["group_size"]
    lines = [f"Weight of a group of G={g} binary rewards, (1/G) sum |A_i| (measured with rlvr.algo.advantages; "
             "closed form in brackets):", "",
             "| successes k | p = k/G | GRPO (std) | group mean (no std) | GRPO / group mean | same, relative to p = 1/2 |",
             "|---|---|---|---|---|---|"]
    for r in res["weights"]:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        rel = f"{r['ratio_vs_half']:.2f}" if r["ratio_vs_half"] else "-"
        lines.append(f"| {r['k']} | {r['p']:.3f} | {r['grpo']:.4f} ({r['grpo_formula']:.4f}) | "
                     f"{r['group_mean']:.4f} ({r['group_mean_formula']:.4f}) | {ratio} | {rel} |")
    lines += ["", "Expected weight of a prompt with true success rate q (Monte Carlo; exact binomial sum in brackets):",
              "", "| q | GRPO | group mean | GRPO / group mean |", "|---|---|---|---|"]
    for r in res["by_rate"]:
        lines.append(f"| {r['q']:.2f} | {r['grpo']:.4f} ({r['grpo_exact']:.4f}) | {r['group_mean']:.4f} "
                     f"({r['group_mean_exact']:.4f}) | {r['grpo'] / r['group_mean']:.2f} |")
    if res.get("learning"):
        lines += ["", "Learning (held-out greedy accuracy, start -> last (best)); mean grad norm; share of groups "
                  "with equal rewards:", "", "| seed | " + " | ".join(ARMS) + " |", "|---" * (len(ARMS) + 1) + "|"]
        for seed, arms in res["learning"].items():
            cells = [f"{a['start_accuracy']:.3f} -> {a['accuracy'][-1]:.3f} ({max(a['accuracy']):.3f}); "
                     f"gn {a['grad_norm_mean']:.2f}; zv {a['zero_var_groups_mean']:.2f}" for a in arms.values()]
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
        means = {arm: sum(r[arm]["accuracy"][-1] for r in res["learning"].values()) / len(res["learning"])
                 for arm in ARMS}
        lines.append("| mean last | " + " | ".join(f"{means[a]:.3f}" for a in ARMS) + " |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path) -> None:
    import matplotlib.pyplot as plt

    n = 3 if res.get("learning") else 2
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4))
    w = res["weights"]
    ax = axes[0]
    qs = [i / 200 for i in range(1, 200)]
    for i, est in enumerate(("grpo", "group_mean")):
        ax.plot(qs, [closed_form(est, q) for q in qs], color=f"C{i}", lw=1, alpha=0.6)
        ax.plot([r["p"] for r in w], [r[est] for r in w], "o", color=f"C{i}",
                label=f"{est} ({'divides by std' if est == 'grpo' else 'no std'})")
    ax.set_xlabel("group success fraction k/G")
    ax.set_ylabel("group weight (1/G) sum |A_i|")
    ax.set_title(f"Per group, G={res['group_size']} (dots: measured, line: formula)", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1]
    br = res["by_rate"]
    for i, est in enumerate(("grpo", "group_mean")):
        ax.plot([r["q"] for r in br], [r[est] for r in br], "o-", color=f"C{i}", label=est)
    ax2 = ax.twinx()
    ax2.plot([r["q"] for r in br], [r["grpo"] / r["group_mean"] for r in br], "k--", label="GRPO / group mean")
    ax2.set_ylabel("ratio (dashed)")
    ax.set_xlabel("true success rate q of the prompt")
    ax.set_ylabel("expected group weight")
    ax.set_title("Expected weight vs true success rate", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    if res.get("learning"):
        ax = axes[2]
        for s_i, arms in enumerate(res["learning"].values()):
            for i, arm in enumerate(ARMS):
                a = arms[arm]
                ax.plot([0, *a["steps"]], [a["start_accuracy"], *a["accuracy"]], color=f"C{i}", marker=".",
                        alpha=1.0 if s_i == 0 else 0.4, label=arm if s_i == 0 else None)
        ax.set_xlabel("step (32 prompts x 8)")
        ax.set_ylabel("held-out greedy accuracy")
        ax.set_title("Demo task, one SFT checkpoint per seed", fontsize=9)
        ax.legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--no-learning", action="store_true", help="only the weights (seconds)")
    from _common import finish, parse_args, setup

    a = parse_args(ap, argv, partial=lambda a: "--no-learning" if a.no_learning else None)

    header = setup()
    g = a.group_size
    res: dict = {"group_size": g, "weights": weights_table(g), "by_rate": []}
    for q in (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
        res["by_rate"].append({"q": q, **{est: expected_weight(est, q, g) for est in ("grpo", "group_mean")},
                               **{f"{est}_exact": binomial_expectation(est, q, g) for est in ("grpo", "group_mean")}})
    if not a.no_learning:
        res["learning"] = learning(a.steps, [int(s) for s in a.seeds.split(",")], g)
    md = markdown(res)
    print(md)
    finish("std_normalization", header, {**res, "table": md}, lambda p: plot(res, p), results=a.results)


if __name__ == "__main__":
    main()
