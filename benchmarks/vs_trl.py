"""rlvr vs TRL's GRPOTrainer on the same work, side by side, interleaved in one run.

    pip install -e ".[bench]"        # TRL (benchmark only; never a dependency of rlvr itself)
    python benchmarks/vs_trl.py      # the default: the demo's GRPO phase, 3 rounds x 100 steps (~30-60 min)
    python benchmarks/vs_trl.py --quick     # smoke run: 1 round x 3 steps, 16 prompts x 8, short SFT

The default reproduces the setting of the issue-15 measurement: the demo's GRPO phase (`rlvr demo`): the
same SFT checkpoint of the tiny character-level Qwen2 model (built here if absent, as the demo builds it),
sums of four single digits, reward = rlvr's verifier only, 64 prompts x 8 samples, at most 4 new tokens,
lr 5e-4, one torch thread, 100 steps, 3 rounds. Every knob that defines the learning is set equal on both
sides, explicitly (printed side by side at the start and written to the results):

- GRPO advantage (r - group mean) / (group std + 1e-4), the std with Bessel's correction (TRL's
  `scale_rewards="group"`; rlvr `algo.advantage=grpo algo.adv_std=sample algo.adv_eps=1e-4`);
- clipped surrogate, epsilon 0.2, no KL (TRL `beta=0`, `epsilon=0.2`; rlvr recipe grpo, `algo.kl_coef=0`);
- per-response token mean, then the mean over responses (TRL `loss_type="grpo"`; rlvr
  `algo.aggregation=seq_mean_token_mean`); one optimizer step per rollout batch of 512 (no accumulation);
- AdamW lr 5e-4 constant, betas (0.9, 0.999), eps 1e-8, no weight decay, gradient norm clipped at 1.0;
- sampling at temperature 1, top-p 1, no top-k, float32 everywhere;
- the same prompts in the same order: TRL's dataset is rlvr's prompt stream for these steps, unshuffled.

Each round runs every side once, each in its own subprocess (so peak RSS is that side's alone), the
order rotated from round to round, so machine load from other work hits all sides alike. Sides:
`rlvr`, `trl` (gradient checkpointing off, as rlvr) and `trl_defaults` (TRL's own performance defaults:
gradient checkpointing on, bf16 autocast; the learning knobs above unchanged). Round k uses seed k.

Reported per side: seconds per step (median over all steps but the first; the first step and start-up
separately), the split generate / score / train (TRL: timing wrappers around `GRPOTrainer._generate` and
`_calculate_rewards`; train = the rest of the step), held-out greedy accuracy on the demo's 200 held-out
problems before and after (the same rlvr evaluator on both final models), peak RSS of the process, and
rlvr's distance from the compute limit (benchmarks/compute_limit.py: the FLOPs of one rlvr step over the
matmul throughput measured at the step's own shapes on the same thread count).

Writes benchmarks/results/vs_trl.json and vs_trl.md (or --results-name).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_T0 = time.perf_counter()  # a worker's start-up is measured from here (its imports included)
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIDES = ("rlvr", "trl", "trl_defaults", "trl_gc")
DEFAULT_SIDES = SIDES

# The issue-15 setting (the demo's GRPO phase) and the smoke preset.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {"rounds": 3, "steps": 100, "n_prompts": 64, "group_size": 8, "max_tokens": 4, "lr": 5e-4,
                "threads": 1, "sft_steps": 1500, "num_eval": 200, "defaults_rounds": 1},
    "quick": {"rounds": 1, "steps": 3, "n_prompts": 16, "group_size": 8, "max_tokens": 4, "lr": 5e-4,
              "threads": 1, "sft_steps": 20, "num_eval": 50, "defaults_rounds": 1},
}


# ------------------------------------------------------------------------------ the settings


def settings(a) -> dict[str, Any]:
    """The shared learning settings (one source for both sides)."""
    return {"steps": a.steps, "n_prompts": a.n_prompts, "group_size": a.group_size, "max_tokens": a.max_tokens,
            "lr": a.lr, "threads": a.threads, "clip_eps": 0.2, "adv_eps": 1e-4, "grad_clip": 1.0,
            "temperature": 1.0, "top_p": 1.0}


def rlvr_overrides(s: dict[str, Any], sft_dir: Path, out: Path, seed: int) -> list[str]:
    """rlvr's config (recipe grpo as the base layer) for settings s."""
    from rlvr.train.demo import DemoConfig

    d = DemoConfig()
    return [
        f"model.init_from={sft_dir}", f"model.hidden_size={d.hidden_size}", f"model.num_layers={d.num_layers}",
        "model.num_heads=4", f"model.intermediate_size={2 * d.hidden_size}", "model.tie_embeddings=true",
        "algo.advantage=grpo", "algo.adv_std=sample", f"algo.adv_eps={s['adv_eps']}", "algo.loss=grpo_clip",
        f"algo.clip_low={s['clip_eps']}", f"algo.clip_high={s['clip_eps']}", "algo.kl_coef=0",
        "algo.aggregation=seq_mean_token_mean", "algo.epochs_per_rollout_batch=1", "algo.micro_batch_size=0",
        f"optim.lr={s['lr']}", "optim.schedule=constant", "optim.warmup_steps=0", "optim.weight_decay=0",
        "optim.beta1=0.9", "optim.beta2=0.999", "optim.eps=1e-8", f"optim.grad_clip={s['grad_clip']}",
        f"sampling.n_prompts={s['n_prompts']}", f"sampling.group_size={s['group_size']}",
        f"sampling.max_tokens={s['max_tokens']}", f"sampling.temperature={s['temperature']}",
        f"sampling.top_p={s['top_p']}",
        f"run.out_dir={out}", "run.overwrite=true", f"run.steps={s['steps']}", f"run.seed={seed}",
        f"run.num_threads={s['threads']}", "run.eval_every=0", "run.progress=false", "run.log_samples_every=0",
    ]


def trl_kwargs(s: dict[str, Any], out: Path, seed: int, side: str = "trl") -> dict[str, Any]:
    """GRPOConfig keyword arguments for settings s. side "trl": gradient checkpointing off and float32,
    as rlvr; "trl_defaults": TRL's own performance defaults (gradient checkpointing on, bf16);
    "trl_gc": gradient checkpointing on, float32. The learning knobs are rlvr's on every side."""
    kw = {
        "output_dir": str(out), "seed": seed, "max_steps": s["steps"], "use_cpu": True,
        "per_device_train_batch_size": s["n_prompts"] * s["group_size"], "gradient_accumulation_steps": 1,
        "num_generations": s["group_size"], "max_completion_length": s["max_tokens"], "shuffle_dataset": False,
        "temperature": s["temperature"], "top_p": s["top_p"], "top_k": 0,
        "beta": 0.0, "epsilon": s["clip_eps"], "loss_type": "grpo", "scale_rewards": "group", "num_iterations": 1,
        "learning_rate": s["lr"], "lr_scheduler_type": "constant", "warmup_steps": 0, "weight_decay": 0.0,
        "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": s["grad_clip"],
        "report_to": "none", "save_strategy": "no", "logging_steps": 10, "disable_tqdm": True,
        "dataloader_num_workers": 0, "log_completions": False,
    }
    if side == "trl":
        kw |= {"gradient_checkpointing": False, "bf16": False}
    elif side == "trl_gc":
        kw |= {"gradient_checkpointing": True, "bf16": False}
    elif side != "trl_defaults":
        raise ValueError(f"trl_kwargs: unknown side {side!r}")
    return kw


def side_by_side(s: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(setting, rlvr, TRL) rows for the printed comparison."""
    n = s["n_prompts"] * s["group_size"]
    return [
        ("policy", "demo SFT checkpoint (Qwen2, 128 wide, 2 layers, char tokenizer)", "the same folder"),
        ("prompts", f"{s['n_prompts']} per step, rlvr's stream", "the same prompts, same order (shuffle_dataset=False)"),
        ("group size", f"sampling.group_size={s['group_size']}", f"num_generations={s['group_size']}"),
        ("batch", f"{n} responses, 1 optimizer step", f"per_device_train_batch_size={n}, gradient_accumulation_steps=1"),
        ("new tokens", f"sampling.max_tokens={s['max_tokens']}", f"max_completion_length={s['max_tokens']}"),
        ("sampling", "temperature 1, top_p 1", "temperature=1, top_p=1, top_k=0"),
        ("reward", "rlvr verifier (task reward_fn)", "the same function, called per completion"),
        ("advantage", f"algo.advantage=grpo, adv_std=sample, adv_eps={s['adv_eps']}", "scale_rewards='group' (std + 1e-4, Bessel)"),
        ("loss", f"grpo_clip, clip {s['clip_eps']}, kl_coef=0", f"epsilon={s['clip_eps']}, beta=0, num_iterations=1"),
        ("aggregation", "seq_mean_token_mean", "loss_type='grpo'"),
        ("optimizer", f"AdamW lr {s['lr']} constant, eps 1e-8, wd 0, clip {s['grad_clip']}",
         f"learning_rate={s['lr']}, lr_scheduler_type='constant', adam_epsilon=1e-8, weight_decay=0, max_grad_norm={s['grad_clip']}"),
        ("precision", "float32", "bf16=False (trl_defaults: bf16=True, TRL's default)"),
        ("gradient checkpointing", "off", "gradient_checkpointing=False (trl_defaults, trl_gc: True, TRL's default)"),
        ("threads", f"run.num_threads={s['threads']}", f"torch.set_num_threads({s['threads']})"),
        ("steps", f"run.steps={s['steps']}", f"max_steps={s['steps']}"),
    ]


# ------------------------------------------------------------------------------ shared data


def demo_setup(num_eval: int, sft_steps: int):
    """(DemoConfig, rl TrainConfig, full task, rl task): the demo's split of the synthetic additions."""
    from rlvr.train.demo import DemoConfig, _configs, demo_task

    d = DemoConfig(num_eval=num_eval, sft_steps=sft_steps, progress=False)
    _, rl_cfg = _configs(d, Path("unused"))
    task = demo_task(d)
    pool = list(task.train[d.sft_examples:])
    return d, rl_cfg, task, type(task)(**{**task.__dict__, "train": pool})


def prompt_stream(rl_task, rl_cfg, steps: int, n_prompts: int) -> list[Any]:
    """The examples rlvr's trainer draws for steps 1..steps (rlvr.train.session.take, data.seed)."""
    from rlvr.train.session import take

    return take(rl_task.train, 0, steps * n_prompts, rl_cfg.data.seed)


# ------------------------------------------------------------------------------ workers


def _peak_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux


def worker_rlvr(spec: dict) -> dict:
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import train
    from rlvr.train.pg.recipes import get_recipe
    from rlvr.train.policy import resolve_model_dir

    s = spec["settings"]
    _, rl_cfg, _, rl_task = demo_setup(spec["num_eval"], spec["sft_steps"])
    cfg = load_config(TrainConfig, None, rlvr_overrides(s, Path(spec["sft_dir"]), Path(spec["out"]), spec["seed"]),
                      base=get_recipe("grpo"))
    cfg.data = rl_cfg.data  # the demo's data section (same seeds)
    steps: list[dict] = []
    first_end = []

    def on_step(step: int, m: dict) -> None:
        if step == 1:
            first_end.append(time.perf_counter())
        total = m["time/step"] - m.get("time/eval", 0.0)  # the last step's held-out eval is not the step
        gen, score = m.get("time/generate", 0.0), m.get("time/score", 0.0)
        steps.append({"step": step, "s": total, "generate": gen, "score": score, "train": total - gen - score,
                      "reward": m["reward/mean"]})

    res = train(cfg, data=rl_task, on_step=on_step)
    o, sa, al = cfg.optim, cfg.sampling, cfg.algo
    effective = {  # what the run actually used, in TRL's terms (tests compare the two sides)
        "responses_per_optimizer_step": sa.n_prompts * sa.group_size, "group_size": sa.group_size,
        "max_new_tokens": sa.max_tokens, "temperature": sa.temperature, "top_p": sa.top_p,
        "lr": o.lr, "schedule": o.schedule, "warmup": o.warmup_steps, "weight_decay": o.weight_decay,
        "betas": [o.beta1, o.beta2], "adam_eps": o.eps, "grad_clip": o.grad_clip,
        "clip": [al.clip_low, al.clip_high], "kl": al.kl_coef, "std_scaled": al.advantage == "grpo" and al.adv_std == "sample",
        "aggregation": {"seq_mean_token_mean": "grpo"}.get(al.aggregation, al.aggregation),
        "epochs": al.epochs_per_rollout_batch, "steps": len(steps), "seed": cfg.run.seed,
        "gradient_checkpointing": False, "bf16": cfg.model.dtype == "bfloat16",
    }
    startup = first_end[0] - _T0 - steps[0]["s"]
    return {"steps": steps, "startup_s": startup, "peak_rss_gb": _peak_rss_gb(),
            "model_dir": str(resolve_model_dir(res.run_dir)), "same_prompts_as_rlvr": True, "effective": effective}


def worker_trl(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.train.policy import quiet_transformers

    s = spec["settings"]
    torch.set_num_threads(s["threads"])
    quiet_transformers()
    _, rl_cfg, _, rl_task = demo_setup(spec["num_eval"], spec["sft_steps"])
    examples = prompt_stream(rl_task, rl_cfg, s["steps"], s["n_prompts"])
    ds = Dataset.from_dict({"prompt": [rl_task.prompt(ex) for ex in examples], "idx": list(range(len(examples)))})
    reward_fn = rl_task.reward_fn

    seen: list[list[int]] = []  # the prompt indices each reward call saw (checked below: rlvr's order)

    def verifier(prompts, completions, idx, **_):
        seen.append(sorted(set(idx)))
        return [float(reward_fn(c, examples[i]).total) for c, i in zip(completions, idx, strict=True)]

    tok = AutoTokenizer.from_pretrained(spec["sft_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["sft_dir"], dtype=torch.float32)
    args = GRPOConfig(**trl_kwargs(s, Path(spec["out"]), spec["seed"], spec["side"]))
    trainer = GRPOTrainer(model=model, reward_funcs=verifier, args=args, train_dataset=ds, processing_class=tok)
    steps: list[dict] = []
    cur: dict[str, float] = {}
    rewards: list[float] = []

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                cur[name] = cur.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    calc = trainer._calculate_rewards

    def calc_rewards(*a, **k):
        out = timed("score", calc)(*a, **k)
        rewards.append(float(torch.nansum(out, dim=1).mean()))
        return out

    trainer._calculate_rewards = calc_rewards
    starts: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            cur.clear()
            starts.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            total = time.perf_counter() - starts[-1]
            gen, score = cur.get("generate", 0.0), cur.get("score", 0.0)
            steps.append({"step": state.global_step, "s": total, "generate": gen, "score": score,
                          "train": total - gen - score, "reward": rewards[-1] if rewards else float("nan")})

    trainer.add_callback(Clock())
    trainer.train()
    ta = trainer.args
    effective = {  # what the run actually used (tests compare it with rlvr's)
        "responses_per_optimizer_step": ta.per_device_train_batch_size * ta.gradient_accumulation_steps,
        "group_size": ta.num_generations, "max_new_tokens": ta.max_completion_length,
        "temperature": ta.temperature, "top_p": ta.top_p, "lr": ta.learning_rate,
        "schedule": str(getattr(ta.lr_scheduler_type, "value", ta.lr_scheduler_type)), "warmup": ta.warmup_steps,
        "weight_decay": ta.weight_decay, "betas": [ta.adam_beta1, ta.adam_beta2], "adam_eps": ta.adam_epsilon,
        "grad_clip": ta.max_grad_norm, "clip": [ta.epsilon, ta.epsilon_high or ta.epsilon], "kl": ta.beta,
        "std_scaled": ta.scale_rewards == "group", "aggregation": ta.loss_type, "epochs": ta.num_iterations,
        "steps": trainer.state.global_step, "seed": ta.seed,
        "gradient_checkpointing": bool(ta.gradient_checkpointing), "bf16": bool(ta.bf16),
    }
    n = s["n_prompts"]
    same_prompts = [ids == list(range(k * n, (k + 1) * n)) for k, ids in enumerate(seen)]
    startup = starts[0] - _T0
    peak = _peak_rss_gb()
    out_model = Path(spec["out"]) / "final"
    trainer.save_model(str(out_model))
    tok.save_pretrained(str(out_model))
    return {"steps": steps, "startup_s": startup, "peak_rss_gb": peak, "model_dir": str(out_model),
            "same_prompts_as_rlvr": len(same_prompts) == s["steps"] and all(same_prompts), "effective": effective}


def worker_flops(spec: dict) -> dict:
    """FLOPs of one rlvr step (step 1: generate, then forward+backward+optimizer) and the matmul
    throughput at exactly those ops' shapes on the configured threads."""
    sys.path.insert(0, str(ROOT))
    import rlvr.rollout as ro
    import rlvr.train.pg.loop as pg
    from benchmarks.compute_limit import count_flops, matmul_throughput, summary

    counts: dict = {}
    orig_learn, orig_build = pg.learn, ro.build_generator

    def learn(*a, **k):
        if "train" in counts:
            return orig_learn(*a, **k)
        counts["train"] = count_flops(lambda: orig_learn(*a, **k))
        return counts["train"].result

    def build(*a, **k):
        g = orig_build(*a, **k)
        gen = g.generate

        def generate(*a2, **k2):
            if "generate" in counts:
                return gen(*a2, **k2)
            counts["generate"] = count_flops(lambda: gen(*a2, **k2))
            return counts["generate"].result

        g.generate = generate
        return g

    pg.learn, ro.build_generator = learn, build
    one = dict(spec, settings={**spec["settings"], "steps": 1})
    worker_rlvr(one)
    ops = counts["generate"].ops + counts["train"].ops
    tp = matmul_throughput(ops, threads=spec["settings"]["threads"])
    out = summary({k: counts[k] for k in ("generate", "train")}, tp)
    out["by_op"] = {k: c.by_op for k, c in counts.items()}
    return out


def run_worker(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    sys.path.insert(0, str(ROOT))
    fn = {"rlvr": worker_rlvr, "trl": worker_trl, "trl_defaults": worker_trl, "trl_gc": worker_trl, "flops": worker_flops}[spec["side"]]
    result = fn(spec)
    Path(spec["result"]).write_text(json.dumps(result))


def spawn(spec: dict, work: Path, name: str) -> dict:
    """Run one side in a fresh process; its result dict (raises with the tail of its log on failure)."""
    work.mkdir(parents=True, exist_ok=True)
    spec = dict(spec, result=str(work / f"{name}.result.json"))
    spec_path = work / f"{name}.spec.json"
    log = work / f"{name}.log"
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["settings"]["threads"]),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])))
    spec_path.write_text(json.dumps(spec))
    t0 = time.time()
    with log.open("w") as fh:
        rc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)],
                            stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{name} failed (exit {rc}); log {log}:\n{tail}")
    out = json.loads(Path(spec["result"]).read_text())
    out["wall_s"] = time.time() - t0
    return out


def collect(work: Path, name: str) -> dict | None:
    """A side's result left by an earlier run (--collect); None when it has none."""
    path = work / f"{name}.result.json"
    return json.loads(path.read_text()) if path.exists() else None


# ------------------------------------------------------------------------------ the parent


def build_sft(out: Path, d, task) -> Path:
    """The demo's SFT checkpoint under out/sft (reused when present)."""
    from rlvr.train.demo import _configs
    from rlvr.train.policy import resolve_model_dir
    from rlvr.train.sft import train_sft

    marker = out / "sft_done.json"
    if marker.exists() and json.loads(marker.read_text()).get("sft_steps") == d.sft_steps:
        return Path(json.loads(marker.read_text())["model_dir"])
    sft_cfg, _ = _configs(d, out)
    pool = list(task.train[d.sft_examples:])
    sft_task = type(task)(**{**task.__dict__, "train": list(task.train[: d.sft_examples]), "eval": pool[:200]})
    res = train_sft(sft_cfg, data=sft_task, stop_at_accuracy=d.sft_target_accuracy)
    model_dir = resolve_model_dir(res.run_dir)
    marker.write_text(json.dumps({"sft_steps": d.sft_steps, "steps_run": res.steps, "model_dir": str(model_dir)}))
    return model_dir


def held_out_greedy(model_dir: str | Path, task, rl_cfg) -> float:
    """The one evaluator for every side: rlvr's greedy evaluation on the demo's held-out problems."""
    from rlvr.models import load_policy
    from rlvr.rollout import build_generator
    from rlvr.train.tasks import eval_policy

    model, tok = load_policy(Path(model_dir))
    return float(eval_policy(build_generator(rl_cfg.rollout, model, tok, default_batch_size=256), task, rl_cfg,
                             greedy=True)["accuracy"])


def _med(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def aggregate(runs: list[dict]) -> dict[str, Any]:
    """One side's summary over its rounds."""
    steady = [st for r in runs for st in r["steps"][1:]]  # all but each run's first step
    return {
        "rounds": len(runs),
        "steps_per_round": sorted({len(r["steps"]) for r in runs}),
        "median_step_s": _med([st["s"] for st in steady]),
        "first_step_s": _med([r["steps"][0]["s"] for r in runs]),
        "startup_s": _med([r["startup_s"] for r in runs]),
        "generate_s": _med([st["generate"] for st in steady]),
        "score_s": _med([st["score"] for st in steady]),
        "train_s": _med([st["train"] for st in steady]),
        "acc_after": [r["acc_after"] for r in runs],
        "acc_after_mean": statistics.fmean(r["acc_after"] for r in runs),
        "reward_last10": statistics.fmean(st["reward"] for r in runs for st in r["steps"][-10:]),
        "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
        "same_prompts_as_rlvr": all(r["same_prompts_as_rlvr"] for r in runs),
    }


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"Command: `{result['command']}`; {s['rounds']} interleaved round(s) x {s['steps']} steps, "
             f"{s['n_prompts']} prompts x {s['group_size']} samples, {s['max_tokens']} new tokens, lr {s['lr']}, "
             f"{s['threads']} torch thread(s); TRL {result['versions']['trl']}, transformers "
             f"{result['versions']['transformers']}, torch {result['versions']['torch']}; load average before/after "
             f"{result['load_average']} on {result['cpus']} CPUs (the machine was shared with other work: the "
             "sides alternate within each round so that load hits them alike).", "",
             "| setting | rlvr | TRL GRPOTrainer |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in result["side_by_side"]]
    before = result["acc_before"]
    same = all(a["same_prompts_as_rlvr"] for a in result["sides"].values())
    lines += ["", f"Held-out greedy accuracy of the SFT start: {before:.3f} ({result['num_eval']} problems). Rounds run "
              "(round k: seed k): " + ", ".join(f"{k} {a['rounds']}" for k, a in result["sides"].items())
              + f". Every TRL step saw rlvr's prompts of that step: {'yes' if same else 'NO'}.", "",
              "| side | median s/step | vs rlvr | first step s | start-up s | generate s | score s | train s | "
              "held-out greedy after (per round) | mean | reward, last 10 steps | peak RSS GiB |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    base = result["sides"]["rlvr"]["median_step_s"] if "rlvr" in result["sides"] else float("nan")
    for name, a in result["sides"].items():
        lines.append(
            f"| {name} | {a['median_step_s']:.3f} | {a['median_step_s'] / base:.2f}x | {a['first_step_s']:.2f} | "
            f"{a['startup_s']:.1f} | {a['generate_s']:.3f} | {a['score_s']:.3f} | {a['train_s']:.3f} | "
            f"{', '.join(f'{x:.3f}' for x in a['acc_after'])} | {a['acc_after_mean']:.3f} | {a['reward_last10']:.3f} | "
            f"{a['peak_rss_gb']:.2f} |")
    lines += ["", "Median s/step of each round (the order within a round rotates; rounds differ by the machine's load "
              "at the time):", "", "| round | " + " | ".join(result["sides"]) + " | trl / rlvr |",
              "|---|" + "---:|" * (len(result["sides"]) + 1)]
    for rnd in range(s["rounds"]):
        med = {k: _med([x["s"] for r in result["runs"][k] if r["round"] == rnd for x in r["steps"][1:]])
               for k in result["sides"]}
        ratio = med["trl"] / med["rlvr"] if "trl" in med else float("nan")
        lines.append(f"| {rnd} | " + " | ".join("" if math.isnan(v) else f"{v:.3f}" for v in med.values())
                     + f" | {ratio:.2f}x |")
    f = result.get("compute_limit")
    if f:
        lines += ["", f"rlvr's step vs the compute limit: {f['gflop/total']:.2f} GFLOP per step ({f['gflop/generate']:.2f} "
                  f"generate, {f['gflop/train']:.2f} forward+backward), matmul throughput at the step's shapes "
                  f"{f['gflop_per_s']:.1f} GFLOP/s on {s['threads']} thread(s) -> limit {f['limit_s']:.3f} s; "
                  f"rlvr's median step {result['sides']['rlvr']['median_step_s']:.3f} s: it runs at "
                  f"{f['share_of_limit']:.0%} of the limit (medians over rounds; throughput measured right after "
                  "each round's rlvr run, best of 5 replays of the step's own matmuls)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="smoke preset: " + json.dumps(PRESETS["quick"]))
    for k, v in PRESETS["default"].items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=None,
                        help=f"default {v}" + (" (trl_defaults and trl_gc run in the first N rounds only)"
                                               if k == "defaults_rounds" else ""))
    ap.add_argument("--sides", default=",".join(DEFAULT_SIDES), help=f"comma-separated subset of {', '.join(SIDES)}")
    ap.add_argument("--no-flops", action="store_true", help="skip the compute-limit measurement")
    ap.add_argument("--collect", action="store_true",
                    help="run nothing: rebuild the tables from the side results already under --out/logs "
                         "(e.g. of a run that was stopped; rounds or sides without a result are left out)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-vs-trl"), help="work folder (SFT checkpoint, runs, logs)")
    ap.add_argument("--results-name", default="vs_trl", help="benchmarks/results/NAME.{json,md}")
    ap.add_argument("--results-dir", default=str(RESULTS))
    a = ap.parse_args(argv)
    if a.worker:
        run_worker(a.worker)
        return {}
    preset = PRESETS["quick" if a.quick else "default"]
    for k, v in preset.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    sides = [x for x in a.sides.split(",") if x]
    if bad := sorted(set(sides) - set(SIDES)):
        sys.exit(f"--sides: unknown {bad}; known: {', '.join(SIDES)}")
    if "rlvr" not in sides:
        sys.exit("--sides must include rlvr (the table's reference)")
    import torch
    import transformers

    try:
        import trl
    except ImportError:
        sys.exit('vs_trl.py needs TRL: pip install -e ".[bench]"')
    from rlvr.runtime import set_num_threads
    from rlvr.train.policy import quiet_transformers

    set_num_threads(a.threads)
    quiet_transformers()
    out = Path(a.out)
    s = settings(a)
    d, rl_cfg, task, _ = demo_setup(a.num_eval, a.sft_steps)
    from rlvr.train.demo import DemoConfig

    d = DemoConfig(**{**d.__dict__, "out_dir": str(out), "num_threads": a.threads})
    load_before = os.getloadavg()
    t_all = time.perf_counter()
    print("settings, side by side:")
    for row in side_by_side(s):
        print(f"  {row[0]:24s} rlvr: {row[1]:60s} TRL: {row[2]}")
    print("SFT checkpoint ...", flush=True)
    sft_dir = build_sft(out, d, task)
    acc_before = held_out_greedy(sft_dir, task, rl_cfg)
    print(f"  {sft_dir}: held-out greedy {acc_before:.3f}", flush=True)
    runs: dict[str, list[dict]] = {k: [] for k in sides}
    limits: list[dict] = []
    for rnd in range(a.rounds):
        # trl_defaults (bf16 autocast: ~7x slower per step on CPU) and trl_gc: the first defaults_rounds rounds
        here = [x for x in sides if x in ("rlvr", "trl") or rnd < a.defaults_rounds]
        order = here[rnd % len(here):] + here[: rnd % len(here)]  # rotate who goes first
        for side in order:
            spec = {"side": side, "seed": rnd, "settings": s, "sft_dir": str(sft_dir), "num_eval": a.num_eval,
                    "sft_steps": a.sft_steps, "out": str(out / f"round{rnd}" / side)}
            r = collect(out / "logs", f"round{rnd}-{side}") if a.collect else spawn(spec, out / "logs", f"round{rnd}-{side}")
            if r is None:
                continue
            r["acc_after"] = held_out_greedy(r["model_dir"], task, rl_cfg)
            r["round"] = rnd
            runs[side].append(r)
            print(f"round {rnd} {side:13s} median {_med([x['s'] for x in r['steps'][1:]]):.3f} s/step, "
                  f"first {r['steps'][0]['s']:.2f} s, start-up {r['startup_s']:.1f} s, held-out {acc_before:.3f} -> "
                  f"{r['acc_after']:.3f}, peak RSS {r['peak_rss_gb']:.2f} GiB", flush=True)
            if side == "rlvr" and not a.no_flops:  # right after rlvr's run: under the same load
                spec = dict(spec, side="flops", out=str(out / f"round{rnd}" / "flops"))
                f = collect(out / "logs", f"round{rnd}-flops") if a.collect else spawn(spec, out / "logs", f"round{rnd}-flops")
                if f is None:
                    continue
                f["round"], f["share_of_limit"] = rnd, f["limit_s"] / _med([x["s"] for x in r["steps"][1:]])
                limits.append(f)
                print(f"round {rnd} compute limit: {f['gflop/total']:.2f} GFLOP at {f['gflop_per_s']:.1f} GFLOP/s = "
                      f"{f['limit_s']:.3f} s; rlvr at {f['share_of_limit']:.0%} of it", flush=True)
    result: dict[str, Any] = {
        "command": "python benchmarks/vs_trl.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {**s, "rounds": a.rounds, "defaults_rounds": a.defaults_rounds}, "side_by_side": side_by_side(s), "num_eval": a.num_eval,
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "acc_before": acc_before, "sft_dir": str(sft_dir),
        "sides": {k: aggregate(v) for k, v in runs.items() if v}, "runs": runs,
    }
    if limits:  # FLOPs of round 0's measurement; throughput, limit and share: medians over the rounds
        result["compute_limit"] = {**limits[0], **{k: _med([f[k] for f in limits])
                                                   for k in ("gflop_per_s", "limit_s", "share_of_limit")},
                                   "rounds": limits}
    result["load_average"] = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    result["total_s"] = round(time.perf_counter() - t_all, 1)
    res_dir = Path(a.results_dir)
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / f"{a.results_name}.json").write_text(json.dumps(result, indent=1, default=_json_default))
    md = markdown(result)
    (res_dir / f"{a.results_name}.md").write_text(md)
    print(md)
    return result


def _json_default(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)


if __name__ == "__main__":
    main()
