"""Study: accuracy vs thinking budget for a model trained to think: forced answer vs cut.

    python benchmarks/studies/thinking_budget.py [--budgets 0,2,4,6,8,10,12,14,16,18,20,24,28] [--seed 0]

The claim (source documents, Qwen3): a thinking budget ends the reasoning at B tokens by appending a
stop-thinking text that forces an answer; accuracy degrades gracefully as the budget shrinks ("even
when reasoning is cut off mid-thought, the answers stay reasonable"), and even small budgets beat
answering without thinking. The second document adds that controllability "does not specify the
accuracy at a given budget": that is what is measured here.

The model is trained to think: the tiny model of the demo, SFT on sums of three single digits written
as a think block then the answer ("3+5+7=<think>" -> "\\n3+5=08\\n08+7=15\\n</think>\\n\\n15", 24
reasoning tokens including the closing tag), until 50% greedy accuracy on a validation slice of 100
training problems it was not trained on (at most 600 steps). Then, greedy, on the 100 held-out problems
of the task's test split, for each budget B:

  forced  rlvr's thinking budget (sampling.thinking_budget = B, rlvr.rollout.thinking): at most B
          reasoning tokens, then the stop-thinking text "\\n</think>\\n\\n" is forced (B = 0: an empty
          think block in the prompt, Qwen3's non-thinking mode) and up to 8 answer tokens are sampled;
  cut     the same cap on sampled tokens, B + 8, with nothing forced: a response whose reasoning does
          not fit has no answer.

Two models: "think" (SFT on full reasoning only) and "think_fused" (half the SFT targets cut at a
uniform point of the reasoning and followed by the stop-thinking text and the answer, as Qwen3's
thinking-mode fusion stage trains the model for the forced answer).

Accuracy = the number after the last "</think>" equals the sum (no "</think>": no answer, 0).
"""

from __future__ import annotations

import argparse
import random
import re

STOP_THINKING = "\n</think>\n\n"
ANSWER_TOKENS = 8


def think_target(question: str) -> str:
    """The reasoning + answer of a sum "a+b+c+d=": one zero-padded step per line in a think block."""
    from rlvr.data.tasks.steps import worked_steps

    terms = [int(t) for t in question.rstrip("=").split("+")]
    lines, total = worked_steps(terms, ["+"] * (len(terms) - 1), width=2)
    return "\n" + "\n".join(lines) + "\n</think>\n\n" + str(total)


def answer_after_think(text: str) -> str | None:
    """The integer after the last "</think>" (None without a closed think block or a number)."""
    if "</think>" not in text:
        return None
    m = re.search(r"-?\d+", text.rsplit("</think>", 1)[1])
    return m.group(0) if m else None


def think_reward(response: str, example):
    from rlvr.rewards.types import Reward, Status

    ans = answer_after_think(response)
    if ans is None:
        return Reward(0.0, {"answer": 0.0}, Status.UNPARSABLE, "no answer after </think>")
    ok = int(ans) == int(example.reference)
    return Reward(float(ok), {"answer": float(ok)}, Status.CORRECT if ok else Status.INCORRECT, answer=ans)


def fused_target(question: str, rng: random.Random) -> str:
    """Qwen3-style thinking-mode fusion data: half the time the full reasoning; otherwise the reasoning
    cut after a uniform number b of its characters (= tokens, character tokenizer) before its closing tag,
    then STOP_THINKING and the answer (b = 0: the empty think block of a budget of 0)."""
    full = think_target(question)
    if rng.random() < 0.5:
        return full
    reasoning, answer = full.split("</think>\n\n")
    b = rng.randrange(len(reasoning))
    if b == 0:
        return "\n\n</think>\n\n" + answer
    return reasoning[:b] + STOP_THINKING + answer


def think_task(seed: int = 0, n_train: int = 880, n_eval: int = 100, fused: bool = False):
    from rlvr.data import get_task
    from rlvr.train.tasks import TaskData

    t = get_task("arithmetic")
    train = t.generate(n_train, "train", seed, digits=1, operands=3)
    held = t.generate(n_eval, "test", seed, digits=1, operands=3)
    random.Random(seed).shuffle(train)
    rng = random.Random(seed + 1)
    target = (lambda e: fused_target(e.question, rng)) if fused else (lambda e: think_target(e.question))
    return TaskData("think_sums", train, held, lambda e: e.question + "<think>", think_reward, target)


def accuracy_at_budget(generator, task, examples, budget: int, mode: str) -> dict:
    """Greedy accuracy, share with an answer after "</think>", share with a closed think block and mean
    sampled tokens (forced ones not counted) at one budget and mode."""
    from rlvr.rollout import SamplingSpec, with_thinking_budget

    prompts = [task.prompt(e) for e in examples]
    if mode == "forced":
        spec = SamplingSpec(n=1, temperature=0.0, max_tokens=ANSWER_TOKENS, seed=0, logprobs=False)
        ros = with_thinking_budget(generator, budget, STOP_THINKING).generate(prompts, spec)
    elif mode == "cut":
        spec = SamplingSpec(n=1, temperature=0.0, max_tokens=budget + ANSWER_TOKENS, seed=0, logprobs=False)
        ros = generator.generate(prompts, spec)
    else:
        raise ValueError(f"mode must be 'forced' or 'cut', got {mode!r}")
    correct = answered = closed = sampled = 0
    for ro, ex, p in zip(ros, examples, prompts, strict=True):
        # budget 0 (forced) puts the empty think block in the prompt: judge prompt suffix + response
        full = ro.prompt[len(p):] + ro.text
        r = think_reward(full, ex)
        correct += r.total == 1.0
        answered += answer_after_think(full) is not None
        closed += "</think>" in full
        sampled += sum(ro.loss_mask) if ro.loss_mask is not None else len(ro.response_ids)
    n = len(examples)
    return {"accuracy": correct / n, "answered": answered / n, "closed": closed / n, "sampled_tokens": sampled / n}


MODELS = {"think": "SFT on full reasoning", "think_fused": "SFT half on full reasoning, half on budget-cut "
          "reasoning + stop-thinking text + answer (Qwen3's thinking-mode fusion)"}


def run(budgets: list[int], seed: int) -> dict:
    from _common import sft_checkpoint, with_splits

    from rlvr.config import load_config
    from rlvr.models import load_policy
    from rlvr.rollout import build_generator
    from rlvr.train.config import TrainConfig

    cfg = load_config(TrainConfig, None, [])
    out: dict = {"seed": seed, "models": {}}
    for name in MODELS:
        sft_task, task = with_splits(think_task(seed, fused=name == "think_fused"), 780, 100)
        model_dir = sft_checkpoint(name, sft_task, [
            "sampling.max_tokens=40", "run.eval_every=50", "optim.schedule=constant", "data.num_eval=100"],
            seed=seed, steps=600, stop_at_accuracy=0.5)
        model, tok = load_policy(model_dir)
        gen = build_generator(cfg.rollout, model, tok, default_batch_size=256)
        model.eval()
        examples = list(task.eval)
        rows = []
        for b in budgets:
            for mode in ("forced", "cut"):
                m = accuracy_at_budget(gen, task, examples, b, mode)
                rows.append({"budget": b, "mode": mode, **m})
                print(f"{name} budget {b:3d} {mode:6s} accuracy {m['accuracy']:.3f} answered {m['answered']:.2f} "
                      f"tokens {m['sampled_tokens']:.1f}", flush=True)
        out["models"][name] = {"model_dir": str(model_dir), "rows": rows,
                               "unlimited": accuracy_at_budget(gen, task, examples, 1000, "cut")}
        out["full_reasoning_tokens"] = len(tok.encode(think_target("3+5+7=").split("</think>")[0] + "</think>",
                                                      add_special_tokens=False))
    return out


def markdown(res: dict) -> str:
    lines = [f"Held-out greedy accuracy, 100 problems (a full reasoning is {res['full_reasoning_tokens']} tokens "
             "including its closing tag); 'answered' = share with a number after </think>:", "",
             "| budget B | " + " | ".join(f"{n}: forced | {n}: cut" for n in res["models"]) + " |",
             "|---" * (1 + 2 * len(res["models"])) + "|"]
    budgets = sorted({r["budget"] for m in res["models"].values() for r in m["rows"]})
    for b in budgets:
        cells = []
        for m in res["models"].values():
            by = {r["mode"]: r for r in m["rows"] if r["budget"] == b}
            cells += [f"{by[k]['accuracy']:.2f} ({by[k]['answered']:.2f})" for k in ("forced", "cut")]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    lines.append("| unlimited | " + " | ".join(f"{m['unlimited']['accuracy']:.2f} | -" for m in res["models"].values())
                 + " |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(res["models"]), figsize=(6 * len(res["models"]), 4), sharey=True)
    for ax, (name, m) in zip(axes, res["models"].items(), strict=True):
        for i, mode in enumerate(("forced", "cut")):
            rr = [r for r in m["rows"] if r["mode"] == mode]
            ax.plot([r["budget"] for r in rr], [r["accuracy"] for r in rr], "o-", color=f"C{i}",
                    label="forced answer (stop-thinking text)" if mode == "forced" else "cut (no forced answer)")
        ax.axhline(m["unlimited"]["accuracy"], color="gray", ls=":", label="unlimited thinking")
        ax.axvline(res["full_reasoning_tokens"], color="gray", lw=0.8)
        ax.set_xlabel("thinking budget B, tokens")
        ax.set_title(f"{name}: {MODELS[name].split(' (')[0]}", fontsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("held-out greedy accuracy (sums of three digits)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="0,2,4,6,8,10,12,14,16,18,20,24,28")
    ap.add_argument("--seed", type=int, default=0)
    from _common import finish, parse_args, setup

    a = parse_args(ap, argv)

    header = setup()
    res = run([int(b) for b in a.budgets.split(",")], a.seed)
    md = markdown(res)
    print(md)
    finish("thinking_budget", header, {**res, "table": md}, lambda p: plot(res, p), results=a.results)


if __name__ == "__main__":
    main()
