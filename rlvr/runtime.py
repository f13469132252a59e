"""Process-wide runtime settings: CPU thread count, seeding, and memory figures.

On small CPU machines the thread count matters a lot (a prototype ran 6x faster with one
thread per process under load), so it is an explicit setting everywhere: the `RLVR_NUM_THREADS`
environment variable, or `run.num_threads` in a trainer config, which calls `set_num_threads`.
"""

from __future__ import annotations

import os
import random
import sys

_GIB = float(1 << 30)


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


def _rss_peak_bytes() -> int | None:
    """Peak resident set size of this process (getrusage ru_maxrss; since the last reset of the
    kernel's high-water mark, see reset_peak_memory)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _rss_now_bytes() -> int | None:
    """Current resident set size (Linux /proc/self/statm: resident pages * page size)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _rss_hwm_bytes() -> int | None:
    """The kernel's resident high-water mark (Linux VmHWM), which reset_peak_memory can reset."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


# Largest RSS peak seen before a reset of the high-water mark: resetting VmHWM also lowers
# ru_maxrss (the kernel reports max(exited threads' peak, VmHWM)), so the lifetime peak is kept here.
_lifetime_peak_bytes = 0


def _cuda_device(device):
    """torch.device when `device` is a CUDA device and CUDA is up, else None."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return dev


def memory_stats(device=None) -> dict[str, float]:
    """Memory figures of this process in GiB (2**30 bytes), for per-step logging.

    mem/rss_peak_gb: peak resident memory over the process's life (getrusage ru_maxrss; never goes
    down, so it includes model loading). mem/rss_gb: resident memory now. mem/rss_step_peak_gb:
    peak resident memory since the last reset_peak_memory (Linux VmHWM; with a reset at the start
    of each step, the step's own peak). On a CUDA `device`: mem/cuda_peak_gb
    (torch.cuda.max_memory_allocated since the last reset_peak_memory) and mem/cuda_reserved_gb
    (held by the caching allocator now). A figure the platform cannot give is left out, not 0.
    """
    import torch

    out: dict[str, float] = {}
    peak, now, hwm = _rss_peak_bytes(), _rss_now_bytes(), _rss_hwm_bytes()
    if peak is not None:
        # the kernel updates its high-water mark lazily; the current figure may be a little above it
        out["mem/rss_peak_gb"] = max(peak, now or 0, _lifetime_peak_bytes) / _GIB
    if now is not None:
        out["mem/rss_gb"] = now / _GIB
    if hwm is not None:
        out["mem/rss_step_peak_gb"] = max(hwm, now or 0) / _GIB
    dev = _cuda_device(device)
    if dev is not None:
        out["mem/cuda_peak_gb"] = torch.cuda.max_memory_allocated(dev) / _GIB
        out["mem/cuda_reserved_gb"] = torch.cuda.memory_reserved(dev) / _GIB
    return out


def reset_peak_memory(device=None) -> None:
    """Start new peaks: CUDA (torch.cuda.reset_peak_memory_stats) on a CUDA `device`, and on Linux
    the kernel's RSS high-water mark (writing 5 to /proc/self/clear_refs, which touches nothing
    else), so mem/rss_step_peak_gb and mem/cuda_peak_gb are per step. mem/rss_peak_gb stays the
    lifetime peak. Best effort: where /proc is not writable the RSS peak is simply not reset."""
    global _lifetime_peak_bytes
    import torch

    dev = _cuda_device(device)
    if dev is not None:
        torch.cuda.reset_peak_memory_stats(dev)
    if os.path.exists("/proc/self/clear_refs"):
        _lifetime_peak_bytes = max(_lifetime_peak_bytes, _rss_peak_bytes() or 0, _rss_hwm_bytes() or 0)
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
                f.write("5")
        except OSError:
            pass


# Dense (no 2:4 sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors' datasheets, matched against
# torch.cuda.get_device_name() (the first entry whose every word is in the name, case-insensitive): the
# denominator of perf/mfu when run.peak_tflops is 0 (auto).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("B100", 1750.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM and NVL
    ("H800", 989.0),
    ("H20", 148.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("MI300X", 1307.0),
    ("MI325X", 1307.0),
    ("MI250X", 383.0),
)


def peak_tflops(device=None, configured: float = 0.0) -> float:
    """The bf16 dense peak (TFLOP/s) MFU is measured against: `configured` when > 0 (run.peak_tflops);
    else the PEAK_BF16_TFLOPS entry of the CUDA device's name; 0.0 when unknown or on CPU (MFU not logged)."""
    if configured > 0:
        return float(configured)
    dev = _cuda_device(device)
    if dev is None:
        return 0.0
    import torch

    return peak_for_name(torch.cuda.get_device_name(dev))


def peak_for_name(name: str) -> float:
    """PEAK_BF16_TFLOPS's value for a device name (e.g. 'NVIDIA H200'); 0.0 when none matches."""
    words = name.upper().replace("-", " ").split()
    for key, value in PEAK_BF16_TFLOPS:
        if all(k in words for k in key.upper().split()):
            return value
    return 0.0
