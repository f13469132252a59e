"""The validation kit of the config sections (torch-free: torch is imported only to check a non-CPU device).

Each section's validate() runs right after parsing (rlvr.config calls it), so a wrong name or a value out of
range fails naming its dotted key before any model or data work, not as a traceback from deep inside the
trainer. `Checks` collects one section's problems, one line each naming the dotted key, and raises them
together; `changed` / `default_of` tell a key the user set from its class default (a key at its default is
never refused as inert).

Names: a closed set is a `Literal` field (the loader refuses a value outside it; `Checks.choices` does the same
for a section built in Python, in the same words); an open set (a registry users add to: a loss, an advantage,
a task, an environment) is a `str` checked with `Checks.one_of` against the live registry, imported inside the
check: `rlvr --help` must not pay for torch. The built-in names of the rlvr.algo registries are in
rlvr.algo.names (torch-free).
"""

from __future__ import annotations

import functools
import re
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Literal

from rlvr.config import ConfigError, choice_problem, field_metadata, unknown_choice


def default_of(section, name: str):
    """The class default of a section's field (a key at its default is never refused as inert)."""
    f = next(f for f in fields(section) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default


def changed(section, name: str) -> bool:
    """Whether section.<name> was set to something other than its default."""
    return getattr(section, name) != default_of(section, name)


class Checks:
    """The problems of one section, one line each naming the dotted key; done() raises them together."""

    def __init__(self, section: str):
        self.section = section
        self.errors: list[str] = []

    def error(self, message: str) -> None:
        self.errors.append(message)

    def one_of(self, name: str, value: object, known) -> bool:
        """An open set of names (a registry, read live: users may have added to it)."""
        if value in known:
            return True
        self.error(unknown_choice(f"{self.section}.{name}", value, list(known)))
        return False

    def choices(self, section) -> None:
        """The values of the section's `Literal` fields (its closed choice sets). load_config has refused a loaded
        config's already; this is for a section built in Python, in the loader's words (rlvr.config.choice_problem)."""
        cls = type(section)
        for name, tp in _literal_fields(cls):
            problem = choice_problem(f"{self.section}.{name}", getattr(section, name), tp,
                                     field_metadata(cls, name).get("refused"))
            if problem is not None:
                self.error(problem)

    def need(self, name: str, value: object, ok: bool, want: str) -> None:
        if not ok:
            self.error(f"{self.section}.{name}={value!r} must be {want}")

    def at_least(self, name: str, value: float, low: float) -> None:
        self.need(name, value, value >= low, f">= {low}")

    def fraction(self, name: str, value: float) -> None:
        """A value in (0, 1]: top_p, a memory fraction."""
        self.need(name, value, 0 < value <= 1, "in (0, 1]")

    def device(self, name: str, device: str) -> None:
        problem = _device_problem(f"{self.section}.{name}", device)
        if problem:
            self.error(problem)

    def file(self, name: str, path: str) -> None:
        if path and not Path(path).is_file():
            what = "is a directory, not a file" if Path(path).is_dir() else "no such file"
            self.error(f"{self.section}.{name}={path}: {what}")

    def done(self) -> None:
        if self.errors:
            raise ConfigError(self.errors)


@functools.cache
def _literal_fields(cls: type) -> tuple[tuple[str, object], ...]:
    """(name, Literal type) of each closed-choice field of a section class."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields(cls) if typing.get_origin(hints[f.name]) is Literal)


def _device_problem(key: str, device: str) -> str | None:
    """Why `device` cannot hold a model here, or None. torch is imported only for a non-CPU device."""
    if device == "cpu":
        return None
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if m is None and device != "mps":
        return f"{key}={device!r} is unknown; known: 'cpu', 'cuda', 'cuda:N', 'mps'"
    import torch

    if device == "mps":
        return None if torch.backends.mps.is_available() else f"{key}='mps': MPS is not available here; use {key}=cpu"
    if not torch.cuda.is_available():
        why = "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA GPU is visible"
        return f"{key}={device!r}: CUDA is not available ({why}); use {key}=cpu"
    count = torch.cuda.device_count()
    if int(m.group(1) or 0) >= count:
        return f"{key}={device!r}: only {count} CUDA device(s) are visible (cuda:0 .. cuda:{count - 1})"
    return None


def error_text(exc: BaseException) -> str:
    """A KeyError's message without the quotes str() adds."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
