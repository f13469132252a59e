"""Name -> function lookup shared by every registry in rlvr.algo."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def lookup(registry: Mapping[str, F], name: str, what: str) -> F:
    """Return registry[name]; an unknown name raises KeyError listing the known names."""
    try:
        return registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise KeyError(f"unknown {what} {name!r}; known: {known}") from None
