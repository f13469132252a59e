"""Process-wide runtime settings: CPU thread count and seeding.

On small CPU machines the thread count matters a lot (a prototype ran 6x faster with one
thread per process under load), so it is an explicit setting everywhere: the `RLVR_NUM_THREADS`
environment variable, or `run.num_threads` in a trainer config, which calls `set_num_threads`.
"""

from __future__ import annotations

import os
import random


def default_num_threads() -> int:
    """Threads for torch when nothing is configured: RLVR_NUM_THREADS, else torch's default (0)."""
    value = os.environ.get("RLVR_NUM_THREADS", "").strip()
    if not value:
        return 0
    try:
        n = int(value)
    except ValueError as exc:
        raise ValueError(f"RLVR_NUM_THREADS must be an integer, got {value!r}") from exc
    if n < 0:
        raise ValueError(f"RLVR_NUM_THREADS must be >= 0, got {n}")
    return n


def set_num_threads(n: int | None = None) -> int:
    """Set torch's intra-op thread count; n=0/None keeps torch's default. Returns the count in use."""
    import torch

    n = default_num_threads() if n is None else n
    if n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def seed_everything(seed: int) -> None:
    """Seed python, numpy (if present) and torch (CPU and CUDA)."""
    import torch

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # numpy is optional at this layer
        pass
    torch.manual_seed(seed)
