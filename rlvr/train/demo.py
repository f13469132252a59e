"""The CPU demo behind `rlvr demo` / `make demo`: RL from a verifier improves a tiny model.

1. build a ~0.35M-parameter Qwen2-style model with a character tokenizer, from scratch;
2. SFT it on labeled additions of four single digits ("3+5+7+1=" -> "16") until it is partly
   right (greedy >= 20% on a validation slice);
3. improve it with GRPO using only the verifier's 0/1 reward (no labels);
4. print a before/after table on held-out problems (greedy and sampled accuracy, format rate,
   mean length) and where the run directories and plots are.

Every knob is a field of DemoConfig (override with `rlvr demo key=value`); the defaults were tuned
on a 2-core machine to finish in well under 5 minutes (benchmarks/demo.py measures it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.eval import comparison_table, comparison_text
from rlvr.models import load_policy
from rlvr.rollout import build_generator
from rlvr.runtime import default_num_threads, set_num_threads
from rlvr.train.config import (
    AlgoConfig,
    DataConfig,
    DemoConfig,  # noqa: F401 - re-exported (rlvr demo's config)
    ModelConfig,
    OptimConfig,
    RunConfig,
    SamplingConfig,
    SFTAlgoConfig,
    SFTConfig,
    SFTSamplingConfig,
    TrainConfig,
)
from rlvr.train.pg.loop import train
from rlvr.train.pg.recipes import get_recipe
from rlvr.train.policy import quiet_transformers, resolve_model_dir
from rlvr.train.sft import train_sft
from rlvr.train.tasks import eval_policy, load_task_data


@dataclass
class DemoResult:
    """Before/after metrics and paths."""

    before: dict[str, float]  # after SFT: greedy/* and sampled/* eval metrics
    after: dict[str, float]  # after GRPO
    sft_dir: Path
    rl_dir: Path
    seconds: dict[str, float] = field(default_factory=dict)  # sft, rl, eval, total

    def delta(self, key: str) -> float:
        return self.after[key] - self.before[key]


def _data_config(cfg: DemoConfig):
    """The demo's data section (shared by its SFT and GRPO configs and demo_task)."""
    return DataConfig(task="arithmetic", num_train=cfg.num_train, num_eval=cfg.num_eval, seed=cfg.seed + 1234,
                      digits=cfg.digits, operands=cfg.operands)


def demo_task(cfg: DemoConfig, tokenizer=None):
    """TaskData of the demo: synthetic additions from rlvr.data, held-out split for evaluation."""
    return load_task_data(_data_config(cfg), tokenizer)


def _configs(cfg: DemoConfig, out: Path):
    threads = cfg.num_threads
    model = ModelConfig(hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, num_heads=4,
                        intermediate_size=2 * cfg.hidden_size, tie_embeddings=True)
    data = _data_config(cfg)
    sampling = SamplingConfig(n_prompts=cfg.n_prompts, group_size=cfg.group_size, max_tokens=cfg.max_tokens)
    sft = SFTConfig(
        model=model,
        data=data,
        sampling=SFTSamplingConfig(max_tokens=cfg.max_tokens),
        algo=SFTAlgoConfig(batch_size=cfg.sft_batch_size, aggregation="token_mean"),
        optim=OptimConfig(lr=cfg.sft_lr, warmup_steps=20, schedule="constant"),
        run=RunConfig(out_dir=str(out / "sft"), overwrite=True, steps=cfg.sft_steps, seed=cfg.seed, num_threads=threads,
                      eval_every=cfg.sft_eval_every, progress=cfg.progress, log_samples_every=0),
    )
    # GRPO as in DeepSeekMath but without the KL term (a tiny model far from any reference gains
    # nothing from an anchor here, and it saves the reference forward): knobs set explicitly.
    recipe = get_recipe("grpo")
    algo = AlgoConfig(**{k.split(".", 1)[1]: v for k, v in recipe.items() if k.startswith("algo.")})
    algo.kl_coef = 0.0
    rl = TrainConfig(
        model=ModelConfig(**{**model.__dict__, "init_from": str(out / "sft")}),
        data=data,
        sampling=sampling,
        algo=algo,
        optim=OptimConfig(lr=cfg.rl_lr, schedule="constant"),
        run=RunConfig(out_dir=str(out / "grpo"), overwrite=True, steps=cfg.rl_steps, seed=cfg.seed, num_threads=threads,
                      eval_every=0, progress=cfg.progress, log_samples_every=10),
    )
    return sft, rl


def _both_modes(generator, task, cfg) -> dict[str, float]:
    out: dict[str, float] = {}
    for mode, greedy in (("greedy", True), ("sampled", False)):
        for k, v in eval_policy(generator, task, cfg, greedy=greedy).items():
            out[f"{mode}/{k}"] = v
    return out


def run_demo(cfg: DemoConfig, *, task=None, console=None) -> DemoResult:
    """Run the whole demo; returns before/after metrics. task: optional TaskData override."""
    t_start = time.perf_counter()
    threads = cfg.num_threads or default_num_threads() or 1
    cfg = DemoConfig(**{**cfg.__dict__, "num_threads": threads})
    set_num_threads(threads)
    quiet_transformers()
    say = console.print if console is not None else print
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sft_cfg, rl_cfg = _configs(cfg, out)
    task = task if task is not None else demo_task(cfg)
    # SFT sees labels of the first sft_examples problems; GRPO draws prompts from the rest (and never
    # reads their labels except through the verifier). The SFT stopping check uses a slice of the
    # GRPO pool, so the held-out problems of the final table influence nothing.
    pool = list(task.train[cfg.sft_examples :])
    sft_task = type(task)(**{**task.__dict__, "train": list(task.train[: cfg.sft_examples]),
                             "eval": pool[: cfg.num_eval]})
    rl_task = type(task)(**{**task.__dict__, "train": pool})

    say(f"[1/3] SFT on {len(sft_task.train)} labeled sums of {cfg.operands} {cfg.digits}-digit terms until greedy accuracy "
        f"on a validation slice >= {cfg.sft_target_accuracy:.0%} (at most {cfg.sft_steps} steps)")
    t0 = time.perf_counter()
    # its metrics say val/accuracy, not eval/accuracy: the slice is not the held-out set of the table
    sft_res = train_sft(sft_cfg, data=sft_task, stop_at_accuracy=cfg.sft_target_accuracy, eval_name="val")
    t_sft = time.perf_counter() - t0

    t0 = time.perf_counter()
    model, tok = load_policy(resolve_model_dir(sft_res.run_dir))
    before = _both_modes(build_generator(rl_cfg.rollout, model, tok, default_batch_size=256), task, rl_cfg)
    t_eval = time.perf_counter() - t0
    say(f"      stopped after {sft_res.steps} steps; held-out greedy accuracy {before['greedy/accuracy']:.1%}, sampled {before['sampled/accuracy']:.1%}")

    say(f"[2/3] GRPO: {cfg.rl_steps} steps of {cfg.n_prompts} prompts x {cfg.group_size} samples, reward = verifier only")
    t0 = time.perf_counter()
    rl_res = train(rl_cfg, data=rl_task)
    t_rl = time.perf_counter() - t0

    t0 = time.perf_counter()
    model, tok = load_policy(resolve_model_dir(rl_res.run_dir))
    after = _both_modes(build_generator(rl_cfg.rollout, model, tok, default_batch_size=256), task, rl_cfg)
    t_eval += time.perf_counter() - t0
    seconds = {"sft": t_sft, "rl": t_rl, "eval": t_eval, "total": time.perf_counter() - t_start}
    result = DemoResult(before=before, after=after, sft_dir=sft_res.run_dir, rl_dir=rl_res.run_dir, seconds=seconds)
    (out / "demo.json").write_text(json.dumps(_summary(result, cfg), indent=1))
    say(f"[3/3] held-out evaluation on {len(task.eval[: cfg.num_eval])} problems:")
    if console is not None:  # let rich fit the table to the terminal

        console.print(comparison_table(*_table_columns(result)))
    else:
        say(result_table(result))
    say(f"time: SFT {t_sft:.0f}s, GRPO {t_rl:.0f}s, evaluation {t_eval:.0f}s, total {seconds['total']:.0f}s "
        f"({threads} torch thread{'s' if threads > 1 else ''})")
    say(f"runs: {sft_res.run_dir} (SFT), {rl_res.run_dir} (GRPO); plots in {rl_res.run_dir / 'plots'}")
    return result


TABLE_ROWS = [
    ("greedy accuracy", "greedy/accuracy"),
    ("sampled accuracy (T=1)", "sampled/accuracy"),
    ("format rate (greedy)", "greedy/format_rate"),
    ("mean length, tokens (greedy)", "greedy/len/mean"),
]


def _table_columns(result: DemoResult):
    cols = {
        "after SFT": {label: result.before[k] for label, k in TABLE_ROWS},
        "after GRPO": {label: result.after[k] for label, k in TABLE_ROWS},
    }
    return cols, [label for label, _ in TABLE_ROWS]


def result_table(result: DemoResult) -> str:
    """Plain-text before/after table."""
    return comparison_text(*_table_columns(result))


def _json_numbers(d: dict[str, Any]) -> dict[str, Any]:
    """NaN (a metric that does not apply, e.g. a format rate without a format part) -> null: JSON
    has no NaN."""
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in d.items()}


def _summary(result: DemoResult, cfg: DemoConfig) -> dict[str, Any]:
    return {
        "config": cfg.__dict__,
        "before": _json_numbers(result.before),
        "after": _json_numbers(result.after),
        "delta_greedy_points": 100 * result.delta("greedy/accuracy"),
        "delta_sampled_points": 100 * result.delta("sampled/accuracy"),
        "seconds": result.seconds,
        "sft_dir": str(result.sft_dir),
        "rl_dir": str(result.rl_dir),
    }
