"""What every trainer does around its loop: say what is loading, open the run directory when the
run really starts (new, replaced, or resumed at its checkpoint), stop on a non-finite loss, and
the resume test's kill hook. Shared by `train` (pg.py) and `train_sft` (sft.py).
"""

from __future__ import annotations

import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

# Test hook, outside the user's config: SIGKILL the process right after the checkpoint of this
# step is written, as a preempted job dies (tests/test_train_resume.py).
KILL_ENV = "RLVR_DEBUG_KILL_AT_STEP"


class TrainingDiverged(RuntimeError):
    """A loss or gradient norm became NaN/inf; the run stopped before saving that step."""


def say(message: str, enabled: bool = True) -> None:
    """One status line on stderr (stdout stays for results)."""
    if enabled:
        print(message, file=sys.stderr, flush=True)


def checkpoint_step(run_dir: str | Path) -> int | None:
    """Step of the newest complete checkpoint of a run directory, None if it has none."""
    from rlvr.runs.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir) if Path(run_dir).is_dir() else None
    return None if ckpt is None else int(ckpt.name.split("_")[-1])


def open_run(cfg, *, resume: bool, model, optimizer, scheduler, verbose: bool = True, extras=None):
    """(RunDir, start_step, trainer_state). Resume: load the newest checkpoint into model,
    optimizer and scheduler (RNG included), cut the logs back to it, and record the config as now
    resolved (e.g. a raised run.steps) in config.yaml. New run: create the directory; one that
    holds a run is refused unless run.overwrite, except a run that never reached its first
    checkpoint (a failed or interrupted start), which is replaced with a note."""
    from rlvr.runs import checkpoint as ckpt_mod
    from rlvr.runs.rundir import RunDir

    r = cfg.run
    if resume:
        state = ckpt_mod.load_checkpoint(r.out_dir, model=model, optimizer=optimizer, scheduler=scheduler,
                                         extras=extras)
        start = int(state["step"])
        run = RunDir.resume(r.out_dir, start)
        run.write_config(cfg)
        say(f"resuming {r.out_dir} at step {start} of {r.steps}", verbose)
        return run, start, state
    out = Path(r.out_dir)
    overwrite = r.overwrite
    if not overwrite and (out / "metrics.jsonl").exists() and checkpoint_step(out) is None:
        say(f"note: {out} holds a run that stopped before its first checkpoint; starting it over", verbose)
        overwrite = True
    run = RunDir.create(out, config=cfg, exist_ok=overwrite)
    return run, 0, {}


def refuse_existing_run(cfg) -> None:
    """Fail before any work when run.out_dir holds a run with a checkpoint and neither --resume nor
    run.overwrite was given (the message says both ways out)."""
    out = Path(cfg.run.out_dir)
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
    The commands print it and exit 130 (rlvr.commands._config_cli.run_trainer)."""


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
    """The resume test's hook (RLVR_DEBUG_KILL_AT_STEP): die like a preempted job."""
    kill_at = int(os.environ.get(KILL_ENV, "0") or 0)
    if kill_at and step == kill_at:
        run.close()
        os.kill(os.getpid(), signal.SIGKILL)


def model_source(mcfg) -> str | None:
    """Folder or hub id the policy's weights came from (vLLM loads it first), None for a policy
    built in memory (the tiny model)."""
    if mcfg.init_from:
        from rlvr.train.common import resolve_model_dir

        return str(resolve_model_dir(mcfg.init_from))
    return None if mcfg.name == "tiny" else mcfg.name


def check_positions(model, tokenizer, task, cfg, *, train: bool = True) -> None:
    """Before any work: the longest prompt (of the training problems when `train`, and of the held-out ones)
    plus the response budget (sampling.max_tokens, and sampling.thinking_budget when on) fits the model's
    positions, else ConfigError naming the keys (rlvr.models.positions). Multi-turn environments (whose
    episodes have their own budget, data.env_max_tokens) are not checked here."""
    from rlvr.models.positions import check_positions as check
    from rlvr.train.tasks import eval_examples

    if getattr(task, "env", None) is not None:
        return
    s = cfg.sampling
    tokens, keys = s.max_tokens, f"sampling.max_tokens={s.max_tokens}"
    if getattr(s, "thinking_budget", -1) > 0:
        tokens, keys = tokens + s.thinking_budget, f"{keys} + sampling.thinking_budget={s.thinking_budget}"
    examples = [*(task.train if train else ()), *eval_examples(task, cfg.data.num_eval)]
    prompts = [(str(getattr(ex, "id", i)), task.prompt(ex)) for i, ex in enumerate(examples)]
    m = cfg.model
    check(model, tokenizer, prompts, tokens, response_keys=keys,
          model_desc=f"model.init_from={m.init_from}" if m.init_from else f"model.name={m.name}")


def record_model_shape(cfg, model):
    """The config a run records (config.yaml) with the model's real shape: with model.init_from or a model
    folder / hub id the tiny-model keys (hidden_size, num_layers, num_heads, intermediate_size,
    tie_embeddings) shape nothing, and config.yaml used to record what the command line said instead of
    what was trained. A key the model's config does not state keeps its default."""
    import dataclasses

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
    from rlvr.train.tasks import eval_examples

    examples = eval_examples(task, cfg.data.num_eval)
    if not examples:
        return None
    if getattr(task, "env", None) is not None:
        reward = f"the {cfg.data.env} environment's"
    else:
        try:
            from rlvr.data import get_task

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
    from rlvr.train.tasks import eval_examples

    if n := len(eval_examples(task, cfg.data.num_eval)):
        say(f"evaluating {n} held-out problems ...", cfg.run.progress)


def last_metrics(run_dir: str | Path) -> dict[str, Any]:
    """The last row of a run's metrics.jsonl ({} if none)."""
    from rlvr.runs.rundir import read_jsonl

    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    return rows[-1] if rows else {}
