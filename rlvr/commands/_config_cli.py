"""Shared plumbing of the config-driven commands (train, sft, eval, demo): YAML + dotted overrides
into a config dataclass, `--help` text generated from the field docs, clean error exits."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


def fail(message: str) -> None:
    """Print `error: message` to stderr and exit with status 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
