"""The grader's process-wide state, each piece created once, here:

- `Verdict`, what every tier returns and the cache holds;
- the settings, per context (`contextvars`, so threads that copy the context keep their own):
  `TIMEOUT` (deadline of the symbolic tier) and `TOLERANCE` (the decimal rule), set through
  `verifier_timeout` / `verifier_tolerance` or per call by `grade_answer`;
- `STATS`, the one `VerifierStats` (counters per status, per tier, cache hits, symbolic calls);
- `CACHE`, the one `VerdictCache` of (pred, gold, tolerance) -> Verdict.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

from rlvr.rewards.tolerance import STRICT, check_tolerance
from rlvr.rewards.types import Status


@dataclass(frozen=True)
class Verdict:
    """Outcome of comparing one predicted answer with one gold answer."""

    status: Status  # CORRECT / INCORRECT / TIMEOUT / ERROR
    info: str = ""  # short reason: what decided, or why it gave up
    tier: str = ""  # "exact", "text", "structure", "symbolic", "guard", "unit"


# ---------------------------------------------------------------------------------------------
# Settings

DEFAULT_TIMEOUT_S = float(os.environ.get("RLVR_VERIFIER_TIMEOUT_S", "3.0"))
TIMEOUT: contextvars.ContextVar[float] = contextvars.ContextVar("rlvr_verifier_timeout", default=DEFAULT_TIMEOUT_S)


@contextlib.contextmanager
def verifier_timeout(seconds: float):
    """Deadline for symbolic checks made in this context (threads: copy the context)."""
    token = TIMEOUT.set(float(seconds))
    try:
        yield
    finally:
        TIMEOUT.reset(token)


# Decimal tolerance (rlvr.rewards.tolerance): "strict" (default; about six significant digits)
# or "lenient" (a correct rounding with 3+ significant digits). RLVR_VERIFIER_TOLERANCE sets the
# process default; worker processes inherit the environment.
DEFAULT_TOLERANCE = check_tolerance(os.environ.get("RLVR_VERIFIER_TOLERANCE") or STRICT)
TOLERANCE: contextvars.ContextVar[str] = contextvars.ContextVar("rlvr_verifier_tolerance", default=DEFAULT_TOLERANCE)


@contextlib.contextmanager
def verifier_tolerance(tolerance: str):
    """Decimal tolerance ("strict" | "lenient") for answers graded in this context (threads:
    copy the context). ValueError for an unknown name."""
    token = TOLERANCE.set(check_tolerance(tolerance))
    try:
        yield
    finally:
        TOLERANCE.reset(token)


# ---------------------------------------------------------------------------------------------
# Counters


class VerifierStats:
    """Thread-safe counters of what the grader did: per status, per tier, cache hits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


# ---------------------------------------------------------------------------------------------
# Verdict cache

CACHE_SIZE = 100_000
CACHE_MAX_KEY_CHARS = 256  # longer answers are not cached: keys stay under CACHE_SIZE * 2 * 256 characters


class VerdictCache:
    """Thread-safe LRU map (pred, gold, tolerance) -> Verdict. Timeouts are cached too (the same
    pair would time out again); the caller leaves errors out. Answers longer than
    `max_key_chars` are never cached, so the memory stays bounded whatever the model writes."""

    def __init__(self, max_entries: int = CACHE_SIZE, max_key_chars: int = CACHE_MAX_KEY_CHARS) -> None:
        self.max_entries = max_entries
        self.max_key_chars = max_key_chars
        self.enabled = True
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str, str], Verdict] = OrderedDict()

    def accepts(self, pred: str, gold: str) -> bool:
        """Is this pair looked up and stored at all (cache on, both answers short enough)?"""
        return self.enabled and len(pred) <= self.max_key_chars and len(gold) <= self.max_key_chars

    def get(self, key: tuple[str, str, str]) -> Verdict | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
        return hit

    def put(self, key: tuple[str, str, str], verdict: Verdict) -> None:
        with self._lock:
            self._entries[key] = verdict
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def set_enabled(self, enabled: bool) -> None:
        """Turn the cache on or off; either way it starts empty."""
        self.enabled = enabled
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


STATS = VerifierStats()
CACHE = VerdictCache()
