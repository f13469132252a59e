"""Name -> function lookup shared by every registry in rlvr.algo, and the check that a registry holds the built-in
names rlvr.algo.names lists (the torch-free copy the config reads)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def lookup(registry: Mapping[str, F], name: str, what: str) -> F:
    """Return registry[name]; an unknown name raises KeyError listing the known names."""
    try:
        return registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise KeyError(f"unknown {what} {name!r}; known: {known}") from None


def check_names(registry: Mapping[str, object], names: Iterable[str], what: str) -> None:
    """Raise AssertionError unless `registry` holds exactly `names` (rlvr.algo.names: what the config checks and
    lists in its help without importing torch). Each registry calls it right after its table, at import, so the two
    cannot drift apart unseen; a raise rather than an `assert` statement, so `python -O` checks it too."""
    have, listed = set(registry), set(names)
    if have != listed:
        raise AssertionError(f"{what} and rlvr.algo.names disagree: only in {what}: {sorted(have - listed)}, only in "
                             f"the names: {sorted(listed - have)}; add the name to both (the config reads the list)")
