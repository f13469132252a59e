"""Shared plumbing of the config-driven commands (train, sft, eval, demo): YAML + dotted overrides
into a config dataclass, `--help` text generated from the field docs, clean error exits."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer


def keys_help(cls: type) -> str:
    """One line per config key, `key (default): doc`, for a command's --help (from field docs)."""
    from rlvr.config import config_rows

    lines = [f"  {key} ({default}): {doc}" for key, _tp, default, doc in config_rows(cls)]
    # "\b" keeps click/typer from re-wrapping the block into one paragraph.
    return "\b\nConfig keys (YAML file and/or key=value overrides):\n" + "\n".join(lines)


def with_keys_help(cls: type) -> Callable[[Callable], Callable]:
    """Decorator: append the generated key list of `cls` to a command's docstring."""

    def deco(fn: Callable) -> Callable:
        fn.__doc__ = (fn.__doc__ or "").rstrip() + "\n\n" + keys_help(cls)
        return fn

    return deco


def load_or_exit(
    cls: type,
    args: Sequence[str] | None,
    *,
    base: Mapping[str, Any] | None = None,
    extra: Sequence[str] = (),
):
    """Parse `[CONFIG.yaml] [key=value ...]` (+ extra overrides) into `cls`; on any config error
    print it and exit with status 2 before any work starts."""
    from rlvr.config import ConfigError, load_config, split_config_args

    try:
        path, overrides = split_config_args(args)
        return load_config(cls, path, [*overrides, *extra], base=base)
    except (ConfigError, KeyError, ValueError) as exc:
        fail(str(exc))


def load_run_config(
    cls: type,
    args: Sequence[str] | None,
    *,
    resume: Path | None,
    threads: int,
    base: Mapping[str, Any] | None = None,
):
    """The config of a training command (train, sft): `base` (e.g. a recipe) under the file and
    overrides, `--threads` as run.num_threads. A resumed run keeps the knobs it was started with (its
    config.yaml replaces `base`, and run.out_dir is the run directory); overrides may still change
    e.g. run.steps to train further."""
    from rlvr.config import split_config_args, to_dict

    if resume is not None:
        if not (resume / "config.yaml").exists():
            fail(f"--resume {resume}: no config.yaml there (not a run directory)")
        base = to_dict(load_or_exit(cls, [str(resume / "config.yaml")]))
        try:
            _, overrides = split_config_args(args)
        except ValueError as exc:
            fail(str(exc))
        for o in overrides:
            key, _, value = o.partition("=")
            if key.strip() == "run.out_dir" and Path(value.strip()).resolve() != resume.resolve():
                fail(f"--resume {resume} continues that run in place; run.out_dir={value.strip()} cannot move it "
                     "(copy the directory first, or drop run.out_dir)")
    extra = [f"run.num_threads={threads}"] if threads else []
    if resume is not None:
        extra.append(f"run.out_dir={resume}")
    cfg = load_or_exit(cls, args, base=base, extra=extra)
    _warn_ignored_model_keys(cfg)
    return cfg


# Keys that only shape a freshly built tiny model: with model.init_from the weights' own config wins.
_TINY_KEYS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "tie_embeddings")


def _warn_ignored_model_keys(cfg) -> None:
    m = getattr(cfg, "model", None)
    if m is None or not (m.init_from or m.name != "tiny"):
        return
    plain = type(m)()
    ignored = [k for k in _TINY_KEYS if getattr(m, k) != getattr(plain, k)]
    if ignored:
        src = f"model.init_from={m.init_from}" if m.init_from else f"model.name={m.name}"
        typer.echo(f"warning: {', '.join('model.' + k for k in ignored)} shape only a new tiny model; "
                   f"ignored with {src} (the model's own config.json decides)", err=True)


def run_trainer(fn, cfg, *, resume: bool, **kwargs):
    """Run a trainer (train, train_sft) with the command line's error policy: a config, data, model
    loading (rlvr.models.loading.ModelLoadError) or run-directory problem found before the run starts is `error: ...` exit 2; a run that diverged
    (NaN/inf), whose rollout engine failed (start, weight push, push check) or whose reward raised on
    most of a step's responses is `error: ...` exit 1;
    everything else is a bug and keeps its traceback."""
    from rlvr.config import ConfigError
    from rlvr.models.loading import ModelLoadError
    from rlvr.rewards.errors import RewardErrorsStop
    from rlvr.rollout.types import EngineError
    from rlvr.train.batching import BatchConfigError
    from rlvr.train.session import Interrupted, TrainingDiverged
    from rlvr.train.tasks import TaskDataError

    try:
        return fn(cfg, resume=resume, **kwargs)
    except Interrupted as exc:  # Ctrl-C / SIGTERM in the loop: the step's checkpoint is saved
        typer.echo(str(exc), err=True)
        raise typer.Exit(130) from None
    except KeyboardInterrupt:  # before the loop (loading, first sampling): nothing to save yet
        typer.echo("interrupted before training started: nothing was saved", err=True)
        raise typer.Exit(130) from None
    except (TrainingDiverged, EngineError, RewardErrorsStop) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except (ConfigError, BatchConfigError, TaskDataError, FileExistsError, FileNotFoundError,
            NotADirectoryError, ModelLoadError) as exc:
        fail(str(exc))


def report(result) -> None:
    """The last lines of a training command: held-out numbers (when there were any) and the run."""
    import math

    ev = result.eval or {}
    parts = []
    if "accuracy" in ev:
        parts.append(f"accuracy {ev['accuracy']:.1%}")
    fmt = ev.get("format_rate")
    if "accuracy" in ev:  # None / NaN: the reward has no format part, so a rate does not apply
        parts.append("format rate n/a" if fmt is None or math.isnan(fmt) else f"format rate {fmt:.1%}")
    if "len/mean" in ev:
        parts.append(f"mean length {ev['len/mean']:.1f}")
    typer.echo(f"held-out: {', '.join(parts)}" if parts else "held-out: not evaluated (no held-out problems)")
    typer.echo(f"run directory: {result.run_dir} (plots in {Path(result.run_dir) / 'plots'})")


def fail(message: str) -> None:
    """Print `error: message` to stderr and exit with status 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
