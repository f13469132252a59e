"""Study: per-response length averaging (GRPO) vs a constant normalizer (Dr. GRPO): do wrong answers ramble?

    python benchmarks/studies/length_normalization.py [--steps 40] [--seeds 0] [--max-tokens 48] [--add]

The claim (source documents, Dr. GRPO): GRPO's 1/|o_i| gives each token of a long response a smaller
coefficient, so a long WRONG response is penalized less per token than a short one: the model learns
to keep talking when it is wrong (incorrect responses grow longer), while correct ones are pushed
shorter. A constant normalizer (Dr. GRPO: max response length) removes that dependence.

The task gives a wrong answer room to ramble: step-by-step sums with a scratchpad ("3+5+7=" ->
"hmm\\nhmm\\n3+5=08\\n08+7=15", rlvr's sum_steps task, three or four single-digit terms mixed,
outcome reward = the result on the last line). The SFT targets open with 0-4 filler lines "hmm"
(uniform), which the reward ignores: lengths vary within a group, and a response can grow without
changing its answer. sampling.max_tokens = 48, while a response needs 15 or 22 tokens plus 4 per
filler line (+ EOS): extra lines, wrong lines and unfinished lines are all possible. One SFT warm start
per seed (until 30% greedy accuracy on a validation slice), then two `rlvr train` runs from it:

  grpo     the grpo recipe (std-normalized advantage, seq_mean_token_mean: 1/|o_i|), KL off
  dr_grpo  the dr_grpo recipe (group-mean advantage, seq_mean_token_sum_norm with the constant
           sampling.max_tokens), KL off

both with lr 5e-4, 32 prompts x 8 samples. Per step: mean length of correct and of incorrect sampled
responses (len/correct, len/incorrect), the share cut at max_tokens, sampled accuracy; held-out
greedy accuracy every 10 steps.
"""

from __future__ import annotations

import argparse
import random

ARMS = ("grpo", "dr_grpo")


FILLER = "hmm"
MAX_FILLER = 4


def scratchpad_task(seed: int = 0, n_train: tuple[int, int] = (800, 2200), n_eval: int = 200):
    """TaskData: sum_steps problems with 3 and 4 single-digit terms (n_train of each; 886 distinct
    training problems with three terms exist), shuffled together; n_eval held-out, half each. The SFT
    target starts with 0..MAX_FILLER lines "hmm" (uniform, drawn anew each time a target is made)
    before the steps: the reward ignores them (it reads the last line), so a response's length varies
    within a group for reasons unrelated to its correctness, and the model can write more of them."""
    from rlvr.data import get_task
    from rlvr.rewards import get_reward_fn
    from rlvr.train.tasks import TaskData

    t = get_task("sum_steps")
    train = [e for k, n in zip((3, 4), n_train, strict=True) for e in t.generate(n, "train", seed, operands=k)]
    held = [e for k in (3, 4) for e in t.generate(n_eval // 2, "test", seed, operands=k)]
    rng = random.Random(seed)
    rng.shuffle(train)
    rng.shuffle(held)
    fill = random.Random(seed + 1)

    def target(e) -> str:
        return (FILLER + "\n") * fill.randint(0, MAX_FILLER) + t.target(e)

    return TaskData("scratchpad_sums", train, held, lambda e: e.question, get_reward_fn("sum_steps"), target)


def length_gap(rows: list[dict], first: int = 10, last: int = 10) -> dict:
    """Mean len/incorrect - len/correct (and each) over the first and the last `first`/`last` steps
    that logged both; the change of the gap says whether wrong answers grew longer than right ones."""
    both = [r for r in rows if r.get("len/correct") is not None and r.get("len/incorrect") is not None]
    if not both:
        raise ValueError("no step logged both len/correct and len/incorrect")

    def avg(rs, key):
        return sum(r[key] for r in rs) / len(rs)

    a, b = both[:first], both[-last:]
    out = {}
    for name, rs in (("first", a), ("last", b)):
        out[name] = {"correct": avg(rs, "len/correct"), "incorrect": avg(rs, "len/incorrect"),
                     "gap": avg(rs, "len/incorrect") - avg(rs, "len/correct"),
                     "truncated": avg(rs, "len/truncated_frac") if all("len/truncated_frac" in r for r in rs) else None}
    out["gap_change"] = out["last"]["gap"] - out["first"]["gap"]
    out["incorrect_change"] = out["last"]["incorrect"] - out["first"]["incorrect"]
    out["correct_change"] = out["last"]["correct"] - out["first"]["correct"]
    return out


def run(steps: int, seeds: list[int], max_tokens: int) -> dict:
    from _common import held_out_accuracy, rl_run, series, sft_checkpoint, with_splits

    out: dict = {}
    for seed in seeds:
        sft_task, rl_task = with_splits(scratchpad_task(seed), 1500, 200)
        model_dir = sft_checkpoint("scratchpad-filler", sft_task, [
            "sampling.max_tokens=48", "run.eval_every=25", "optim.schedule=constant", "data.num_eval=200"],
            seed=seed, steps=600, stop_at_accuracy=0.3)
        out[str(seed)] = {}
        start = held_out_accuracy(model_dir, rl_task, max_tokens)
        for arm in ARMS:
            rs = rl_run(f"len-{arm}-s{seed}", model_dir, rl_task, [
                f"run.steps={steps}", "run.eval_every=10", f"run.seed={seed}", "optim.lr=5e-4",
                "sampling.n_prompts=32", "sampling.group_size=8", f"sampling.max_tokens={max_tokens}",
                "data.num_eval=200"], recipe=arm)
            rec = {k: series(rs, k)[1] for k in ("len/correct", "len/incorrect", "len/mean", "accuracy",
                                                  "len/truncated_frac")}
            rec["steps"] = series(rs, "len/mean")[0]
            rec["eval_steps"], rec["eval_accuracy"] = series(rs, "eval/accuracy")
            rec["eval_steps"].insert(0, 0)
            rec["eval_accuracy"].insert(0, start)
            _, rec["eval_len"] = series(rs, "eval/len/mean")
            rec["summary"] = length_gap(rs)
            out[str(seed)][arm] = rec
    return {"max_tokens": max_tokens, "steps": steps, "runs": out}


def markdown(res: dict) -> str:
    lines = ["Mean response length in tokens of the sampled responses, first 10 vs last 10 steps "
             f"(max_tokens {res['max_tokens']}); held-out greedy accuracy step 0 -> last:", "",
             "| seed | arm | correct: first -> last | incorrect: first -> last | gap (incorrect - correct): "
             "first -> last | cut at max_tokens, last | held-out accuracy |", "|---|---|---|---|---|---|---|"]
    for seed, arms in res["runs"].items():
        for arm, r in arms.items():
            s = r["summary"]
            tr = s["last"]["truncated"]
            lines.append(f"| {seed} | {arm} | {s['first']['correct']:.1f} -> {s['last']['correct']:.1f} | "
                         f"{s['first']['incorrect']:.1f} -> {s['last']['incorrect']:.1f} | "
                         f"{s['first']['gap']:+.1f} -> {s['last']['gap']:+.1f} | "
                         f"{'-' if tr is None else f'{tr:.1%}'} | "
                         f"{r['eval_accuracy'][0]:.3f} -> {r['eval_accuracy'][-1]:.3f} |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, arm in zip(axes, ARMS, strict=True):
        for s_i, arms in enumerate(res["runs"].values()):
            r = arms[arm]
            alpha = 1.0 if s_i == 0 else 0.45
            lab = (lambda x: x) if s_i == 0 else (lambda x: None)
            ax.plot(r["steps"][: len(r["len/correct"])], r["len/correct"], color="C2", alpha=alpha,
                    label=lab("correct"))
            ax.plot(r["steps"][: len(r["len/incorrect"])], r["len/incorrect"], color="C3", alpha=alpha,
                    label=lab("incorrect"))
        ax.set_title(f"{arm}: mean length of sampled responses", fontsize=10)
        ax.set_xlabel("step (32 prompts x 8)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--add", action="store_true",
                    help="keep the seeds already in the output directory's length_normalization.json (same settings)")
    from _common import finish, merge_previous, parse_args, setup

    a = parse_args(ap, argv)

    header = setup()
    res = run(a.steps, [int(s) for s in a.seeds.split(",")], a.max_tokens)
    if a.add:
        res = merge_previous("length_normalization", res, header, ("steps", "max_tokens"), results=a.results)
    md = markdown(res)
    print(md)
    finish("length_normalization", header, {**res, "table": md}, lambda p: plot(res, p), results=a.results)


if __name__ == "__main__":
    main()
