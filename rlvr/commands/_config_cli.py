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
    else:
        cfg = _with_run_task(cls, args, base, extra)
        _warn_ignored_model_keys(cfg)  # (a resumed run's config.yaml records the model's real shape)
    return cfg


def policy_positionals(args: list[str] | None) -> list[str]:
    """The natural spellings of the policy of `rlvr eval` / `rlvr filter`, as overrides: a run directory or
    checkpoint (`rlvr eval runs/grpo`) is `model.init_from=DIR`, a model folder (config.json) `model.name=DIR`,
    and a run's own config.yaml (`rlvr eval runs/grpo/config.yaml`: a trainer's dump, not an eval config) is
    `model.init_from=` its run. Everything else is passed on as it was."""
    from rlvr.train.run_settings import find_run_dir

    out = []
    for arg in args or ():
        p = Path(arg)
        if "=" not in arg and p.is_dir():
            if (p / "config.json").is_file():
                out.append(f"model.name={arg}")
                continue
            if find_run_dir(p) is None and not (p / "model" / "config.json").is_file():
                fail(f"{arg}: a directory, but neither a run directory (config.yaml) nor a checkpoint or model "
                     "folder (config.json)")
            out.append(f"model.init_from={arg}")
        elif p.name == "config.yaml" and p.is_file() and find_run_dir(p.parent) is not None:
            out.append(f"model.init_from={p.parent}")
        else:
            out.append(arg)
    return out


def load_from_run(cls: type, args: Sequence[str] | None, extra: Sequence[str], *, training: bool):
    """(config, run directory or None) of `rlvr eval` (training=False) or `rlvr filter` (training=True): when
    model.init_from is a run (or one of its checkpoints), the run's task and response settings
    (rlvr.train.run_settings) are the lowest layer under the file and overrides; a file or override naming
    another task drops the run's data section (it belongs to its own task). An evaluation's data.num_train is
    0 (it reads no training split)."""
    from rlvr.config import ConfigError
    from rlvr.train.common import resolve_model_dir
    from rlvr.train.config import DataConfig
    from rlvr.train.run_settings import NO_TRAIN, find_run_dir, run_settings

    plain = None if training else NO_TRAIN
    cfg = load_or_exit(cls, args, base=plain, extra=extra)
    if not cfg.model.init_from:
        return cfg, None
    try:
        resolve_model_dir(cfg.model.init_from)
    except FileNotFoundError as exc:
        fail(str(exc))
    run_dir = find_run_dir(cfg.model.init_from)
    if run_dir is None:
        return cfg, None
    try:
        base = run_settings(run_dir, training=training)
    except ConfigError as exc:
        fail(str(exc))
    cfg = load_or_exit(cls, args, base=base, extra=extra)
    if cfg.data.task != base["data"].get("task", DataConfig.task):
        base["data"] = dict((plain or {}).get("data", {}))
        cfg = load_or_exit(cls, args, base=base, extra=extra)
    return cfg, run_dir


def _dotted(mapping: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """{"data": {"task": "x"}, "algo.loss": "y"} -> {"data.task": "x", "algo.loss": "y"}."""
    out: dict[str, Any] = {}
    for key, value in (mapping or {}).items():
        if isinstance(value, Mapping):
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _init_from(cls: type, args: Sequence[str] | None, base: Mapping[str, Any] | None, extra: Sequence[str]) -> str:
    """model.init_from as the file and overrides set it ('' when unset, or when the config does not load: the
    full load reports that)."""
    from rlvr.config import ConfigError, load_config, split_config_args

    try:
        path, overrides = split_config_args(args)
        return getattr(getattr(load_config(cls, path, [*overrides, *extra], base=base), "model", None),
                       "init_from", "")
    except (ConfigError, KeyError, ValueError):
        pass
    try:  # a config that loads only with the run's settings: the override alone names the run
        _, overrides = split_config_args(args)
    except (ConfigError, ValueError):
        return ""
    found = [o.partition("=")[2].strip() for o in overrides if o.partition("=")[0].strip() == "model.init_from"]
    return found[-1] if found else ""


def _with_run_task(cls: type, args: Sequence[str] | None, base: Mapping[str, Any] | None, extra: Sequence[str]):
    """The config of a new run. When model.init_from is a run directory (or one of its checkpoints), the run's
    task and response settings (its data.* keys, sampling max_tokens / top_p / stop / keep_stop /
    thinking_budget / stop_thinking_text: what `rlvr eval` takes from it) are a layer above `base` (a recipe)
    and below the file and overrides, as `rlvr eval` and `rlvr filter` read them: `rlvr train
    model.init_from=runs/sft` trains and evaluates on the task the SFT run learned, not on the defaults. A
    file or override naming another task drops the run's data section (it belongs to its own task)."""
    import dataclasses
    import typing

    from rlvr.config import ConfigError
    from rlvr.train.config import DataConfig
    from rlvr.train.run_settings import find_run_dir, run_settings

    init_from = _init_from(cls, args, base, extra)
    run_dir = find_run_dir(init_from) if init_from else None
    if run_dir is None:
        return load_or_exit(cls, args, base=base, extra=extra)
    try:
        settings = run_settings(run_dir, training=True)
    except ConfigError as exc:
        fail(str(exc))
    sampling_keys = {f.name for f in dataclasses.fields(typing.get_type_hints(cls)["sampling"])}
    settings["sampling"] = {k: v for k, v in settings["sampling"].items() if k in sampling_keys}
    run_task = settings["data"].get("task", DataConfig.task)
    layered = {**_dotted(base), **_dotted(settings)}
    cfg = load_or_exit(cls, args, base=layered, extra=extra)
    taken = "task (data.*) and response settings (sampling.*)"
    if cfg.data.task != run_task:  # another task asked for: the run's data section is not its own
        layered = {**_dotted(base), **_dotted({"sampling": settings["sampling"]})}
        cfg = load_or_exit(cls, args, base=layered, extra=extra)
        taken = "response settings (sampling.*)"
    typer.echo(f"model.init_from={init_from}: the run's {taken} from {run_dir / 'config.yaml'} (a file or "
               "override still wins)", err=True)
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


def run_stage(fn, cfg, **kwargs):
    """Run a stage that is not a training loop (rlvr.train.filtering.filter_problems,
    rlvr.train.evaluation.evaluate_policy): bad input (config, data, model folder, positions) and an engine
    that failed are `error: ...` exit 2; everything else is a bug and keeps its traceback."""
    from rlvr.config import ConfigError
    from rlvr.rollout.types import EngineError
    from rlvr.train.tasks import TaskDataError

    try:
        return fn(cfg, **kwargs)
    except (ConfigError, TaskDataError, EngineError, OSError) as exc:
        fail(str(exc))


def report(result) -> None:
    """The last lines of a training command: held-out numbers (when there were any) and the run. A sharded
    run's ranks > 0 (torchrun's RANK) say nothing: rank 0 speaks for the run."""
    import math
    import os

    if int(os.environ.get("RANK", "0") or 0) > 0:
        return

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
