"""Reflection phrases in responses: `text/reflection_rate`, the share of responses that contain at least one.

The source documents' point (the lecture on R1-Zero's "aha moment", Liu et al.'s "Understanding R1-Zero-like
training"): self-correction phrases such as "wait" or "let me check" already appear in base models' outputs,
so RL amplifies them rather than creating them. Logged at every training step (sample metrics, rlvr.train) and
in every evaluation (rlvr.eval.summarize), so a run shows the base policy's rate next to the trained one's.

A phrase counts as a whole-word, case-insensitive match in the response text (the think block included);
"wait" inside "awaited" does not count.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

# Phrases of re-checking and self-correction, as the R1-Zero analyses count them (lower case, whole words).
REFLECTION_PHRASES: tuple[str, ...] = (
    "wait", "hmm", "let me check", "let me verify", "let me double-check", "let me re-check", "let me recheck",
    "let me recompute", "let me reconsider", "let me re-evaluate", "double-check", "double check",
    "on second thought", "i made a mistake", "that's not right", "that is not right", "re-examine",
    "let's verify", "let's check", "let's double-check", "but actually", "actually, ",
)

_PATTERN = re.compile(
    r"(?<![\w-])(?:" + "|".join(re.escape(p.strip()) for p in sorted(REFLECTION_PHRASES, key=len, reverse=True))
    + r")(?![\w-])", re.IGNORECASE)


def reflection_phrases(text: str) -> list[str]:
    """The reflection phrases found in `text`, lower case, in order of appearance."""
    return [m.group(0).lower() for m in _PATTERN.finditer(text)]


def has_reflection(text: str) -> bool:
    """Whether `text` contains at least one reflection phrase."""
    return _PATTERN.search(text) is not None


def reflection_rate(texts: Sequence[str]) -> float:
    """Share of `texts` with at least one reflection phrase (NaN for none)."""
    return sum(map(has_reflection, texts)) / len(texts) if texts else math.nan
