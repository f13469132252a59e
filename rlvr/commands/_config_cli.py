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
    from rlvr.config import to_dict

    if resume is not None:
        if not (resume / "config.yaml").exists():
            fail(f"--resume {resume}: no config.yaml there (not a run directory)")
        base = to_dict(load_or_exit(cls, [str(resume / "config.yaml")]))
    extra = [f"run.num_threads={threads}"] if threads else []
    if resume is not None:
        extra.append(f"run.out_dir={resume}")
    return load_or_exit(cls, args, base=base, extra=extra)


def fail(message: str) -> None:
    """Print `error: message` to stderr and exit with status 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
