"""Study: on- vs off-policy updates: epochs per rollout batch 1, 2, 4, with and without PPO clipping.

    python benchmarks/studies/off_policy.py [--steps 40] [--seeds 0] [--epochs 1,2,4] [--lr 5e-4] [--add]

The claim (source documents): purely on-policy training behaves well but leaves hardware idle;
reusing rollouts for several updates makes the data stale (off-policy), which brings instability,
and the clipped ratio of PPO/GRPO limits how far an update on stale data can push a token's
probability.

Measured on the demo task (sums of four single digits) from one SFT checkpoint per seed, with
`rlvr train`: the grpo recipe (KL off) at lr 5e-4 (the demo's), 32 prompts x 8 samples per step, each rollout
batch used for algo.epochs_per_rollout_batch = 1, 2, 4 full-batch optimizer steps, with
algo.loss = grpo_clip (ratio clipped to [0.8, 1.2]) or grpo_no_clip (ratio * A, no trust region).
Reported per run: held-out greedy accuracy every 10 steps, clip fraction (share of tokens on the
clipped branch), policy entropy (nats/token), the largest importance ratio seen, grad norm, and
stability: the largest drop of held-out accuracy between two evaluations and the spread of the
sampled training accuracy over the last 10 steps. Epoch 1 is on-policy (ratio 1: clipping cannot
act); with E epochs the same samples drive E optimizer steps.
"""

from __future__ import annotations

import argparse
import statistics

LOSSES = ("grpo_clip", "grpo_no_clip")


def stability(eval_acc: list[float], train_acc: list[float], last: int = 10) -> dict:
    """Largest drop between consecutive held-out evaluations (0 if it never fell), best minus last
    held-out accuracy, and the standard deviation of the last `last` sampled training accuracies."""
    drops = [a - b for a, b in zip(eval_acc, eval_acc[1:], strict=False)]
    tail = train_acc[-last:]
    return {"max_drop": max([0.0, *drops]), "best_minus_last": max(eval_acc) - eval_acc[-1],
            "train_acc_sd_last": statistics.pstdev(tail) if len(tail) > 1 else 0.0}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def run(steps: int, seeds: list[int], epochs: list[int], lr: float) -> dict:
    from _common import demo_rl, demo_start, held_out_accuracy, series

    out: dict = {}
    for seed in seeds:
        model_dir, task = demo_start(seed)
        start = held_out_accuracy(model_dir, task, 4)
        out[str(seed)] = {}
        for loss in LOSSES:
            for e in epochs:
                name = f"{loss}-e{e}"
                rs = demo_rl(f"offpol-{name}-s{seed}", model_dir, task,
                             [f"algo.loss={loss}", f"algo.epochs_per_rollout_batch={e}"], steps=steps,
                             eval_every=10, lr=lr, seed=seed)
                est, eacc = series(rs, "eval/accuracy")
                _, tacc = series(rs, "accuracy")
                _, ent = series(rs, "entropy")
                clip = [r.get("clip_frac/low", 0.0) + r.get("clip_frac/high", 0.0) for r in rs]
                _, rmax = series(rs, "ratio/max")
                _, gn = series(rs, "grad_norm")
                out[str(seed)][name] = {
                    "loss": loss, "epochs": e, "eval_steps": [0, *est], "eval_accuracy": [start, *eacc],
                    "train_accuracy": tacc, "entropy": ent, "clip_frac": clip, "ratio_max": rmax,
                    "clip_frac_mean": _mean(clip), "entropy_first": _mean(ent[:5]), "entropy_last": _mean(ent[-5:]),
                    "ratio_max_max": max(rmax) if rmax else None, "grad_norm_mean": _mean(gn),
                    "stability": stability([start, *eacc], tacc),
                    "seconds": sum(r.get("time/step", 0.0) for r in rs)}
    return {"steps": steps, "lr": lr, "epochs": epochs, "runs": out}


def markdown(res: dict) -> str:
    lines = [f"lr {res['lr']}, {res['steps']} rollout batches of 32 x 8; held-out greedy accuracy (200 problems):", "",
             "| seed | loss | epochs | held-out acc: start -> last (best) | clip frac (mean) | entropy first -> last "
             "| max ratio | largest eval drop | sd of last 10 train acc | train s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for seed, runs in res["runs"].items():
        for r in runs.values():
            s = r["stability"]
            lines.append(
                f"| {seed} | {r['loss']} | {r['epochs']} | {r['eval_accuracy'][0]:.3f} -> {r['eval_accuracy'][-1]:.3f} "
                f"({max(r['eval_accuracy']):.3f}) | {r['clip_frac_mean']:.4f} | {r['entropy_first']:.3f} -> "
                f"{r['entropy_last']:.3f} | {r['ratio_max_max']:.2f} | {s['max_drop']:.3f} | "
                f"{s['train_acc_sd_last']:.3f} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    seed = next(iter(res["runs"]))
    for r in res["runs"][seed].values():
        i = res["epochs"].index(r["epochs"])
        ls = "-" if r["loss"] == "grpo_clip" else "--"
        lab = f"{'clip' if r['loss'] == 'grpo_clip' else 'no clip'}, {r['epochs']} epoch(s)"
        axes[0].plot(r["eval_steps"], r["eval_accuracy"], ls, marker=".", color=f"C{i}", label=lab)
        axes[1].plot(range(1, len(r["entropy"]) + 1), r["entropy"], ls, color=f"C{i}", label=lab)
        if r["loss"] == "grpo_clip":
            axes[2].plot(range(1, len(r["clip_frac"]) + 1), r["clip_frac"], ls, color=f"C{i}", label=lab)
        else:
            axes[2].plot([], [])
    axes[0].set_ylabel("held-out greedy accuracy")
    axes[1].set_ylabel("policy entropy, nats/token")
    axes[2].set_ylabel("clip fraction (grpo_clip)")
    for ax in axes:
        ax.set_xlabel("rollout batch (step)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Epochs per rollout batch, with and without clipping (demo task, seed {seed}, lr {res['lr']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--epochs", default="1,2,4")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--add", action="store_true",
                    help="keep the seeds already in the output directory's off_policy.json (same steps, lr, epochs)")
    from _common import finish, merge_previous, parse_args, setup

    a = parse_args(ap, argv)

    header = setup()
    res = run(a.steps, [int(s) for s in a.seeds.split(",")], [int(e) for e in a.epochs.split(",")], a.lr)
    if a.add:
        res = merge_previous("off_policy", res, header, ("steps", "lr", "epochs"), results=a.results)
    md = markdown(res)
    print(md)
    finish("off_policy", header, {**res, "table": md}, lambda p: plot(res, p), results=a.results)


if __name__ == "__main__":
    main()
