"""Study: the group-mean baseline shrinks the expected policy gradient by (1 - 1/G); leave-one-out does not.

    python benchmarks/studies/one_minus_1_over_g.py [--groups 400000] [--sizes 2,3,4,8,16] [--seed 0]

The claim (source documents, "the (1 - 1/G) factor"): with A_i = r_i - mean_j r_j the baseline
contains r_i itself, so E[(1/G) sum_i A_i grad log pi(y_i)] = (1 - 1/G) grad J; the leave-one-out
baseline (RLOO, A_i = r_i - mean_{j != i} r_j) is unbiased, and so is no baseline at all.

Measured by Monte Carlo on a small policy whose exact gradient is known: a softmax over K answers
with logits theta, reward r_a in [0, 1] per answer, J = sum_a pi_a r_a and grad_k J = pi_k (r_k - J).
Each of M groups draws G answers, the advantages come from rlvr.algo.advantages (group_mean, rloo,
no_baseline: the trainer's own functions) and the group's gradient estimate is
(1/G) sum_i A_i (e_{a_i} - pi). The measured factor is the projection <mean estimate, grad J> /
|grad J|^2 with its standard error over groups (the residual orthogonal to grad J is reported too);
the per-group variance of that projection shows what each baseline costs in noise.
"""

from __future__ import annotations

import argparse
import math

import torch

ESTIMATORS = ("group_mean", "rloo", "no_baseline")


def bandit(k: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (K,), rewards (K,)) float64 of the test policy: random logits, rewards in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, generator=g, dtype=torch.float64), torch.rand(k, generator=g, dtype=torch.float64)


def exact_gradient(logits: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """grad_theta of J = sum_a softmax(theta)_a r_a: pi_k (r_k - J)."""
    p = torch.softmax(logits, 0)
    return p * (rewards - (p * rewards).sum())


def measure_factor(estimator: str, logits: torch.Tensor, rewards: torch.Tensor, group_size: int, groups: int,
                   seed: int = 0, chunk: int = 100_000) -> dict:
    """Monte Carlo of the expected gradient of `estimator`'s advantages with groups of group_size:
    factor = <E[g], grad J> / |grad J|^2 and its standard error, relative residual |E[g] - factor grad J| /
    |grad J|, and the variance of the per-group projection (in units of |grad J|^2)."""
    from rlvr.algo.advantages import compute_advantages

    p = torch.softmax(logits, 0)
    true = exact_gradient(logits, rewards)
    norm2 = float(true @ true)
    gen = torch.Generator().manual_seed(seed)
    total = torch.zeros_like(true)
    s1 = s2 = 0.0
    done = 0
    while done < groups:
        m = min(chunk, groups - done)
        a = torch.multinomial(p.expand(m, -1), group_size, replacement=True, generator=gen)  # (m, G)
        r = rewards[a].reshape(-1)
        adv = compute_advantages(estimator, r, group_size).to(torch.float64).reshape(m, group_size)
        onehot = torch.nn.functional.one_hot(a, p.numel()).to(torch.float64)  # (m, G, K)
        est = ((adv.unsqueeze(-1) * (onehot - p)).sum(1)) / group_size  # (m, K)
        proj = est @ true / norm2  # (m,)
        total += est.sum(0)
        s1 += float(proj.sum())
        s2 += float((proj * proj).sum())
        done += m
    mean = total / groups
    f = s1 / groups
    var = s2 / groups - f * f
    resid = float((mean - f * true).norm() / math.sqrt(norm2))
    return {"factor": f, "stderr": math.sqrt(var / groups), "residual": resid, "proj_var": var}


def expected_factor(estimator: str, group_size: int) -> float:
    """What the documents say: (1 - 1/G) for the group mean, 1 for leave-one-out and no baseline."""
    return 1.0 - 1.0 / group_size if estimator == "group_mean" else 1.0


def run(sizes: list[int], groups: int, seed: int) -> dict:
    logits, rewards = bandit(seed=seed)
    rows = []
    for g in sizes:
        for est in ESTIMATORS:
            m = measure_factor(est, logits, rewards, g, groups, seed=seed + 1000 * g)
            rows.append({"G": g, "estimator": est, "expected": expected_factor(est, g), **m,
                         "z": (m["factor"] - expected_factor(est, g)) / m["stderr"]})
            print(f"G={g:2d} {est:12s} factor {m['factor']:.4f} +- {m['stderr']:.4f} (formula "
                  f"{expected_factor(est, g):.4f}), projection variance {m['proj_var']:.2f}", flush=True)
    return {"policy": {"logits": logits.tolist(), "rewards": rewards.tolist(),
                       "grad_J": exact_gradient(logits, rewards).tolist()}, "groups": groups, "rows": rows}


def markdown(res: dict) -> str:
    lines = ["| G | estimator | measured factor (± s.e.) | formula | z | relative residual | var of projection |",
             "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['G']} | {r['estimator']} | {r['factor']:.4f} ± {r['stderr']:.4f} | {r['expected']:.4f} "
                     f"| {r['z']:+.1f} | {r['residual']:.3f} | {r['proj_var']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = sorted({r["G"] for r in res["rows"]})
    xs = torch.linspace(min(sizes), max(sizes), 100)
    ax.plot(xs, 1 - 1 / xs, "k--", label="formula 1 - 1/G")
    ax.axhline(1.0, color="gray", lw=0.8)
    for i, est in enumerate(ESTIMATORS):
        rr = [r for r in res["rows"] if r["estimator"] == est]
        ax.errorbar([r["G"] for r in rr], [r["factor"] for r in rr], yerr=[2 * r["stderr"] for r in rr],
                    marker="o", ls="", color=f"C{i}", capsize=3, label=f"{est} (measured, ±2 s.e.)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("group size G")
    ax.set_ylabel("E[gradient estimate] / true gradient")
    ax.set_title(f"Expected gradient factor, {res['groups']:,} groups per point")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=400_000)
    ap.add_argument("--sizes", default="2,3,4,8,16")
    ap.add_argument("--seed", type=int, default=0)
    from _common import finish, parse_args, setup

    a = parse_args(ap, argv)

    header = setup()
    res = run([int(x) for x in a.sizes.split(",")], a.groups, a.seed)
    print(markdown(res))
    finish("one_minus_1_over_g", header, {**res, "table": markdown(res)}, lambda p: plot(res, p), results=a.results)


if __name__ == "__main__":
    main()
