"""Shared parts of the studies (benchmarks/studies/NAME.py): results files, the run header, SFT warm
starts cached per task and seed, RL runs from such a checkpoint, and reading a run's metrics.

Each study writes NAME.json (every measured number, the command, the machine and its load average) and
NAME.png to runs/studies/results/ (not committed; --out DIR elsewhere). Only --publish writes the committed
results under benchmarks/results/studies/ that docs/studies/NAME.md quotes, and a partial run (e.g.
std_normalization --no-learning) is never published.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "studies"  # the published results (--publish)
RUNS = ROOT / "runs" / "studies"
LOCAL = RUNS / "results"  # where a study writes by default


def _rel(path: Path) -> str:
    return os.path.relpath(path, ROOT)


def parse_args(ap, argv=None, partial=None):
    """ap.parse_args(argv) with the output options every study has: --publish (write the committed
    results, RESULTS) and --out DIR (default LOCAL, under the git-ignored runs/). partial(args): the
    flag that makes this run partial (None: a full run); a partial run is refused with --publish, so a
    published file is never replaced by a partial one. Sets args.results to the output directory."""
    ap.add_argument("--publish", action="store_true",
                    help=f"write the committed results, {_rel(RESULTS)}/ (default: {_rel(LOCAL)}/)")
    ap.add_argument("--out", type=Path, default=None, help=f"output directory (default {_rel(LOCAL)}/)")
    a = ap.parse_args(argv)
    flag = partial(a) if partial is not None else None
    problem = ("--publish and --out are two destinations: give one" if a.publish and a.out is not None else
               f"{flag} makes a partial result, which is never published over {_rel(RESULTS)}/ "
               "(drop --publish; it writes to runs/)" if a.publish and flag else None)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    a.results = RESULTS if a.publish else (a.out if a.out is not None else LOCAL)
    return a

# The tiny model of the demo (rlvr.train.demo): ~0.35M parameters, character tokenizer.
TINY_MODEL = ["model.hidden_size=128", "model.num_layers=2", "model.num_heads=4", "model.intermediate_size=256",
              "model.tie_embeddings=true"]


def setup(threads: int = 1) -> dict:
    """One torch thread (the machine is shared), quiet transformers; returns the run header."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    from rlvr.runtime import set_num_threads
    from rlvr.train.policy import quiet_transformers

    set_num_threads(threads)
    quiet_transformers()
    return {"command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "threads": threads,
            "load_average_start": [round(x, 2) for x in os.getloadavg()], "t0": time.perf_counter()}


def finish(name: str, header: dict, result: dict, plot=None, *, results: Path = LOCAL) -> Path:
    """Write results/name.json (header + result + wall time + load average at the end) and, with
    plot(path), results/name.png; `results` is parse_args's args.results. Returns the json path."""
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    h = dict(header)
    h["wall_s"] = round(time.perf_counter() - h.pop("t0"), 1)
    h["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out = results / f"{name}.json"
    out.write_text(json.dumps({**h, **result}, indent=1))
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        plot(results / f"{name}.png")
    print(f"wrote {out}" + (f" and {name}.png" if plot is not None else "") + f" ({h['wall_s']} s)", flush=True)
    return out


def rows(run_dir: Path) -> list[dict]:
    """The per-step metrics of a run (metrics.jsonl)."""
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def series(rs: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the steps that logged `key`."""
    pts = [(r["step"], r[key]) for r in rs if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def sft_checkpoint(tag: str, task, overrides: list[str], *, seed: int = 0, steps: int = 400,
                   stop_at_accuracy: float = 0.0, fresh: bool = False) -> Path:
    """Model directory of an SFT warm start on `task` (a TaskData), cached under runs/studies/sft-TAG-sSEED:
    a second study with the same tag and seed reuses it (fresh=True trains it again)."""
    from rlvr.config import load_config
    from rlvr.train.config import SFTConfig
    from rlvr.train.policy import resolve_model_dir
    from rlvr.train.sft import train_sft

    out = RUNS / f"sft-{tag}-s{seed}"
    done = out / "study_sft.json"
    if done.exists() and not fresh:
        return Path(json.loads(done.read_text())["model_dir"])
    cfg = load_config(SFTConfig, None, TINY_MODEL + [
        f"run.out_dir={out}", "run.overwrite=true", f"run.steps={steps}", f"run.seed={seed}", f"data.seed={seed}",
        "run.progress=false", "run.log_samples_every=0", "run.num_threads=1", "optim.lr=3e-3",
        "optim.warmup_steps=20", "algo.batch_size=64", "algo.aggregation=token_mean", *overrides])
    t = time.perf_counter()
    res = train_sft(cfg, data=task, stop_at_accuracy=stop_at_accuracy)
    model_dir = resolve_model_dir(res.run_dir)
    done.write_text(json.dumps({"model_dir": str(model_dir), "steps": res.steps,
                                "seconds": round(time.perf_counter() - t, 1)}))
    print(f"SFT {tag} seed {seed}: {res.steps} steps in {time.perf_counter() - t:.0f}s", flush=True)
    return model_dir


def rl_run(name: str, model_dir: Path, task, overrides: list[str], *, recipe: str = "grpo") -> list[dict]:
    """An `rlvr train` run (recipe as the base layer, then the overrides, as on the command line) from
    model_dir on `task`; returns its per-step metrics. The KL anchor is off unless an override sets it."""
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import train
    from rlvr.train.pg.recipes import get_recipe

    out = RUNS / name
    cfg = load_config(TrainConfig, None, TINY_MODEL + [
        f"model.init_from={model_dir}", f"run.out_dir={out}", "run.overwrite=true", "run.progress=false",
        "run.log_samples_every=0", "run.num_threads=1", "algo.kl_coef=0", *overrides], base=get_recipe(recipe))
    t = time.perf_counter()
    res = train(cfg, data=task)
    rs = rows(res.run_dir)
    print(f"  {name}: {cfg.run.steps} steps in {time.perf_counter() - t:.0f}s", flush=True)
    return rs


def with_splits(task, sft_examples: int, num_eval: int):
    """(sft_task, rl_task) as the demo splits one task: SFT on the first sft_examples training problems
    (validated on a slice of the rest), RL prompts from the rest, the held-out set for both."""
    pool = list(task.train[sft_examples:])
    sft_task = type(task)(**{**task.__dict__, "train": list(task.train[:sft_examples]), "eval": pool[:num_eval]})
    rl_task = type(task)(**{**task.__dict__, "train": pool})
    return sft_task, rl_task


def demo_start(seed: int = 0) -> tuple[Path, object]:
    """(SFT model dir, RL task) of the demo task (sums of four single digits, max 4 response tokens):
    the demo's SFT warm start (until 20% greedy accuracy on a validation slice), cached."""
    from rlvr.train.demo import DemoConfig, demo_task

    d = DemoConfig(seed=seed, progress=False)
    sft_task, rl_task = with_splits(demo_task(d), d.sft_examples, d.num_eval)
    model_dir = sft_checkpoint("demo", sft_task, [
        f"sampling.max_tokens={d.max_tokens}", f"run.eval_every={d.sft_eval_every}", "optim.schedule=constant",
        f"data.num_eval={d.num_eval}"], seed=seed, steps=d.sft_steps, stop_at_accuracy=d.sft_target_accuracy)
    return model_dir, rl_task


def demo_rl(name: str, model_dir: Path, task, overrides: list[str], *, steps: int, eval_every: int,
            n_prompts: int = 32, group_size: int = 8, lr: float = 5e-4, seed: int = 0, recipe: str = "grpo"):
    """An RL run on the demo task (max 4 response tokens, held-out greedy accuracy on 200 problems)."""
    return rl_run(name, model_dir, task, [
        f"run.steps={steps}", f"run.eval_every={eval_every}", f"run.seed={seed}", f"optim.lr={lr}",
        f"sampling.n_prompts={n_prompts}", f"sampling.group_size={group_size}", "sampling.max_tokens=4",
        "data.num_eval=200", *overrides], recipe=recipe)


_HELD_OUT: dict = {}


def held_out_accuracy(model_dir: Path, task, max_tokens: int, num_eval: int = 200) -> float:
    """Held-out greedy accuracy of a checkpoint (the step-0 point of a curve), once per checkpoint."""
    key = (str(model_dir), max_tokens, num_eval)
    if key not in _HELD_OUT:
        from rlvr.config import load_config
        from rlvr.models import load_policy
        from rlvr.rollout import build_generator
        from rlvr.train.config import TrainConfig
        from rlvr.train.tasks import eval_policy

        cfg = load_config(TrainConfig, None, [f"sampling.max_tokens={max_tokens}", f"data.num_eval={num_eval}"])
        model, tok = load_policy(model_dir)
        _HELD_OUT[key] = eval_policy(build_generator(cfg.rollout, model, tok, default_batch_size=256), task, cfg,
                                     greedy=True)["accuracy"]
    return _HELD_OUT[key]


def merge_previous(name: str, res: dict, header: dict, same: tuple[str, ...], key: str = "runs", *,
                   results: Path = LOCAL) -> dict:
    """--add: keep the per-seed results already in results/name.json (the directory the run writes to)
    next to the new ones (res[key] maps seed -> results); the stored run must have used the same settings
    (the res entries named in `same`)."""
    path = Path(results) / f"{name}.json"
    if not path.exists():
        return res
    old = json.loads(path.read_text())
    if any(old.get(k) != res.get(k) for k in same):
        raise SystemExit(f"--add: {path} was made with other settings ({', '.join(same)}); rerun without --add")
    res[key] = {**old[key], **res[key]}
    header["earlier_commands"] = [*old.get("earlier_commands", []), old["command"]]
    return res
