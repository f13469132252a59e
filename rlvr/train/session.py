"""What every trainer does around its loop, shared by `train` (pg.py), `train_sft` (sft.py) and
`train_ei` (ei.py):

    if (done := already_done(cfg, resume)) is not None:   # a finished run resumed: nothing to do
        return done
    cfg, model, tokenizer, task = start(cfg, data=data)    # threads, seeds, data files, model, task
    ...                                                    # the trainer's own objects
    with RunLoop(cfg, "train", resume=resume, ...) as loop:   # run dir, progress, Ctrl-C handler
        for step in range(loop.start_step + 1, cfg.run.steps + 1):
            ...
            loop.log(step, metrics, ...)
            loop.checkpoint(step, ...)                      # when due, then stop on a signal
    return loop.result(steps)

plus what they share between: status lines, a stop on a non-finite loss, the run's records
(TrainResult, Timer) and the metrics of a step's samples.

The stages that only sample (`evaluate_policy`, `filter_problems`, `distill`'s teacher) take the same kit
without a run directory: `sampling_model_source` (what an engine loads), `sampling_policy` (threads,
transformers quiet, the policy in eval mode), `check_prompts` (prompt + response budget within the model's
positions) and `sampler` (the stage's engine, one builder for every stage: rlvr.rollout.build_generator with
its errors as ConfigError).

RLVR_DEBUG_KILL_AT_STEP (`KILL_ENV`) is the one test hook in the trainers: SIGKILL the process right
after the checkpoint of that step is written, as a preempted job dies (tests/cli/test_train_resume.py
runs a trainer in a subprocess, so a monkeypatch cannot reach it).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr import rollout
from rlvr.config import ConfigError
from rlvr.data import get_task
from rlvr.data.task_data import TaskDataError
from rlvr.eval.reflection import reflection_rate
from rlvr.models.positions import check_positions as check_model_positions
from rlvr.rewards.errors import RewardErrorLog
from rlvr.rewards.judge import find_judge
from rlvr.rewards.types import Status, format_rate
from rlvr.rollout.types import sampled_length
from rlvr.runs import checkpoint as ckpt_mod
from rlvr.runs import plots
from rlvr.runs.checkpoint import latest_checkpoint
from rlvr.runs.progress import Progress
from rlvr.runs.rundir import (
    RunDir,
    check_not_in_use,
    check_run_config,
    check_run_target,
    hold_run_dir,
    read_jsonl,
)
from rlvr.runtime import seed_everything, set_num_threads
from rlvr.train.config.checks import error_text
from rlvr.train.policy import no_new_adapter, policy_from_config, quiet_transformers, resolve_model_dir
from rlvr.train.tasks import check_data_files, eval_examples, load_task_data

KILL_ENV = "RLVR_DEBUG_KILL_AT_STEP"


@dataclass
class TrainResult:
    """What a trainer returns: where the run is and its last metrics."""

    run_dir: Path
    steps: int
    last_metrics: dict[str, Any]
    eval: dict[str, float] = field(default_factory=dict)


class Timer:
    """Wall seconds per phase of a step: `with timer("generate"): ...` -> metrics time/generate."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.spent: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - t

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.spent.items()} | {"time/step": time.perf_counter() - self.t0}


class TrainingDiverged(RuntimeError):
    """A loss or gradient norm became NaN/inf; the run stopped before saving that step."""


class CheckpointFailed(RuntimeError):
    """A step's checkpoint could not be written (a full disk, an I/O error): the run stopped; the message says
    which step was lost, which checkpoint is intact and how to resume (the commands print it as `error: ...`,
    exit 1: rlvr.commands.config_cli.run_trainer)."""


def say(message: str, enabled: bool = True) -> None:
    """One status line on stderr (stdout stays for results)."""
    if enabled:
        print(message, file=sys.stderr, flush=True)


def checkpoint_step(run_dir: str | Path) -> int | None:
    """Step of the newest complete checkpoint of a run directory, None if it has none."""
    ckpt = latest_checkpoint(run_dir) if Path(run_dir).is_dir() else None
    return None if ckpt is None else int(ckpt.name.split("_")[-1])


def open_run(cfg, *, resume: bool, model, optimizer, scheduler, verbose: bool = True, extras=None):
    """(RunDir, start_step, trainer_state). Resume: load the newest checkpoint into model,
    optimizer and scheduler (RNG included), cut the logs back to it, and record the config as now
    resolved (e.g. a raised run.steps) in config.yaml. New run: create the directory; one that
    holds a run is refused unless run.overwrite, except a run that never reached its first
    checkpoint (a failed or interrupted start), which is replaced with a note."""
    r = cfg.run
    if resume:
        with hold_run_dir(r.out_dir):  # one writer: locked before the checkpoint is read and the logs cut back
            # a damaged newest checkpoint: the previous complete one, said (a sharded run's ranks read their own
            # files: there the message says how)
            fallback = model is None or not ckpt_mod.is_sharded_module(model)
            state = ckpt_mod.resume_checkpoint(r.out_dir, fallback=fallback, say=say, model=model,
                                               optimizer=optimizer, scheduler=scheduler, extras=extras)
            start = int(state["step"])
            run = RunDir.resume(r.out_dir, start, report_to=r.report_to)
        run.write_config(cfg)
        say(f"resuming {r.out_dir} at step {start} of {r.steps}", verbose)
        return run, start, state
    out = Path(r.out_dir)
    overwrite = r.overwrite
    if not overwrite and (out / "metrics.jsonl").exists() and checkpoint_step(out) is None:
        say(f"note: {out} holds a run that stopped before its first checkpoint; starting it over", verbose)
        overwrite = True
    run = RunDir.create(out, config=cfg, exist_ok=overwrite, report_to=r.report_to)
    return run, 0, {}


def refuse_existing_run(cfg) -> None:
    """Fail before any work when run.out_dir holds a run with a checkpoint and neither --resume nor
    run.overwrite was given (the message says both ways out)."""
    out = Path(cfg.run.out_dir)
    check_run_target(out, "run.out_dir=")  # a folder of other files (a user's config.yaml) is never written into
    if out.is_dir() and _rank0():
        check_not_in_use(out)  # a live run is never overwritten
    if cfg.run.overwrite or not out.is_dir():
        return
    step = checkpoint_step(out)
    if step is not None:
        raise FileExistsError(
            f"run.out_dir={out} already holds a run (checkpoint at step {step}): continue it with "
            f"--resume {out}, or start over with run.overwrite=true, or pick another run.out_dir"
        )


class Interrupted(KeyboardInterrupt):  # noqa: N818 - what the user did; no `except Exception` swallows it
    """SIGINT/SIGTERM stopped a run; the message says at which step, what was saved, how to resume.
    The commands print it and exit 130 (rlvr.commands.config_cli.run_trainer)."""


class StopOnSignal:
    """Ctrl-C (SIGINT) or SIGTERM during a training loop: the step in flight finishes, the loop saves
    a checkpoint of it and raises Interrupted (`stop.check`). A second signal abandons the step at
    once (Interrupted naming the last checkpoint, nothing new saved). Outside the main thread
    (signals cannot be caught there) this does nothing and the default behaviour stays."""

    def __init__(self, command: str = "train", verbose: bool = True):
        self.command, self.verbose = command, verbose
        self.requested: int | None = None  # the signal received, None while running
        self._old: dict[int, Any] = {}
        self.run_dir: Path | None = None
        self.last_ckpt = 0

    def install(self, run_dir, last_ckpt: int = 0) -> StopOnSignal:
        self.run_dir, self.last_ckpt = Path(run_dir), last_ckpt
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread
            self.restore()
        return self

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:  # the second one: do not wait for the step
            self.restore()
            kept = (f"the last checkpoint (step {self.last_ckpt}) is in {self.run_dir}; resume with: "
                    f"rlvr {self.command} --resume {self.run_dir}") if self.last_ckpt else "no checkpoint was saved"
            raise Interrupted(f"interrupted again: the step in flight was abandoned; {kept}")
        self.requested = signum
        say(f"{signal.Signals(signum).name}: stopping after the current step (its checkpoint is saved); "
            "press Ctrl-C again to stop at once without saving it", self.verbose)

    def saved(self, step: int) -> None:
        """The loop wrote the checkpoint of `step`."""
        self.last_ckpt = step

    def check(self, step: int) -> None:
        """After the step's checkpoint: raise Interrupted when a signal asked the run to stop."""
        if self.requested is not None:
            self.restore()
            raise Interrupted(f"interrupted at step {step}: checkpoint saved to {self.run_dir}; resume with: "
                              f"rlvr {self.command} --resume {self.run_dir}")


def _rank0() -> bool:
    """Not one of a sharded run's ranks > 0 (torchrun's RANK): those never write the run directory."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def resume_advice(command: str, run_dir, intact) -> str:
    """What to do after a checkpoint could not be written: resume from `intact`, or start over."""
    if intact is None:
        return f"Free space (or fix the cause) and start the run over: rlvr {command} ... run.overwrite=true"
    return f"Free space (or fix the cause) and resume with: rlvr {command} --resume {run_dir}"


def check_finite(step: int, **values: float | None) -> None:
    """Raise TrainingDiverged naming the step and the quantity when any value is NaN or inf."""
    bad = {k: v for k, v in values.items() if v is not None and not math.isfinite(v)}
    if bad:
        what = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise TrainingDiverged(
            f"step {step}: {what}; the run stopped before saving this step (its last checkpoint is "
            "intact). Lower optim.lr, keep optim.grad_clip > 0, or train in float32"
        )


def maybe_die_after_checkpoint(step: int, run) -> None:
    """The resume test's hook (KILL_ENV, the module docstring): die like a preempted job."""
    kill_at = int(os.environ.get(KILL_ENV, "0") or 0)
    if kill_at and step == kill_at:
        run.close()
        os.kill(os.getpid(), signal.SIGKILL)


def model_source(mcfg) -> str | None:
    """Folder or hub id the policy's weights came from (vLLM loads it first), None for a policy
    built in memory (the tiny model) or loaded from its run's checkpoint (a resume whose model.init_from is
    gone: resume_weights; the engine then takes the weights in memory)."""
    if mcfg.init_from:
        return str(resolve_model_dir(mcfg.init_from)) if Path(mcfg.init_from).exists() else None
    return None if mcfg.name == "tiny" else mcfg.name


def check_positions(model, tokenizer, task, cfg, *, train: bool = True) -> None:
    """Before any work: the longest prompt (of the training problems when `train`, and of the held-out ones)
    plus the response budget (sampling.max_tokens, and sampling.thinking_budget when on) fits the model's
    positions, else ConfigError naming the keys (rlvr.models.positions). Multi-turn environments (whose
    episodes have their own budget, data.env_max_tokens) are not checked here."""
    if getattr(task, "env", None) is not None:
        return
    s = cfg.sampling
    tokens, keys = s.max_tokens, f"sampling.max_tokens={s.max_tokens}"
    if s.thinking_budget > 0:
        tokens, keys = tokens + s.thinking_budget, f"{keys} + sampling.thinking_budget={s.thinking_budget}"
    examples = [*(task.train if train else ()), *eval_examples(task, cfg.data.num_eval)]
    prompts = [(str(getattr(ex, "id", i)), task.prompt(ex)) for i, ex in enumerate(examples)]
    m = cfg.model
    check_model_positions(model, tokenizer, prompts, tokens, response_keys=keys,
          model_desc=f"model.init_from={m.init_from}" if m.init_from else f"model.name={m.name}")


def sampling_model_source(mcfg) -> str | None:
    """What an engine loads for a stage that samples (eval, filter): model.init_from's model folder (a run
    directory: its latest checkpoint; FileNotFoundError before any work when it is not there), the hub id or
    folder of model.name, or None for the tiny model built in memory."""
    if mcfg.init_from:
        return str(resolve_model_dir(mcfg.init_from))
    return None if mcfg.name == "tiny" else mcfg.name


def sampling_policy(mcfg, *, seed: int, threads: int, source: str | None):
    """(model, tokenizer) of a stage that samples: torch threads set (0 = RLVR_NUM_THREADS or torch's
    default), transformers quiet, the policy of `mcfg` loaded without a new LoRA adapter and in eval mode; a
    model that cannot load is a ConfigError. `source`: sampling_model_source(mcfg), for the message."""
    set_num_threads(threads or None)
    quiet_transformers()
    say(f"loading model {source or 'tiny (fresh random weights)'} ...")
    try:
        model, tokenizer = policy_from_config(no_new_adapter(mcfg), seed=seed)
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    model.eval()
    return model, tokenizer


def check_prompts(model, tokenizer, mcfg, prompts, tokens: int, keys: str) -> None:
    """Before any sampling: every (id, prompt) of `prompts` plus `tokens` response tokens (the budget, named by
    `keys`) fits the model's positions, else ConfigError naming the keys and the model (rlvr.models.positions)."""
    check_model_positions(model, tokenizer, prompts, tokens, response_keys=keys,
                          model_desc=f"model.init_from={mcfg.init_from}" if mcfg.init_from else f"model.name={mcfg.name}")


def sampler(rcfg, model, tokenizer, *, model_source: str | None, seed: int, batch_size: int):
    """A stage's engine (rlvr.rollout.build_generator: rollout.backend hf or vllm) on `model`: an engine other
    than hf is said as it starts; an unknown backend, a missing package or a bad setting is a ConfigError."""
    if rcfg.backend != "hf":
        say(f"starting the {rcfg.backend} engine ...")
    try:
        return rollout.build_generator(rcfg, model, tokenizer, model_source=model_source, seed=seed,
                                       default_batch_size=batch_size)
    except (KeyError, ImportError, ValueError) as exc:
        raise ConfigError(error_text(exc)) from None


def record_model_shape(cfg, model):
    """The config a run records (config.yaml) with the model's real shape: with model.init_from or a model
    folder / hub id the tiny-model keys (hidden_size, num_layers, num_heads, intermediate_size,
    tie_embeddings) shape nothing, so config.yaml takes them from the model that was trained rather than
    from the command line. A key the model's config does not state keeps its default."""
    m = cfg.model
    if not (m.init_from or m.name != "tiny"):
        return cfg
    c = getattr(model, "config", None)
    real = {"hidden_size": getattr(c, "hidden_size", None), "num_layers": getattr(c, "num_hidden_layers", None),
            "num_heads": getattr(c, "num_attention_heads", None),
            "intermediate_size": getattr(c, "intermediate_size", None), "tie_embeddings": getattr(c, "tie_word_embeddings", None)}
    plain = type(m)()
    shape = {k: (v if type(v) is type(getattr(plain, k)) else getattr(plain, k)) for k, v in real.items()}
    return dataclasses.replace(cfg, model=dataclasses.replace(m, **shape))


def warn_repeated_problems(task, cfg) -> None:
    """A step of more prompts than there are training problems holds some problem twice (the shuffled stream
    wraps within the step): said once at the start, instead of nothing."""
    n, have = cfg.sampling.n_prompts, len(task.train)
    if n > have:
        d = cfg.data
        source = f"data.train_path={d.train_path}" if d.train_path else f"task {task.name}"
        say(f"warning: sampling.n_prompts={n} is more than the {have} training problems ({source}): every step "
            f"samples some problems more than once; lower sampling.n_prompts to at most {have} or give more "
            "problems (data.num_train, data.train_path)")


def evaluation_plan(task, cfg) -> str | None:
    """What a trainer evaluates on, in the words of `rlvr eval`'s header: the task, template, reward, how many
    held-out problems, the decoding and when; None when the task has no held-out problems (the trainers say
    that in a note of their own)."""
    examples = eval_examples(task, cfg.data.num_eval)
    if not examples:
        return None
    if getattr(task, "env", None) is not None:
        reward = f"the {cfg.data.env} environment's"
    else:
        try:
            reward = cfg.data.reward or get_task(cfg.data.task).reward_name(task.template)
        except KeyError:
            reward = cfg.data.reward or "the task's"
    count = f"{len(examples)} held-out problems" + (
        f" (first {len(examples)} of {len(task.eval)})" if len(examples) < len(task.eval) else "")
    r, s = cfg.run, cfg.sampling
    mode = "greedy" if r.eval_greedy else f"sampled T={r.eval_temperature:g}"
    stop = tuple(dict.fromkeys((*task.stop, *s.stop)))
    decoding = f"{mode}, max_tokens={s.max_tokens}" + (f", stop={','.join(repr(x) for x in stop)}" if stop else "")
    when = f"every {r.eval_every} steps and after the last" if r.eval_every and r.eval_every < r.steps else "after the last step"
    source = f"data.eval_path={cfg.data.eval_path}" if cfg.data.eval_path else "the task's held-out split"
    return (f"evaluates on {task.name} (template {task.template}, reward {reward}): {count} from {source}, "
            f"{decoding}, {when}")


def say_final_evaluation(task, cfg) -> None:
    """The line before a trainer's last evaluation, which can take longer than a training step."""
    if n := len(eval_examples(task, cfg.data.num_eval)):
        say(f"evaluating {n} held-out problems ...", cfg.run.progress)


def last_metrics(run_dir: str | Path) -> dict[str, Any]:
    """The last row of a run's metrics.jsonl ({} if none)."""
    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    return rows[-1] if rows else {}


# ------------------------------------------------------------------------------ start and end


def already_done(cfg, resume: bool) -> TrainResult | None:
    """Checks of the run directory before any work: a finished run resumed returns its TrainResult at once
    ("nothing to do"); a run to resume must have a checkpoint; a new run must not overwrite one."""
    out = Path(cfg.run.out_dir)
    if not resume:
        refuse_existing_run(cfg)
        return None
    if _rank0():
        check_not_in_use(out)  # the run is alive: a second writer would cut its logs back under it
    check_run_config(out)  # an empty or unreadable config.yaml is an error, never "every default"
    step = checkpoint_step(out)
    if step is None:
        raise FileNotFoundError(f"--resume {out}: no checkpoint to resume from (the run stopped before its "
                                "first checkpoint); start it over with run.overwrite=true")
    if step >= cfg.run.steps:
        say(f"nothing to do: {out} is at step {step} and run.steps={cfg.run.steps} "
            "(raise run.steps to train further)")
        last = last_metrics(out)
        return TrainResult(run_dir=out, steps=step, last_metrics=last,
                           eval={k[5:]: v for k, v in last.items() if k.startswith("eval/")})
    return None


def start(cfg, *, data=None, train: bool = True, rl: bool = True, episodes: bool = False, resume: bool = False,
          reference_kept: bool = True, judge=None, external=None):
    """(cfg, model, tokenizer, task) of a run about to start: threads and seeds set, every bad line of the
    data files reported before the model loads (unless `data`, a TaskData, replaces cfg.data), the policy
    loaded and its shape recorded in cfg, the task loaded (train: with its training split; episodes: data.env
    allowed). rl: the task must have training problems, whose prompts plus the response budget must fit the
    model's positions (else only the held-out ones are checked), and a step larger than the problems is
    warned about. resume: a model.init_from that is gone is replaced by the run's own checkpoint
    (resume_weights; reference_kept: the run directory holds what its KL reference needs). judge: the judge
    section of a stage that has one (rlvr train: TrainConfig.judge), for data.reward=judge. external: `rlvr
    train`'s external section (data.env=external / verifiers:<env>)."""
    r = cfg.run
    set_num_threads(r.num_threads or None)
    seed_everything(r.seed)
    quiet_transformers()
    if data is None:
        check_data_files(cfg.data, train=train)
    mcfg = cfg.model
    if resume and (weights := resume_weights(cfg, reference_kept=reference_kept)) is not None:
        say(f"note: model.init_from={cfg.model.init_from} is gone; the policy is loaded from the run's checkpoint "
            f"{weights.parent.name} (its weights are every one the run trains)", True)
        mcfg = dataclasses.replace(cfg.model, init_from=str(weights))
    say(f"loading model {mcfg.init_from or mcfg.name} ...", r.progress)
    model, tokenizer = policy_from_config(mcfg, seed=r.seed)
    cfg = record_model_shape(cfg, model)  # config.yaml records the shape that was trained
    kw = {"episodes": True, "external": external} if episodes else {}
    if judge is not None:  # the judge section (rlvr train's): data.reward=judge puts its judge in the reward
        kw |= {"judge": judge, "judge_device": cfg.model.device}
    task = data if data is not None else load_task_data(cfg.data, tokenizer, train=train, **kw)
    if rl and not task.train:
        raise TaskDataError(f"data: task {task.name!r} has no training examples")
    check_positions(model, tokenizer, task, cfg, train=rl)  # prompt + max_tokens within the model's positions
    if rl:
        warn_repeated_problems(task, cfg)
    return cfg, model, tokenizer, task


def resume_weights(cfg, *, reference_kept: bool = True) -> Path | None:
    """The model folder a resumed run loads its policy from when model.init_from (the start run or folder) is
    gone: the run's newest complete checkpoint whose model folder is a full model (the checkpoint then loads
    every weight into it), so a resume needs only the run directory; None when init_from is unset or still
    there (it is loaded as at the start), or for a LoRA policy (its checkpoints hold adapters over a base).
    reference_kept False (a KL reference that is the start policy, of a run made before the reference was
    kept in the run directory) is a ConfigError: nothing holds the reference any more."""
    src = cfg.model.init_from
    if not src or Path(src).exists() or cfg.model.lora_rank > 0:
        return None
    run = Path(cfg.run.out_dir)
    if not reference_kept:
        raise ConfigError(f"model.init_from={src} is gone, and the run {run} holds no copy of its start policy "
                          "(its KL reference, algo.kl_coef > 0): give model.init_from=<a copy of that model> to "
                          "resume")
    for ckpt in reversed(ckpt_mod.list_checkpoints(run)):
        if (ckpt / "model" / "config.json").is_file():
            return ckpt / "model"
    return None


class RunLoop:
    """The run directory, progress line and Ctrl-C handler around a trainer's loop (a context manager).

    On entry the run directory is opened (open_run: new, replaced, or resumed at its checkpoint into model,
    optimizer, scheduler and `extras`), what the run evaluates on is said, the progress line and the signal
    handler start; on exit they are restored and closed, and so is every function given to `on_close`."""

    writes = True  # this process writes the run directory (a sharded run's ranks > 0 do not: FollowerLoop)

    def __init__(self, cfg, command: str, *, resume: bool, model, tokenizer, optimizer, scheduler, task,
                 extras: dict | None = None):
        self.cfg, self.command, self.resume, self.task = cfg, command, resume, task
        self.model, self.tokenizer, self.optimizer, self.scheduler = model, tokenizer, optimizer, scheduler
        self.extras = extras or None
        self.last: dict[str, Any] = {}
        self._closers: list[Callable[[], None]] = []

    def __enter__(self) -> RunLoop:
        r = self.cfg.run
        self.run, self.start_step, self.state = open_run(self.cfg, resume=self.resume, model=self.model,
                                                         optimizer=self.optimizer, scheduler=self.scheduler,
                                                         verbose=r.progress, extras=self.extras)
        if (what := evaluation_plan(self.task, self.cfg)) is not None:
            say(what, r.progress)
        elif not self.task.eval:
            say("note: no held-out problems (set data.eval_path): the run is not evaluated", r.progress)
        name = {"train": "rl"}.get(self.command, self.command)
        self.progress = Progress(r.steps, name, start=self.start_step, mode=None if r.progress else "off")
        self.stop = StopOnSignal(self.command, r.progress).install(self.run.path, self.start_step)
        return self

    def on_close(self, fn: Callable[[], None]) -> None:
        self._closers.append(fn)

    def __exit__(self, *exc) -> None:
        self.stop.restore()
        self.progress.close()
        self.run.close(failed=exc[0] is not None)
        for fn in self._closers:
            fn()

    @property
    def path(self) -> Path:
        return self.run.path

    def due(self, step: int, every: int) -> bool:
        """A periodic action (run.eval_every, run.log_samples_every) at `step`: every `every` steps
        (0 = never) and at the last step."""
        return bool(every and step % every == 0) or step == self.cfg.run.steps

    def log(self, step: int, metrics: dict, on_step: Callable[[int, dict], None] | None = None, **shown) -> dict:
        """Append the step's metrics to metrics.jsonl, move the progress line (with `shown` fields), call
        on_step; returns the logged row."""
        self.last = self.run.log_metrics(step, metrics)
        self.progress.update(1, **shown)
        if on_step is not None:
            on_step(step, metrics)
        return self.last

    def checkpoint(self, step: int, trainer_state: dict, *, force: bool = False) -> bool:
        """Save a checkpoint when due (the last step, every run.checkpoint_every, a signal received, or
        `force`); returns whether one was saved. Then the resume test's kill hook."""
        if not self.checkpoint_due(step, force):
            return False
        self.save(step, trainer_state)
        self.stop.saved(step)
        maybe_die_after_checkpoint(step, self.run)
        return True

    def checkpoint_due(self, step: int, force: bool = False) -> bool:
        r = self.cfg.run
        return bool(force or step == r.steps or (r.checkpoint_every and step % r.checkpoint_every == 0)
                    or self.stop.requested)

    def save(self, step: int, trainer_state: dict) -> None:
        try:
            ckpt_mod.save_checkpoint(self.run, step, model=self.model, tokenizer=self.tokenizer,
                                     optimizer=self.optimizer, scheduler=self.scheduler, trainer_state=trainer_state,
                                     keep=self.cfg.run.keep_checkpoints, extras=self.extras)
        except ckpt_mod.CheckpointSaveError as exc:
            raise CheckpointFailed(f"{exc}. {resume_advice(self.command, self.run.path, exc.intact)}") from exc

    def result(self, steps: int) -> TrainResult:
        """The run's TrainResult after the loop: the final held-out evaluation, plots (finish_run)."""
        return TrainResult(run_dir=self.run.path, steps=steps, last_metrics=self.last,
                           eval=finish_run(self.run.path, self.last))


# --------------------------------------------------------------------------- shared by train and ei


def reward_error_log(data_cfg, task, run_dir) -> RewardErrorLog:
    """The run's rlvr.rewards.errors.RewardErrorLog: each distinct message of an ERROR reward is printed
    once and every step's are appended to <run>/reward_errors.jsonl; a step where most rewards are errors
    stops the run (RewardErrorsStop) naming the reward (shared by `rlvr train` and `rlvr ei`). With a model
    judge in the reward (data.reward=judge), its failed requests are said and checked too: the first failure
    is printed, a step where most requests failed stops the run (JudgeFailuresStop)."""
    spec = data_cfg.reward or (task.reward_fn if isinstance(task.reward_fn, str) else "")
    if not spec:
        try:
            spec = get_task(data_cfg.task).reward_name(getattr(task, "template", None) or None)
        except (KeyError, ValueError, AttributeError):
            spec = getattr(task.reward_fn, "__name__", None) or f"of task {task.name}"
    key = "data.reward" if data_cfg.reward else ""
    judge = find_judge(task.reward_fn)
    if run_dir is None:  # a sharded run's ranks > 0: rank 0 prints and logs; these only stop with it
        return RewardErrorLog(str(spec), None, key=key, say=lambda _msg: None, judge=judge)
    return RewardErrorLog(str(spec), Path(run_dir) / "reward_errors.jsonl", key=key, judge=judge)


def sample_metrics(rewards, rollouts) -> dict[str, Any]:
    """Reward parts, accuracy, format rate and lengths of a step's samples (shared by `rlvr train` and
    `rlvr ei`): reward/<part>, accuracy, format_rate (only when the reward has a format part: the
    definition of rlvr.rewards.types.format_rate), len/mean, len/correct, len/incorrect (the tokens the policy
    sampled, rlvr.rollout.types.sampled_length; None when no such sample), len/truncated_frac."""
    n = len(rewards)
    m: dict[str, Any] = {}
    for p in sorted({k for r in rewards for k in r.parts}):
        m[f"reward/{p}"] = sum(float(r.parts.get(p, 0.0)) for r in rewards) / n
    correct = [r.status is Status.CORRECT for r in rewards]
    m["accuracy"] = sum(correct) / n
    fmt = format_rate([r.parts for r in rewards])
    if not math.isnan(fmt):  # a reward without a format part: no format rate (eval prints "n/a")
        m["format_rate"] = fmt
    lens = [sampled_length(ro) for ro in rollouts]  # the policy's tokens: not forced text or tool output
    m["len/mean"] = sum(lens) / n
    lc = [x for x, c in zip(lens, correct, strict=True) if c]
    li = [x for x, c in zip(lens, correct, strict=True) if not c]
    m["len/correct"] = sum(lc) / len(lc) if lc else None
    m["len/incorrect"] = sum(li) / len(li) if li else None
    m["len/truncated_frac"] = sum(ro.finish_reason == "length" for ro in rollouts) / n
    m["text/reflection_rate"] = reflection_rate([ro.text for ro in rollouts])  # "wait", "let me check", ...
    return m


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# ------------------------------------------------------------------- run end, data order and seeds


def eval_prefixed(metrics: dict[str, float], name: str = "eval") -> dict[str, float]:
    """Evaluation metrics as logged during training: under eval/ (finish_run drops the prefix again);
    name="val" for a check on a validation slice of the training split (the demo's SFT stopping check),
    so that it cannot be read as the held-out figure."""
    return {f"{name}/{k}": v for k, v in metrics.items()}


def finish_run(run_path: Path, last_metrics: dict[str, Any]) -> dict[str, float]:
    """End of a trainer: write the run's plots and return the final evaluation (the eval/* metrics
    of the last step, prefix dropped). A plot failure must not lose a finished run: it only warns."""
    try:
        plots.plot_run(run_path)
    except Exception as exc:  # noqa: BLE001 - see docstring
        print(f"warning: plotting failed: {exc}")
    return {k[len("eval/") :]: v for k, v in last_metrics.items() if k.startswith("eval/")}


def data_order(n: int, seed: int, epoch: int) -> list[int]:
    """Permutation of range(n) for one pass over the data; a pure function of (seed, epoch)."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


@functools.lru_cache(maxsize=4)
def _data_order_cached(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    # every step of a run reads the same epoch's order: shuffle it once, not once per step
    return tuple(data_order(n, seed, epoch))


def take(items: Sequence[Any], position: int, count: int, seed: int) -> list[Any]:
    """`count` items starting at global position `position` of the endless shuffled stream
    (epoch e uses data_order(n, seed, e)). The data position saved in checkpoints is `position`."""
    n = len(items)
    if n == 0:
        raise ValueError("no training examples")
    out = []
    cache: dict[int, list[int]] = {}
    for k in range(position, position + count):
        epoch, i = divmod(k, n)
        if epoch not in cache:
            cache[epoch] = _data_order_cached(n, seed, epoch)
        out.append(items[cache[epoch][i]])
    return out


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of RL step `step`: a pure function of (run seed, step), so a resumed run
    samples exactly what an uninterrupted one would."""
    return (seed * 1_000_003 + step * 7919 + 17) % (2**31 - 1)
