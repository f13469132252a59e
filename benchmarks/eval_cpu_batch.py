"""CPU evaluation with long prompts: prompts per generate call fixed vs sized by tokens.

    .venv/bin/python benchmarks/eval_cpu_batch.py                       # MATH-500 under r1_zero, 128 problems
    .venv/bin/python benchmarks/eval_cpu_batch.py --num 64 --max-tokens 64

The workload is `rlvr eval`'s on CPU: a fresh tiny model (character tokenizer, so a MATH-500 prompt under the
r1_zero template is 400-1200 tokens), greedy, the first --num problems of MATH-500, one thread. Policies:

  batch B   B prompts per generate call (sampling.batch_size=B; the default was 256)
  tokens T  rlvr.eval.token_chunks: consecutive prompts while rows x (longest prompt + max_tokens) <= T
            (the CPU default, rlvr.eval.CPU_EVAL_TOKENS)

Time = generation and scoring of one evaluate() call, after one warm-up call on 8 problems. Writes
benchmarks/results/eval_cpu_batch.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from rlvr.rollout.types import SamplingSpec

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DATA = ROOT.parent / "shared" / "data" / "math500" / "test.jsonl"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--batches", type=int, nargs="*", default=[256, 64, 32, 16, 8, 4])
    ap.add_argument("--budgets", type=int, nargs="*", default=[8192, 16384, 32768])
    ap.add_argument("--results-dir", type=Path, default=RESULTS, help="where eval_cpu_batch.{json,md} go")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(int(os.environ.get("RLVR_NUM_THREADS", "1")))
    from rlvr.config import load_config
    from rlvr.eval import CPU_EVAL_TOKENS, evaluate, token_chunks
    from rlvr.models.positions import prompt_lengths
    from rlvr.rollout import HFGenerator
    from rlvr.train.config import EvalConfig
    from rlvr.train.policy import policy_from_config
    from rlvr.train.tasks import eval_examples, load_task_data, task_scorer

    cfg = load_config(EvalConfig, None, ["data.task=math", f"data.eval_path={args.data}", "data.template=r1_zero",
                                         f"data.num_eval={args.num}", f"sampling.max_tokens={args.max_tokens}"])
    model, tok = policy_from_config(cfg.model)
    model.eval()
    task = load_task_data(cfg.data, tok, train=False)
    examples = eval_examples(task, cfg.data.num_eval)
    prompts = [task.prompt(ex) for ex in examples]
    lengths = prompt_lengths(tok, prompts)
    spec = SamplingSpec.for_task(task, cfg.sampling, seed=0, logprobs=False)
    scorer = task_scorer(task, cfg.data)
    gen = HFGenerator(model, tok, batch_size=max(args.batches))

    def run(chunks) -> float:
        t0 = time.perf_counter()
        evaluate(gen, examples, prompts, None, spec, scorer=scorer, chunks=chunks)
        return time.perf_counter() - t0

    evaluate(gen, examples[:8], prompts[:8], None, spec, scorer=scorer)  # warm-up
    rows = []
    for b in args.batches:
        chunks = [min(b, len(prompts) - s) for s in range(0, len(prompts), b)]
        rows.append({"policy": f"batch {b}", "calls": len(chunks), "seconds": run(chunks)})
        print(rows[-1], flush=True)
    for t in sorted(set(args.budgets) | {CPU_EVAL_TOKENS}):
        chunks = token_chunks(lengths, n=1, max_tokens=args.max_tokens, budget=t, max_prompts=256)
        label = f"tokens {t}" + (" (default)" if t == CPU_EVAL_TOKENS else "")
        rows.append({"policy": label, "calls": len(chunks), "seconds": run(chunks)})
        print(rows[-1], flush=True)

    info = {"problems": len(prompts), "prompt_tokens": {"min": min(lengths), "max": max(lengths),
            "mean": sum(lengths) / len(lengths)}, "max_tokens": args.max_tokens, "threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "load_1min": os.getloadavg()[0]}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "eval_cpu_batch.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    fastest = min(r["seconds"] for r in rows)
    md = ["# CPU evaluation: prompts per generate call fixed vs sized by tokens", "",
          f"`benchmarks/eval_cpu_batch.py`: tiny model, MATH-500 under r1_zero, first {info['problems']} problems "
          f"(prompt {info['prompt_tokens']['min']}-{info['prompt_tokens']['max']} tokens, mean "
          f"{info['prompt_tokens']['mean']:.0f}), greedy, max_tokens={args.max_tokens}, {info['threads']} thread, "
          f"torch {info['torch']}, {info['cpus']} CPUs shared (1-min load {info['load_1min']:.1f} at the end).", "",
          "| policy | generate calls | seconds | x fastest |", "|---|---:|---:|---:|"]
    md += [f"| {r['policy']} | {r['calls']} | {r['seconds']:.1f} | {r['seconds'] / fastest:.1f} |" for r in rows]
    (args.results_dir / "eval_cpu_batch.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
