"""The training forward + backward on long responses: shared prefix (each cascade branch) vs every row whole.

    .venv/bin/python benchmarks/long_responses.py                    # widths 256, responses 128/512/1024
    .venv/bin/python benchmarks/long_responses.py --resp 64 256 --groups 2

The workload is one micro-batch of the GRPO learner: --groups prompts of --prompt tokens, each with 8
responses of random lengths in [resp/2, resp], a randomly initialized Qwen2 of --width (2 layers, 4 heads,
2 KV heads), log-probabilities and entropy of every response token, backward of their sum. Variants:

  plain    algo.shared_prefix=false: every row forwarded whole through transformers' sdpa attention
  split    shared prefix, the cascade's split softmax over [prefix keys, own keys] (matmuls; what the
           default did before long suffixes went to a fused SDPA)
  default  shared prefix as shipped: stacked attention for few own keys, one fused SDPA per row over
           [gathered prefix keys, own keys] from rlvr.models.cascade._ROWS_SDPA_FROM new tokens on

Each variant runs in a fresh subprocess: time = median of --reps calls after one warm-up; extra peak =
the child's peak RSS after the calls minus its RSS before the first call (model and batch built). Writes
benchmarks/results/long_responses.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = ("plain", "split", "default")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def child(variant: str, width: int, groups: int, prompt: int, resp: int, reps: int) -> dict:
    import random

    import torch

    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(int(os.environ.get("RLVR_NUM_THREADS", "1")))
    import rlvr.models.cascade as cas
    from rlvr.models.prefix import score_rows
    from rlvr.models.tiny import build_tiny_model
    from rlvr.models.tokenize import build_training_batch

    model, _ = build_tiny_model(hidden_size=width, num_layers=2, num_heads=4, num_kv_heads=2, arch="qwen2", seed=0)
    model.train()
    rng = random.Random(0)
    P, R = [], []
    for _ in range(groups):
        p = [rng.randrange(4, 90) for _ in range(prompt)]
        for _ in range(8):
            P.append(p)
            R.append([rng.randrange(4, 90) for _ in range(rng.randint(max(1, resp // 2), resp))])
    b = build_training_batch(P, R, 0)
    if variant == "split":
        cas._STACK_OWN, cas._ROWS_SDPA_FROM = 0, 10**9

    def run() -> float:
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        out = score_rows(model, b.input_ids, b.labels, b.attention_mask, b.response_mask,
                         shared_prefix=variant != "plain", with_entropy=True)
        (out.logprobs.sum() + out.entropy.sum()).backward()
        return time.perf_counter() - t

    base = _rss_mb()
    times = [run() for _ in range(reps + 1)][1:]
    tokens = int(b.attention_mask.sum())
    return {"variant": variant, "seconds": statistics.median(times), "extra_peak_mb": _rss_mb() - base,
            "tokens": tokens, "rows": len(P)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--resp", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    if a.child:
        v, *nums = a.child
        print(json.dumps(child(v, *map(int, nums))))
        return 0
    rows = []
    for resp in a.resp:
        for v in VARIANTS:
            cmd = [sys.executable, __file__, "--child", v, str(a.width), str(a.groups), str(a.prompt), str(resp),
                   str(a.reps)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1]) | {"resp": resp}
            rows.append(r)
            print(f"responses <= {resp:5d}  {v:8s} {r['seconds']:7.3f} s  extra peak {r['extra_peak_mb']:7.0f} MB  "
                  f"({r['rows']} rows, {r['tokens']} tokens)", flush=True)
    lines = ["# Training forward + backward on long responses: shared prefix vs every row whole", "",
             f"Written by `benchmarks/long_responses.py` (see its docstring). Qwen2 width {a.width}, 2 layers, 4 heads "
             f"(2 KV heads), {a.groups} prompts of {a.prompt} tokens x 8 responses of [L/2, L] tokens, one micro-batch; "
             f"median of {a.reps} calls; {platform.machine()}, {os.cpu_count()} cores, "
             f"{os.environ.get('RLVR_NUM_THREADS', '1')} torch thread(s); "
             f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC.", "",
             "| responses <= L | " + " | ".join(f"{v} s / extra peak MB" for v in VARIANTS) + " |",
             "|---|" + "---|" * len(VARIANTS)]
    for resp in a.resp:
        cells = [f"{r['seconds']:.3f} / {r['extra_peak_mb']:.0f}" for v in VARIANTS for r in rows
                 if r["resp"] == resp and r["variant"] == v]
        lines.append(f"| {resp} | " + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    print(md)
    if not a.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "long_responses.json").write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))
        (RESULTS / "long_responses.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
