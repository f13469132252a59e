"""Study: self-correction phrases exist before RL; what RL does to their rate (docs/studies/reflection.md).

The claim (the lecture on R1-Zero, after Liu et al.'s "Understanding R1-Zero-like training"): the "aha moment"
(a response that stops, says "wait", and corrects itself) is not created by RL: base models already produce
such phrases, and RL at most changes how often. A tiny model has no pretraining, so this study gives it one
on purpose: an SFT "base" trained on worked sums (the sum_steps task, "3+5+7=" -> "3+5=08\\n08+7=15") in which
a share of the targets (--reflect-share, default 0.25) first write a wrong step, then "wait, let me check",
then the right step. Then:

    base     rlvr eval-style sampling (T=1, 8 samples) of the held-out sums: text/reflection_rate, and the
             accuracy of the responses with and without a reflection phrase (rlvr.eval.reflection)
    RL       GRPO on the outcome (the last line's result) from the base, --steps steps; text/reflection_rate
             of every step's samples is in its metrics.jsonl (logged by every `rlvr train` run)
    trained  the same sampling of the held-out sums as the base

    python benchmarks/studies/reflection.py          # --steps 60 --seeds 0,1,2 --reflect-share 0.25

Writes runs/studies/results/reflection.{json,png} (--publish: benchmarks/results/studies/).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RUNS, finish, parse_args, rl_run, series, setup, sft_checkpoint  # noqa: E402

REFLECTION = "wait, let me check"
MAX_TOKENS = 48


def reflective_target(target: str, rng: random.Random) -> str:
    """The worked steps with a wrong first step, "wait, let me check", and the right step again:
    "3+5=08\\n08+7=15" -> "3+5=09\\nwait, let me check\\n3+5=08\\n08+7=15" (the wrong result is off by 1-3,
    never negative, written with the same number of digits)."""
    first, _, rest = target.partition("\n")
    m = re.fullmatch(r"(.*=)(\d+)", first)
    if m is None:
        raise ValueError(f"not a step: {first!r}")
    right = int(m.group(2))
    wrong = right + rng.choice([d for d in (-3, -2, -1, 1, 2, 3) if right + d >= 0])
    wrong_line = f"{m.group(1)}{wrong:0{len(m.group(2))}d}"
    return "\n".join([wrong_line, REFLECTION, first, *([rest] if rest else [])])


def sampled(model_dir: Path, task, seed: int, n: int = 8) -> dict:
    """Held-out sums sampled at T=1, n each: accuracy, reflection rate, accuracy with / without reflection."""
    from rlvr.eval import evaluate
    from rlvr.eval.reflection import has_reflection
    from rlvr.models import load_policy
    from rlvr.rollout import HFGenerator, SamplingSpec

    model, tok = load_policy(model_dir)
    spec = SamplingSpec(n=n, temperature=1.0, max_tokens=MAX_TOKENS, stop=tuple(task.stop), seed=seed,
                        logprobs=False)
    res = evaluate(HFGenerator(model, tok, batch_size=256), task.eval, [task.prompt(e) for e in task.eval],
                   task.reward_fn, spec)
    refl = [s for s in res.samples if has_reflection(s.response)]
    plain = [s for s in res.samples if not has_reflection(s.response)]

    def acc(xs):
        return sum(s.correct for s in xs) / len(xs) if xs else None

    return {"accuracy": res.accuracy, "reflection_rate": len(refl) / len(res.samples), "samples": len(res.samples),
            "accuracy_reflective": acc(refl), "accuracy_plain": acc(plain), "len_mean": res.lengths["len/mean"]}


def one_seed(a, seed: int) -> dict:
    """SFT base with planted reflections, its sampled held-out metrics, GRPO, the trained model's metrics."""
    from rlvr.train.config import DataConfig
    from rlvr.train.policy import resolve_model_dir
    from rlvr.train.tasks import load_task_data

    task = load_task_data(DataConfig(task="sum_steps", num_train=800, num_eval=a.num_eval, seed=seed))
    rng = random.Random(seed)
    targets, planted = {}, 0
    for ex in task.train:
        t = task.target(ex)
        if rng.random() < a.reflect_share:
            t, planted = reflective_target(t, rng), planted + 1
        targets[ex.id] = t
    sft_task = replace(task, target=lambda ex: targets[ex.id])
    base = sft_checkpoint(f"reflect{a.reflect_share:g}", sft_task, [
        f"sampling.max_tokens={MAX_TOKENS}", "data.task=sum_steps", f"data.num_eval={a.num_eval}",
        "run.eval_every=0"], seed=seed, steps=a.sft_steps, fresh=True)
    before = sampled(base, task, 1000 + seed)
    print(f"seed {seed} base:", before, flush=True)
    rs = rl_run(f"reflection-rl-s{seed}", base, task, [
        "data.task=sum_steps", f"data.num_eval={a.num_eval}", f"run.steps={a.steps}", "run.eval_every=0",
        f"run.seed={seed}", "optim.lr=5e-4", "sampling.n_prompts=32", "sampling.group_size=8",
        f"sampling.max_tokens={MAX_TOKENS}"])
    after = sampled(resolve_model_dir(RUNS / f"reflection-rl-s{seed}"), task, 1000 + seed)
    print(f"seed {seed} trained:", after, flush=True)
    steps, rate = series(rs, "text/reflection_rate")
    _, reward = series(rs, "accuracy")
    return {"planted_targets": planted, "base": before, "trained": after,
            "curve": {"step": steps, "reflection_rate": rate, "accuracy": reward}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--reflect-share", type=float, default=0.25)
    ap.add_argument("--num-eval", type=int, default=100)
    a = parse_args(ap, argv, partial=lambda a: "--steps < 60" if a.steps < 60 else None)
    header = setup()
    seeds = [int(x) for x in a.seeds.split(",")]
    runs = {str(seed): one_seed(a, seed) for seed in seeds}
    result = {"settings": {"steps": a.steps, "sft_steps": a.sft_steps, "seeds": seeds,
                           "reflect_share": a.reflect_share, "sft_examples": 800, "num_eval": a.num_eval},
              "runs": runs}

    def plot(path):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        for i, (seed, r) in enumerate(runs.items()):
            c = f"C{i}"
            ax.plot(r["curve"]["step"], r["curve"]["reflection_rate"], c=c, label=f"seed {seed}: reflection rate")
            ax.plot(r["curve"]["step"], r["curve"]["accuracy"], c=c, ls=":", label=f"seed {seed}: accuracy")
        ax.axhline(a.reflect_share, ls="--", c="grey", lw=0.8, label="share planted in the SFT data")
        ax.set_xlabel("GRPO step (training samples, T=1)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    finish("reflection", header, result, plot, results=a.results)


if __name__ == "__main__":
    main()
