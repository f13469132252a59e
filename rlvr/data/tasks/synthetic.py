"""Helpers shared by the synthetic tasks: deterministic split assignment and unique sampling.

Held-out splits never overlap training by construction: a problem's split is a fixed function of
its canonical key (a hash), not of the seed or the order of generation. Any two calls, with any
seeds and difficulty settings, therefore agree on which split a problem belongs to.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

SPLITS = ("train", "test")


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
            f"{what}: found only {len(items)} distinct {split} problems of the {n} asked for; "
            "the problem space is too small for these settings (raise the difficulty or lower n)"
        )
    return items
