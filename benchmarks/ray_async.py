"""Synchronous vs asynchronous (max_staleness=1) vs partial rollouts under the Ray placement:
tiny model on CPU, 2 generator actors + the learner (driver), long-tailed response lengths.

    RLVR_NUM_THREADS=1 .venv/bin/python benchmarks/ray_async.py [--steps 8] [--repeats 2]

Long tail: a random tiny model on the digits task stops at any of a few characters
(sampling.stop), so response lengths are roughly geometric (mean ~10 tokens) up to
sampling.max_tokens=48. Per mode and role, over the steps after the first (warm-up):
- step time: wall seconds per training step (between the ends of consecutive steps);
- learner busy = time/train (old/ref logprobs + backward + optimizer), idle = step - busy
  (the learner waits for rollouts and scores);
- generator busy = time/busy_generator / 2 (seconds each actor spent in generate or loading
  weights), idle = step - busy;
- scorer busy = time/busy_scorer.
Modes run interleaved (sync, async, partial, sync, ...) in one Ray cluster so machine load hits
each alike; the median over repeats is reported. Writes benchmarks/results/ray_async.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
BASE = [
    "model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.intermediate_size=128",
    "data.num_train=400", "data.num_eval=4", "data.digits=2", "data.reward=language",
    "sampling.n_prompts=8", "sampling.group_size=4", "sampling.max_tokens=48",
    'sampling.stop=["0","1","2","3","4","5","6","7","8","9"]',
    "algo.train_batch_size=16", "optim.lr=1e-3", "run.progress=false", "run.num_threads=1",
    "run.log_samples_every=0", "run.eval_every=0",
    "distributed.placement=ray", "distributed.num_generators=2", "distributed.generator_cpus=0.5",
    "distributed.scorer_cpus=0.5", "rollout.batch_size=16",
]
MODES = {
    "sync": [],
    "max_staleness=1": ["distributed.max_staleness=1"],
    "partial (segment 8)": ["distributed.segment_tokens=8"],
}


def run_mode(extra: list[str], steps: int, seed: int) -> dict:
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import train
    from rlvr.train.pg.recipes import get_recipe

    rows: list[dict] = []

    def on_step(step: int, m: dict) -> None:
        rows.append(dict(m) | {"_t": time.perf_counter()})

    with tempfile.TemporaryDirectory() as d:
        cfg = load_config(TrainConfig, None, [*BASE, *extra, f"run.steps={steps}", f"run.seed={seed}",
                                              f"run.out_dir={d}/run"], base=get_recipe("grpo"))
        train(cfg, on_step=on_step)
    # step 1 warms up (actor start, first forward); a step's time is the wall time between the ends of
    # consecutive steps (everything the driver does, logging included)
    step = (rows[-1]["_t"] - rows[0]["_t"]) / (len(rows) - 1)
    rows = rows[1:]
    mean = lambda k: statistics.fmean(r.get(k, 0.0) for r in rows)  # noqa: E731
    gen = mean("time/busy_generator") / 2
    learn = mean("time/train")
    return {"step_s": step, "learner_busy_s": learn, "learner_idle_s": step - learn, "generator_busy_s": gen,
            "generator_idle_s": step - gen, "scorer_busy_s": mean("time/busy_scorer"),
            "len_mean": mean("len/mean"), "truncated_frac": mean("len/truncated_frac"),
            "staleness_mean": mean("rollout/staleness"), "dropped": sum(r.get("async/dropped_rollouts", 0) for r in rows),
            "rollouts_per_step": statistics.fmean(r["tokens/generated"] / r["len/mean"] for r in rows)}


def main() -> None:
    import ray

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    args = ap.parse_args()
    if args.render:
        render(json.loads((RESULTS / "ray_async.json").read_text()))
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    per_mode: dict[str, list[dict]] = {m: [] for m in MODES}
    t0 = time.time()
    for rep in range(args.repeats):
        for name, extra in MODES.items():
            per_mode[name].append(run_mode(extra, args.steps, seed=rep))
            print(f"repeat {rep} {name}: {per_mode[name][-1]}", flush=True)
    ray.shutdown()
    table = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in per_mode.items()}
    out = {"steps": args.steps, "repeats": args.repeats, "machine": platform.processor() or platform.machine(),
           "note": "2-core machine shared with other jobs (loaded); 2 generator actors (0.5 CPU each), scorer "
                   "actor, learner in the driver; medians over repeats, steps after the first",
           "wall_s": time.time() - t0, "modes": table, "runs": per_mode}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ray_async.json").write_text(json.dumps(out, indent=2))
    render(out)


def render(out: dict) -> None:
    table = out["modes"]
    lines = ["| mode | step s | learner busy / idle s | generator busy / idle s (per actor) | scorer busy s | "
             "mean len | rollouts/step | rollouts/s | staleness | dropped |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m, r in table.items():
        lines.append(f"| {m} | {r['step_s']:.3f} | {r['learner_busy_s']:.3f} / {r['learner_idle_s']:.3f} | "
                     f"{r['generator_busy_s']:.3f} / {r['generator_idle_s']:.3f} | {r['scorer_busy_s']:.4f} | "
                     f"{r['len_mean']:.1f} | {r['rollouts_per_step']:.0f} | {r['rollouts_per_step'] / r['step_s']:.0f} | "
                     f"{r['staleness_mean']:.2f} | {r['dropped']:.0f} |")
    md = "\n".join(lines) + "\n"
    (RESULTS / "ray_async.md").write_text(f"# benchmarks/ray_async.py ({out['steps']} steps x {out['repeats']} "
                                          f"repeats, loaded 2-core machine)\n\n{md}")
    print(md)


if __name__ == "__main__":
    main()
