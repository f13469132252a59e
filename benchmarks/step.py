"""Where the time of one GRPO step goes, against the machine's compute limit.

    .venv/bin/python benchmarks/step.py [--steps 20] [--warmup 3] [--threads 1] [--init-from DIR]
        [--label after] [--compare algo.shared_prefix=false]
        [--fresh --set model.hidden_size=512 --set model.intermediate_size=1024 --label h512]

The workload is the demo's GRPO phase (rlvr.train.demo: the tiny Qwen2 model, sums of four digits,
64 prompts x 8 samples, 4 new tokens, lr 5e-4, one optimizer step per rollout batch) started from
the demo's SFT checkpoint (--init-from; by default a fresh SFT warm-up as `rlvr demo` does, once,
cached under /tmp/rlvr-step-sft).

1. Time: `rlvr.train.pg.loop.train` runs --steps steps; every phase is timed inside the real loop by
   thin wrappers around the functions the loop calls: generate (the sampler), score (rewards,
   advantages), old/ref logprobs (batch_logprobs, the reference), forward (micro_batch_loss),
   backward (the rest of accumulate_gradients), optimizer (clip_and_step), and bookkeeping
   (everything else of time/step: batch building, metrics, logging, weight sync). Steady = the
   median over the steps after --warmup; the first step is reported apart.
2. FLOPs: one more step is replayed phase by phase under benchmarks/compute_limit.count_flops
   (torch's FlopCounterMode, with every counted op's shapes): generation, the no-grad logprob
   forwards, the training forward, the backward.
3. The limit: after every step, each phase's counted ops are replayed alone at their recorded shapes
   and strides (compute_limit.matmul_throughput, best of 3 short replays), so the limit is timed
   under the same machine load as the step; a phase's limit is its FLOPs at that throughput.
   "share of limit" = limit / measured time: 100% would mean nothing but matrix multiplies at the
   speed this machine runs them at these shapes.

--compare KEY=VALUE runs a second configuration (e.g. the slower path) interleaved with the first,
step for step in alternation, so machine load falls on both equally. Writes
benchmarks/results/step.json and step.md (--label names the run inside them; earlier labels are
kept, so "before" and "after" sit side by side).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.compute_limit import count_flops, limit_seconds, matmul_throughput  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PHASES = ("generate", "score", "old/ref logprobs", "forward", "backward", "optimizer", "bookkeeping")
SFT_CACHE = Path("/tmp/rlvr-step-sft")


# ------------------------------------------------------------------------------ the workload


def demo_setup(init_from: str | None, threads: int, steps: int, overrides: list[str], fresh: bool = False):
    """(TrainConfig, TaskData) of the demo's GRPO phase from an SFT checkpoint; fresh=True: from a
    randomly initialized model of the size the overrides give (model.hidden_size=...), no SFT."""
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.demo import DemoConfig, _configs, demo_task
    from rlvr.train.sft import train_sft

    cfg = DemoConfig(out_dir=str(SFT_CACHE), progress=False, num_threads=threads)
    sft_cfg, rl = _configs(cfg, Path(cfg.out_dir))
    task = demo_task(cfg)
    pool = list(task.train[cfg.sft_examples:])
    if fresh:
        init_from = ""
    elif init_from is None:
        init_from = str(SFT_CACHE / "sft")
        if not (Path(init_from) / "checkpoints" / "latest").exists():
            sft_task = type(task)(**{**task.__dict__, "train": list(task.train[: cfg.sft_examples]),
                                     "eval": pool[: cfg.num_eval]})
            print(f"SFT warm-up into {init_from} (once) ...", flush=True)
            train_sft(sft_cfg, data=sft_task, stop_at_accuracy=cfg.sft_target_accuracy)
    rl_task = type(task)(**{**task.__dict__, "train": pool})
    base = _flat(rl)
    base.update({"model.init_from": init_from, "run.steps": steps, "run.progress": False,
                 "run.log_samples_every": 0, "run.overwrite": True, "run.num_threads": threads,
                 "run.out_dir": "/tmp/rlvr-step-run", "run.eval_every": 0, "run.checkpoint_every": 0})
    rl = load_config(TrainConfig, None, [f"{k}={v}" for k, v in base.items()] + overrides)
    return rl, rl_task


def _flat(cfg) -> dict:
    import dataclasses

    out = {}
    for f in dataclasses.fields(cfg):
        sec = getattr(cfg, f.name)
        for g in dataclasses.fields(sec):
            v = getattr(sec, g.name)
            if isinstance(v, (int, float, str, bool)) and v != "":
                out[f"{f.name}.{g.name}"] = v
    return out


# ------------------------------------------------------------------------- phase timing


_ACTIVE: list = [None]  # the PhaseClock of the run now stepping (runs alternate, one at a time)


class PhaseClock:
    """Per-run phase times. `install()` wraps, once for the process, the functions the training
    loop calls; each call's wall time goes to the active clock's phase."""

    _undo: list = []

    def __init__(self):
        self.spent: dict[str, float] = {}

    @staticmethod
    def wrap(owner, name: str, phase: str) -> None:
        fn = getattr(owner, name)

        def wrapped(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                clock = _ACTIVE[0]
                if clock is not None:
                    clock.spent[phase] = clock.spent.get(phase, 0.0) + time.perf_counter() - t

        setattr(owner, name, wrapped)
        PhaseClock._undo.append((owner, name, fn))

    # (module, name, phase): each name where the loop looks it up when it calls it. batch_logprobs in the
    # objective (every no-grad logprob forward: the old policy's, the reference's, the behaviour policy's, via
    # forward_logprobs); accumulate_gradients and clip_and_step in the loop, which picks them when it builds a run's
    # learner (tests/benchmarks/test_step_bench.py: each wrapped name is what a run calls)
    WRAPS = (("rlvr.train.pg.objective", "batch_logprobs", "old/ref logprobs"),
             ("rlvr.train.pg.objective", "micro_batch_loss", "forward"),
             ("rlvr.train.pg.loop", "accumulate_gradients", "_accumulate"),  # forward + backward
             ("rlvr.train.pg.loop", "clip_and_step", "optimizer"))

    @staticmethod
    def install() -> None:
        import importlib

        if PhaseClock._undo:
            return
        for module, name, phase in PhaseClock.WRAPS:
            PhaseClock.wrap(importlib.import_module(module), name, phase)

    @staticmethod
    def uninstall() -> None:
        for owner, name, fn in reversed(PhaseClock._undo):
            setattr(owner, name, fn)
        PhaseClock._undo.clear()

    def take(self, metrics: dict) -> dict[str, float]:
        """This step's phases from the loop's own time/* metrics and the wrappers' sums."""
        s, self.spent = self.spent, {}
        fwd = s.get("forward", 0.0)
        out = {
            "generate": metrics.get("time/generate", 0.0),
            "score": metrics.get("time/score", 0.0),
            "old/ref logprobs": s.get("old/ref logprobs", 0.0),
            "forward": fwd,
            "backward": s.get("_accumulate", 0.0) - fwd,
            "optimizer": s.get("optimizer", 0.0),
        }
        out["step"] = metrics["time/step"]
        out["bookkeeping"] = out["step"] - sum(out[p] for p in PHASES[:-1])
        return out


class _Runner:
    """One training run advanced step by step from a thread, so two runs can alternate."""

    def __init__(self, cfg, task, clock: PhaseClock):
        import threading

        self.cfg, self.task, self.clock = cfg, task, clock
        self.rows: list[dict] = []
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self.error: BaseException | None = None
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from rlvr.train.pg.loop import train

        def on_step(step, metrics):
            row = self.clock.take(metrics)
            wall = time.perf_counter() - self._resumed
            if step > 1:  # the whole wall time since the last step: its logging, this step's all
                row["bookkeeping"] += wall - row["step"]
                row["step"] = wall
            else:
                row["startup"] = wall - row["step"]
            self.rows.append(row)
            self._done.release()
            self._go.acquire()
            self._resumed = time.perf_counter()

        try:
            self._go.acquire()
            self._resumed = time.perf_counter()
            train(self.cfg, data=self.task, on_step=on_step)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self.error = e
            self._done.release()

    def step(self):
        """Let the run do its next step (blocks until it is done)."""
        if not self._t.is_alive() and not self.rows and self.error is None:
            self._t.start()
        _ACTIVE[0] = self.clock
        self._go.release()
        self._done.acquire()
        if self.error is not None:
            raise self.error


def timed_runs(configs: dict[str, tuple], steps: int, counts: dict[str, dict], threads: int) -> dict[str, list[dict]]:
    """Run every configuration for `steps` steps, alternating step by step; after each step, the
    matmuls of that configuration's phases are timed alone (row["mm_s"][phase])."""
    runners = {k: _Runner(c, t, PhaseClock()) for k, (c, t) in configs.items()}
    PhaseClock.install()
    for _ in range(steps):
        for k, r in runners.items():
            r.step()
            r.rows[-1]["limit"] = {p: _limit_seconds(c, threads) for p, c in counts[k].items()}
    for r in runners.values():
        _ACTIVE[0] = r.clock
        r._go.release()  # let train() finish (checkpoint, plots)
        r._t.join()
    PhaseClock.uninstall()
    return {k: r.rows for k, r in runners.items()}


# --------------------------------------------------------------------------- FLOPs, limit


def _limit_seconds(count, threads: int) -> float:
    """The compute limit of one phase, timed now: its FLOPs at the matmul throughput of its own ops
    (benchmarks/compute_limit.py; a short replay, so it can run after every step)."""
    if not count.flops:
        return 0.0
    return limit_seconds(count.flops, matmul_throughput(count.ops, threads, repeats=3, min_seconds=0.0))


def count_phases(cfg, task) -> dict[str, dict]:
    """Replay one step phase by phase: FLOPs and the ops (with shapes) of each phase
    (benchmarks/compute_limit.count_flops)."""
    import rlvr.train.pg.objective as objective_mod
    from rlvr.rewards.batch import score_rollouts
    from rlvr.rollout import build_generator, rollouts_to_batch
    from rlvr.train.batching import ForwardSpec
    from rlvr.train.pg.loop import validate_train_config
    from rlvr.train.pg.objective import LossParts
    from rlvr.train.pg.rollout_source import NoPushCheck, RolloutSource, sample_groups
    from rlvr.train.policy import policy_from_config
    from rlvr.train.session import Timer

    plan = validate_train_config(cfg)
    model, tok = policy_from_config(cfg.model, seed=cfg.run.seed)
    obj = objective_mod.Objective(cfg.algo, cfg.sampling.group_size, cfg.sampling.max_tokens, plan)
    gen = build_generator(cfg.rollout, model, tok, seed=cfg.run.seed, default_batch_size=plan.rollout_batch)
    out = {}
    source = RolloutSource(gen, gen, task, cfg, obj, None, score_rollouts, NoPushCheck(), model, tok)
    out["generate"] = count_flops(lambda: sample_groups(source, task, cfg, obj, 1, 0, Timer()))
    sampled = out["generate"].result
    batch = rollouts_to_batch(sampled.rollouts, tok.pad_token_id)
    logp = {}
    if obj.needs_old_logprobs or obj.needs_reference:
        def old_ref():  # the reference is the policy's copy: the same FLOPs and, here, the same numbers
            for kind, on in (("old", obj.needs_old_logprobs), ("ref", obj.needs_reference)):
                if not on:
                    continue
                logp[kind] = objective_mod.batch_logprobs(model, batch, plan.micro_batch, cfg.sampling.temperature,
                                                          shared_prefix=cfg.algo.shared_prefix)
        out["old/ref logprobs"] = count_flops(old_ref)
    from rlvr.algo import loss_normalizers

    norm_len = obj.norm_length
    norm = loss_normalizers(batch.response_mask, constant=float(norm_len) if norm_len else None)
    fwd = ForwardSpec.of(cfg.algo, plan.micro_batch, temperature=cfg.sampling.temperature)
    out["forward"] = count_flops(lambda: objective_mod.micro_batch_loss(
        model, objective_mod.Minibatch(batch, sampled.adv, old_logp=logp.get("old"), ref_logp=logp.get("ref")), norm,
        LossParts.from_algo(cfg.algo), fwd))
    loss, _ = out["forward"].result
    out["backward"] = count_flops(loss.backward)
    for c in out.values():
        c.result = None
    return out


# --------------------------------------------------------------------------------- report


def summarize(rows: list[dict], warmup: int, counts: dict[str, dict]) -> dict:
    """Medians over the steady steps (after warmup, without the last, which also evaluates and
    saves). A phase's limit in a step = its FLOPs at the matmul throughput timed right after that
    step (the matmuls' FLOPs / their seconds)."""
    idx = list(range(warmup, len(rows) - 1)) or list(range(len(rows)))
    steady = [rows[i] for i in idx]

    def limit(r, p):
        return r["limit"][p]

    med = lambda xs: statistics.median(list(xs))
    phases = {}
    for p in PHASES:
        entry = {"seconds": round(med(r[p] for r in steady), 4)}
        if p in counts:
            c = counts[p]
            lim = med(limit(r, p) for r in steady)
            entry.update(gflop=round(c.flops / 1e9, 3),
                         mm_gflop_per_s=round(c.flops / 1e9 / lim, 1) if lim else None,
                         limit_s=round(lim, 4),
                         share_of_limit=round(med(limit(r, p) / r[p] for r in steady if r[p] > 0), 3))
        phases[p] = entry
    step_limit = [sum(limit(r, p) for p in counts) for r in rows]
    steady_step = med(r["step"] for r in steady)
    return {
        "steps": len(rows), "warmup": warmup,
        "startup_s": round(rows[0].get("startup", 0.0), 3),
        "first_step_s": round(rows[0]["step"], 4), "steady_step_s": round(steady_step, 4),
        "first_over_steady": round(rows[0]["step"] / steady_step, 2),
        "gflop_per_step": round(sum(c.flops for c in counts.values()) / 1e9, 3),
        "limit_s": round(med(step_limit[i] for i in idx), 4),
        "share_of_limit": round(med(step_limit[i] / rows[i]["step"] for i in idx), 3),
        "phases": phases,
        "per_step_s": [round(r["step"], 4) for r in rows],
        "per_step_share": [round(lim / r["step"], 3) for lim, r in zip(step_limit, rows, strict=True)],
    }


def markdown(results: dict) -> str:
    lines = ["# One GRPO step of the demo: phases, FLOPs and the compute limit", "",
             "Written by `benchmarks/step.py` (see its docstring for the method). Median over the steady steps;",
             "limit = the phase's FLOPs at the matmul throughput measured at its own shapes; share = limit / time.", ""]
    for label, r in results["runs"].items():
        lines += [f"## {label}", "", f"{r.get('note', '')}", "",
                  f"steady step {r['steady_step_s']:.3f} s, first step {r['first_step_s']:.3f} s "
                  f"({r['first_over_steady']:.2f}x); {r['gflop_per_step']:.2f} GFLOP/step; limit {r['limit_s']:.3f} s; "
                  f"**{100 * r['share_of_limit']:.0f}% of the limit**", "",
                  "| phase | s | GFLOP | matmul GFLOP/s | limit s | share of limit |", "|---|---|---|---|---|---|"]
        for p, e in r["phases"].items():
            g = f"{e['gflop']:.2f}" if "gflop" in e else ""
            thr = f"{e['mm_gflop_per_s']:.0f}" if e.get("mm_gflop_per_s") else ""
            lim = f"{e['limit_s']:.3f}" if "limit_s" in e else ""
            share = f"{100 * e['share_of_limit']:.0f}%" if e.get("share_of_limit") is not None else ""
            lines.append(f"| {p} | {e['seconds']:.4f} | {g} | {thr} | {lim} | {share} |")
        lines.append(f"| **step** | {r['steady_step_s']:.4f} | {r['gflop_per_step']:.2f} | | {r['limit_s']:.3f} | "
                     f"{100 * r['share_of_limit']:.0f}% |")
        lines.append("")
    m = results["machine"]
    lines.append(f"Machine: {m['cpu']}, {m['cores']} cores, {m['threads']} torch thread(s), torch {m['torch']}; "
                 "shared with other jobs while measured (runs compared in one call alternate step by step).")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--init-from", default=None, help="SFT checkpoint (default: the demo's warm-up, cached)")
    ap.add_argument("--label", default="current", help="name of this run in step.json / step.md")
    ap.add_argument("--set", action="append", default=[], help="config override KEY=VALUE for the main run")
    ap.add_argument("--compare", action="append", default=[],
                    help="KEY=VALUE overrides of a second run interleaved with the main one")
    ap.add_argument("--fresh", action="store_true",
                    help="a randomly initialized model sized by --set model.hidden_size=... (no SFT checkpoint): the "
                         "same step at other model sizes")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    torch.set_num_threads(a.threads)
    from rlvr.train.policy import quiet_transformers

    quiet_transformers()
    configs = {a.label: demo_setup(a.init_from, a.threads, a.steps, a.set, a.fresh)}
    if a.compare:
        configs[f"{a.label} ({', '.join(a.compare)})"] = demo_setup(a.init_from, a.threads, a.steps, a.set + a.compare,
                                                                    a.fresh)
    for k, (c, _) in configs.items():
        c.run.out_dir = f"/tmp/rlvr-step-run/{abs(hash(k))}"
    counts = {k: count_phases(c, t) for k, (c, t) in configs.items()}
    gc.collect()  # the replays' model and tensors go now, not inside the first timed step
    rows = timed_runs(configs, a.steps, counts, a.threads)
    path = RESULTS / "step.json"
    results = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    for k in configs:
        r = summarize(rows[k], a.warmup, counts[k])
        r["note"] = (f"{a.steps} steps ({a.warmup} warm-up), overrides: {' '.join(a.set + (a.compare if k != a.label else [])) or 'none'}; "
                     f"measured {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")
        results["runs"][k] = r
        print(f"{k}: steady {r['steady_step_s']:.3f} s, first {r['first_step_s']:.3f} s, {r['gflop_per_step']:.2f} GFLOP, "
              f"limit {r['limit_s']:.3f} s = {100 * r['share_of_limit']:.0f}%")
        for p, e in r["phases"].items():
            print(f"  {p:18s} {e}")
    results["machine"] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "threads": a.threads, "torch": torch.__version__, "python": sys.version.split()[0]}
    if not a.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))
        (RESULTS / "step.md").write_text(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
