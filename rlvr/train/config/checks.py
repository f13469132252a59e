"""The validation kit of the config sections (torch-free: torch is imported only to check a non-CPU device).

Each section's validate() runs right after parsing (rlvr.config calls it), so a wrong name or a value out of
range fails naming its dotted key before any model or data work, not as a traceback from deep inside the
trainer. `Checks` collects one section's problems, one line each naming the dotted key, and raises them
together; `changed` / `default_of` tell a key the user set from its class default (a key at its default is
never refused as inert). Registries are imported inside the checks, not at the top of the config modules:
`rlvr --help` must not pay for torch.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

from rlvr.config import ConfigError


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
        if value in known:
            return True
        self.error(f"{self.section}.{name}={value!r} is unknown; known: {', '.join(repr(k) for k in known)}")
        return False

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
