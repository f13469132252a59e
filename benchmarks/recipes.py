"""The recipe book side by side on the demo task, at an equal sampling budget.

    .venv/bin/python benchmarks/recipes.py [--steps 60] [--eval-every 10] [--seeds 0] [--threads 1]
        [--recipes grpo,dr_grpo,rloo,ppo,ei]

One SFT warm start per seed (the demo's: tiny model, sums of four single digits, SFT until 20% greedy
accuracy on a validation slice), then each recipe from that same checkpoint for the same number of
steps, each step sampling the same n_prompts x group_size = 64 x 8 responses (expert iteration: one
round = one step, fine-tuning one epoch on the verified answers). Held-out greedy accuracy (200
problems) every --eval-every steps; wall time is the sum of the steps' own time (time/step, start-up
excluded); peak memory is the highest per-step resident-set peak (mem/rss_step_peak_gb). Recipes
run one after another in this process, so they see the same machine load.

Writes benchmarks/results/recipes.json, recipes.md and recipes.png (accuracy vs step and vs wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RECIPES = ("grpo", "dr_grpo", "rloo", "ppo", "ei")


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _curve(rows: list[dict]) -> dict:
    wall, steps, acc, secs = 0.0, [], [], []
    peak = 0.0
    for r in rows:
        wall += r.get("time/step", 0.0)
        peak = max(peak, r.get("mem/rss_step_peak_gb", 0.0))
        if "eval/accuracy" in r:
            steps.append(r["step"])
            acc.append(r["eval/accuracy"])
            secs.append(round(wall, 2))
    train_s = [r["time/step"] - r.get("time/eval", 0.0) for r in rows if "time/step" in r]
    return {"steps": steps, "accuracy": acc, "seconds": secs, "peak_rss_gb": round(peak, 3),
            "median_step_s": round(statistics.median(train_s), 3) if train_s else None}


def _run_recipe(name: str, sft_dir: Path, out: Path, rl_cfg, rl_task, a) -> dict:
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig

    common = [f"model.init_from={sft_dir}", f"run.out_dir={out}", "run.overwrite=true", f"run.steps={a.steps}",
              f"run.eval_every={a.eval_every}", f"run.seed={rl_cfg.run.seed}", f"run.num_threads={a.threads}",
              "run.progress=false", "run.log_samples_every=0", f"optim.lr={rl_cfg.optim.lr}",
              f"sampling.n_prompts={rl_cfg.sampling.n_prompts}", f"sampling.group_size={rl_cfg.sampling.group_size}",
              f"sampling.max_tokens={rl_cfg.sampling.max_tokens}"]
    model = [f"model.{k}={v}" for k, v in rl_cfg.model.__dict__.items()
             if k in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "tie_embeddings")]
    if name == "ei":
        from rlvr.train.config import EIConfig
        from rlvr.train.ei import train_ei

        cfg = load_config(EIConfig, None, model + common + ["algo.epochs=1"])
        res = train_ei(cfg, data=rl_task)
    else:
        from rlvr.train.pg.loop import train
        from rlvr.train.pg.recipes import get_recipe

        # the KL anchor is off in every recipe here, as in the demo (a tiny model far from any
        # reference gains nothing from it); PPO keeps its per-token KL reward (part of the method)
        extra = ["algo.kl_coef=0"] if name != "ppo" else []
        cfg = load_config(TrainConfig, None, model + common + extra, base=get_recipe(name))
        res = train(cfg, data=rl_task)
    return _curve(_rows(Path(res.run_dir)))


def _held_out_accuracy(model_dir: Path, task, cfg) -> float:
    """Greedy held-out accuracy of the SFT checkpoint every recipe starts from (step 0)."""
    from rlvr.models import load_policy
    from rlvr.rollout import build_generator
    from rlvr.train.tasks import eval_policy

    model, tok = load_policy(model_dir)
    return eval_policy(build_generator(cfg.rollout, model, tok, default_batch_size=256), task, cfg,
                       greedy=True)["accuracy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-recipes"))
    a = ap.parse_args()
    from rlvr.runtime import set_num_threads
    from rlvr.train.demo import DemoConfig, _configs, demo_task
    from rlvr.train.policy import quiet_transformers
    from rlvr.train.sft import train_sft

    set_num_threads(a.threads)
    quiet_transformers()
    names = [n for n in a.recipes.split(",") if n]
    unknown = sorted(set(names) - set(RECIPES))
    if unknown:
        sys.exit(f"--recipes: unknown {unknown}; known: {', '.join(RECIPES)}")
    load_before = os.getloadavg()
    t_all = time.perf_counter()
    result: dict = {"command": "python benchmarks/recipes.py " + " ".join(sys.argv[1:]), "steps": a.steps,
                    "machine": platform.processor() or platform.machine(), "threads": a.threads, "seeds": {}}
    for seed in a.seeds:
        out = Path(a.out) / f"seed{seed}"
        dcfg = DemoConfig(out_dir=str(out), seed=seed, num_threads=a.threads, progress=False)
        sft_cfg, rl_cfg = _configs(dcfg, out)
        task = demo_task(dcfg)
        pool = list(task.train[dcfg.sft_examples:])
        sft_task = type(task)(**{**task.__dict__, "train": list(task.train[: dcfg.sft_examples]),
                                 "eval": pool[: dcfg.num_eval]})
        rl_task = type(task)(**{**task.__dict__, "train": pool})
        print(f"seed {seed}: SFT warm start ...", flush=True)
        sft_res = train_sft(sft_cfg, data=sft_task, stop_at_accuracy=dcfg.sft_target_accuracy)
        from rlvr.train.policy import resolve_model_dir

        sft_dir = resolve_model_dir(sft_res.run_dir)
        start = _held_out_accuracy(sft_dir, task, rl_cfg)
        per = {}
        for name in names:
            t0 = time.perf_counter()
            per[name] = _run_recipe(name, sft_dir, out / name, rl_cfg, rl_task, a)
            for key, v in (("steps", 0), ("accuracy", start), ("seconds", 0.0)):
                per[name][key].insert(0, v)
            per[name]["wall_s_with_startup"] = round(time.perf_counter() - t0, 1)
            c = per[name]
            print(f"  {name:8s} acc {c['accuracy'][0]:.3f} -> {c['accuracy'][-1]:.3f}  "
                  f"train {c['seconds'][-1]:.0f}s  peak {c['peak_rss_gb']:.2f} GiB", flush=True)
        result["seeds"][str(seed)] = {"sft_steps": sft_res.steps, "recipes": per}
    result["load_average"] = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    result["total_s"] = round(time.perf_counter() - t_all, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "recipes.json").write_text(json.dumps(result, indent=1))
    md = _markdown(result, names)
    (RESULTS / "recipes.md").write_text(md)
    _plot(result, names, RESULTS / "recipes.png")
    print(md)


def _markdown(result: dict, names: list[str]) -> str:
    lines = [f"Command: `{result['command']}` ({result['steps']} steps, {result['threads']} thread(s), "
             f"load average before/after {result['load_average']})", "",
             "| seed | recipe | held-out greedy accuracy: start -> last | best | train seconds | "
             "median s/step | peak RSS GiB |", "|---|---|---|---|---|---|---|"]
    for seed, r in result["seeds"].items():
        for name in names:
            c = r["recipes"][name]
            lines.append(f"| {seed} | {name} | {c['accuracy'][0]:.3f} -> {c['accuracy'][-1]:.3f} | "
                         f"{max(c['accuracy']):.3f} | {c['seconds'][-1]:.0f} | {c['median_step_s']} | "
                         f"{c['peak_rss_gb']:.2f} |")
    return "\n".join(lines) + "\n"


def _plot(result: dict, names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for seed, r in result["seeds"].items():
        for i, name in enumerate(names):
            c = r["recipes"][name]
            style = {"color": f"C{i}", "alpha": 1.0 if seed == next(iter(result["seeds"])) else 0.4}
            label = name if seed == next(iter(result["seeds"])) else None
            ax1.plot(c["steps"], c["accuracy"], marker="o", label=label, **style)
            ax2.plot(c["seconds"], c["accuracy"], marker="o", **style)
    ax1.set_xlabel("step (64 x 8 samples each)")
    ax2.set_xlabel("training wall time, s")
    for ax in (ax1, ax2):
        ax.set_ylabel("held-out greedy accuracy")
        ax.grid(alpha=0.3)
    ax1.legend()
    fig.suptitle("Recipes from the same SFT checkpoint, equal sampling budget (demo task)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
