"""Scoring while generating (data.score_while_generating) against scoring after generation, on the CPU: the hf
sampler's plain loop with responses that end at different steps (EOS made likely, as a trained model's answers
do), and a reward that waits `--reward-ms` per response outside the GIL (what a code sandbox's subprocess, a model
judge's HTTP call or reward_isolate's worker process cost the calling thread).

    RLVR_NUM_THREADS=1 .venv/bin/python benchmarks/score_overlap.py [--rounds 3] [--reward-ms 4]

The same rollouts and rewards on both sides (checked); reported per side: generate s, the wait for rewards after
it (time/score), the scoring hidden inside generation, and generate + score; medians of interleaved rounds after a
warm-up. Writes benchmarks/results/score_overlap.{md,json} (or --results-dir).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from rlvr.models import build_tiny_model
from rlvr.rewards.types import Reward
from rlvr.rollout import HFGenerator, SamplingSpec
from rlvr.runtime import set_num_threads
from rlvr.train.pg.rollout_source import ScoreWhileGenerating

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reward-ms", type=float, default=4.0, help="each reward call's wait outside the GIL")
    ap.add_argument("--eos-bias", type=float, default=2.0, help="added to EOS's logit: responses end at spread steps")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    threads = set_num_threads(a.threads if a.threads is not None else 1)
    model, tok = build_tiny_model(hidden_size=64, num_layers=2, num_heads=4, seed=0)
    eos = tok.eos_token_id
    model.lm_head.register_forward_hook(lambda _m, _i, out: out + a.eos_bias * (torch.arange(out.shape[-1]) == eos))
    prompts = [f"{i} + {2 * i + 1} = " for i in range(a.prompts)]
    spec = SamplingSpec(n=a.group_size, max_tokens=a.max_tokens, seed=5)
    gen = HFGenerator(model, tok, batch_size=a.prompts * a.group_size)

    def reward(rollouts, examples):
        out = []
        for ro, ex in zip(rollouts, examples, strict=True):
            time.sleep(a.reward_ms / 1e3)  # the wait: a subprocess, a request, a worker process
            out.append(Reward(float(len(ro.response_ids) % 2 == ex % 2), {}))
        return out

    batch = list(range(a.prompts))

    def after():
        t0 = time.perf_counter()
        ros = gen.generate(prompts, spec)
        t1 = time.perf_counter()
        rws = reward(ros, [batch[r.group] for r in ros])
        return ros, rws, t1 - t0, time.perf_counter() - t1, 0.0

    def during():
        sw = ScoreWhileGenerating(reward, batch)
        t0 = time.perf_counter()
        ros = gen.generate(prompts, spec, on_finished=sw.add)
        t1 = time.perf_counter()
        rws = sw.result(ros)
        return ros, rws, t1 - t0, time.perf_counter() - t1, sw.overlapped_s

    sides = {"score after generation": after, "score while generating": during}
    runs = {k: [] for k in sides}
    ref = None
    for rnd in range(a.rounds + 1):  # the first round warms up
        for name, fn in sides.items():
            ros, rws, g, s, hidden = fn()
            got = ([r.response_ids for r in ros], [r.total for r in rws])
            ref = ref or got
            if got != ref:
                raise SystemExit(f"score_overlap.py: {name} gave other rollouts or rewards")
            if rnd:
                runs[name].append((g, s, hidden))
    lengths = [len(r) for r in ref[0]]
    table = []
    for name, rs in runs.items():
        g, s, h = (statistics.median(x[k] for x in rs) for k in range(3))
        table.append({"side": name, "generate_s": g, "score_s": s, "hidden_s": h, "total_s": g + s})
    where = f"CPU ({platform.machine()}, {threads} thread(s))"
    lines = ["# Scoring while generating (benchmarks/score_overlap.py)", "",
             f"{len(lengths)} responses ({a.prompts} prompts x {a.group_size}), lengths {min(lengths)}-{max(lengths)} "
             f"tokens (median {statistics.median(lengths):.0f}) of up to {a.max_tokens}, a reward waiting "
             f"{a.reward_ms:g} ms per response outside the GIL, {where}, median of {a.rounds} interleaved rounds. "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
             "| side | generate s | score s (after) | scoring hidden s | generate + score s |",
             "|---|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['side']} | {r['generate_s']:.3f} | {r['score_s']:.3f} | {r['hidden_s']:.3f} | "
                     f"{r['total_s']:.3f} |")
    lines += ["", f"Same rollouts and rewards on both sides: yes. generate + score: "
              f"{table[0]['total_s'] / table[1]['total_s']:.2f}x faster scoring while generating."]
    text = "\n".join(lines) + "\n"
    print(text)
    a.results_dir.mkdir(parents=True, exist_ok=True)
    (a.results_dir / "score_overlap.md").write_text(text)
    result = {"device": where, "rows": table, "lengths": lengths, "args": {k: str(v) for k, v in vars(a).items()}}
    (a.results_dir / "score_overlap.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
