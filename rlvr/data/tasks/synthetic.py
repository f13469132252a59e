"""Helpers shared by the synthetic tasks: deterministic split assignment and unique sampling.

Held-out splits never overlap training by construction: a problem's split is a fixed function of
its canonical key (a hash), not of the seed or the order of generation. Any two calls, with any
seeds and difficulty settings, therefore agree on which split a problem belongs to.

Each generator first asks how many distinct problems of the split its settings allow
(`split_capacities`) and refuses at once when more are asked for: drawing until the attempt budget
runs out would take a minute before saying the same thing.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable

SPLITS = ("train", "test")

# Problem spaces up to this many keys are counted exactly (hashing a key for its split takes about
# a microsecond, so counting stays well under a second and is cached); a larger space is estimated
# from the split's share, which a hash split matches to a fraction of a percent at that size.
ENUMERATE_LIMIT = 300_000


class ProblemSpaceError(ValueError):
    """More distinct problems of a split were asked for than the generator's settings allow.
    `asked` and `available` are the two numbers; `split` is "train" or "test"."""

    def __init__(self, message: str, *, asked: int, available: int, split: str):
        super().__init__(message)
        self.asked, self.available, self.split = asked, available, split


def split_share(split: str, heldout_fraction: float) -> float:
    """Expected fraction of a problem space that falls in `split`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    return heldout_fraction if split == "test" else 1.0 - heldout_fraction


def split_capacities(
    heldout_fraction: float, total: int, keys: Callable[[], Iterable[str]] | None
) -> dict[str, int]:
    """{split: how many distinct problems of it} for a space of `total` keys: counted exactly over
    `keys()` (one pass) when total <= ENUMERATE_LIMIT and keys are given, else total * share."""
    if keys is not None and total <= ENUMERATE_LIMIT:
        counts = dict.fromkeys(SPLITS, 0)
        for k in keys():
            counts[split_of(k, heldout_fraction)] += 1
        return counts
    return {split: int(total * split_share(split, heldout_fraction)) for split in SPLITS}


def check_capacity(n: int, split: str, available: int | None, what: str, settings: str) -> None:
    """Raise ProblemSpaceError when n > available (None = too many to count: never refused)."""
    if available is not None and n > available:
        raise ProblemSpaceError(
            f"{what}: {n} distinct {split} problems asked for, but only {available} exist with {settings}; "
            "ask for fewer or make the problems harder",
            asked=n, available=available, split=split,
        )


def split_of(key: str, heldout_fraction: float) -> str:
    """'test' for a fixed pseudo-random `heldout_fraction` of keys, 'train' for the rest."""
    h = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big") / 2**64
    return "test" if h < heldout_fraction else "train"


def sample_unique(
    n: int,
    split: str,
    seed: int,
    heldout_fraction: float,
    draw: Callable[[random.Random], tuple[str, object]],
    what: str,
    max_attempts: int | None = None,
) -> list[object]:
    """Draw items until `n` distinct keys of `split` are found. draw(rng) -> (canonical key, item).
    Raises ValueError when the problem space is too small for n items of that split."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    rng = random.Random(f"{what}:{seed}:{split}")  # str seeds are hashed with sha512: stable
    seen: set[str] = set()
    items = []
    attempts = max_attempts if max_attempts is not None else 200 * n + 10_000
    for _ in range(attempts):
        if len(items) == n:
            break
        key, item = draw(rng)
        if key in seen or split_of(key, heldout_fraction) != split:
            continue
        seen.add(key)
        items.append(item)
    if len(items) < n:
        raise ValueError(
            f"{what}: found only {len(items)} distinct {split} problems of the {n} asked for in {attempts} "
            "draws; the problem space is too small for these settings (ask for fewer or make them harder)"
        )
    return items
