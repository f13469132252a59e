"""How far a step is from the machine's compute limit: FLOPs counted, matmul throughput measured.

A small, reusable module (benchmarks/vs_trl.py and benchmarks/step.py use it). Three steps:

    from benchmarks.compute_limit import count_flops, matmul_throughput, limit_seconds

    gen = count_flops(lambda: generator.generate(prompts))          # Count: flops, ops, result
    fb = count_flops(lambda: loss_fn(model(batch)).backward())      # forward + backward
    tp = matmul_throughput(gen.ops + fb.ops, threads=1)             # FLOP/s at those exact shapes
    limit = limit_seconds(gen.flops + fb.flops, tp)                 # the step cannot be faster than this
    share = limit / measured_step_seconds                           # e.g. 0.31 = 31% of the limit

- `count_flops(fn)` runs `fn()` once under `torch.utils.flop_counter.FlopCounterMode` and also
  records the shape, strides and dtype of every FLOP-counted op it dispatched (mm, addmm, bmm, ...),
  deduplicated with a call count.
- `matmul_throughput(ops, threads)` replays those ops on random tensors of the same shapes and strides
  on `threads` torch threads (the thread count is restored afterwards) and returns FLOP/s: the FLOPs
  of the mix over the best time of several repetitions. "At the model's shapes" matters: a 512 x 128
  by 128 x 256 matmul runs far below the machine's peak on large square matrices.
- `limit_seconds(flops, flops_per_s)` is flops / flops_per_s.

Scope: only ops that torch's FLOP counter knows count (matrix multiplies, convolutions and the CUDA
attention kernels); element-wise work, softmax, norms, and the CPU fused-attention kernel
(`_scaled_dot_product_flash_attention_for_cpu`, not registered in torch's counter) count zero. For
the tiny models here attention over ~12 positions is a negligible share of the FLOPs; for long
sequences the limit is an under-estimate of the work (so the share of it reached is an upper bound).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode, flop_registry

__all__ = ["Count", "Op", "count_flops", "matmul_throughput", "limit_seconds"]


@dataclass(frozen=True)
class _TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Op:
    """One FLOP-counted op as dispatched: `calls` times with these argument shapes, `flops` per call."""

    func: Any  # torch._ops.OpOverload
    args: tuple
    kwargs: dict
    flops: int
    calls: int = 1

    @property
    def name(self) -> str:
        return str(self.func.overloadpacket.__name__)


@dataclass
class Count:
    """What `count_flops` found: total FLOPs, FLOPs per op name, the ops with their shapes, fn's result."""

    flops: int
    by_op: dict[str, int]
    ops: list[Op] = field(default_factory=list)
    result: Any = None


def _spec(x):
    return _TensorSpec(tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, torch.Tensor) else x


class _Recorder(TorchDispatchMode):
    """Records every op torch's FLOP counter has a formula for, with tensor specs instead of tensors."""

    def __init__(self):
        super().__init__()
        self.ops: dict[str, Op] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if packet in flop_registry:
            s_args, s_kwargs = tree_map(_spec, args), tree_map(_spec, kwargs)
            key = repr((func, s_args, sorted(s_kwargs.items())))
            if key in self.ops:
                self.ops[key].calls += 1
            else:
                flops = flop_registry[packet](*args, **kwargs, out_val=out)  # torch's own formula
                self.ops[key] = Op(func, s_args, s_kwargs, int(flops))
        return out


def count_flops(fn: Callable[[], Any]) -> Count:
    """Run fn() once; its FLOPs (torch.utils.flop_counter), per op name, and the ops with shapes."""
    counter = FlopCounterMode(display=False)
    rec = _Recorder()
    with counter, rec:
        result = fn()
    by_op: dict[str, int] = {}
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        by_op[str(getattr(op, "__name__", op))] = int(n)
    return Count(flops=int(counter.get_total_flops()), by_op=by_op, ops=list(rec.ops.values()), result=result)


def _materialize(x, gen: torch.Generator):
    if not isinstance(x, _TensorSpec):
        return x
    # a base buffer just large enough for these strides (0-strides from expand() included)
    size = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride, strict=True)) if all(x.shape) else 0
    base = (torch.randn(size, generator=gen, dtype=torch.float32).to(x.dtype) if x.dtype.is_floating_point
            else torch.zeros(size, dtype=x.dtype))
    return base.as_strided(x.shape, x.stride)


def matmul_throughput(ops: Iterable[Op], threads: int | None = None, *, repeats: int = 5,
                      min_seconds: float = 0.05) -> float:
    """FLOP/s of these ops replayed at their recorded shapes, strides and call counts on `threads`
    torch threads (None = current). Each repetition replays the whole mix (every op `calls` times,
    and the mix again until min_seconds have passed); the best repetition counts, since other load
    on the machine only slows a repetition down."""
    ops = [o for o in ops if o.flops > 0]
    if not ops:
        raise ValueError("matmul_throughput: no FLOP-counted ops to replay (count_flops found none)")
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        ready = [(o.func, tree_map(lambda x: _materialize(x, gen), o.args),
                  tree_map(lambda x: _materialize(x, gen), o.kwargs), o.calls) for o in ops]
        total = sum(o.flops * o.calls for o in ops)

        def once():
            for func, args, kwargs, calls in ready:
                for _ in range(calls):
                    func(*args, **kwargs)

        with torch.no_grad():
            once()  # warm-up (allocator, kernels' first-call setup)
            t0 = time.perf_counter()
            once()
            per_mix = max(time.perf_counter() - t0, 1e-9)
            inner = max(1, int(min_seconds / per_mix))
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(inner):
                    once()
                times.append((time.perf_counter() - t0) / inner)
    finally:
        torch.set_num_threads(before)
    return total / min(times)


def limit_seconds(flops: float, flops_per_s: float) -> float:
    """The compute limit: seconds the machine needs for `flops` at `flops_per_s` (no overhead at all)."""
    if flops_per_s <= 0:
        raise ValueError(f"limit_seconds: flops_per_s={flops_per_s} must be > 0")
    return float(flops) / flops_per_s


def summary(counts: dict[str, Count], flops_per_s: float, step_seconds: float | None = None) -> dict[str, float]:
    """A JSON-ready line: GFLOP per phase and in all, GFLOP/s, the limit, and (given the measured
    step time) the share of the limit reached."""
    total = sum(c.flops for c in counts.values())
    limit = limit_seconds(total, flops_per_s)
    out = {f"gflop/{k}": _sig(c.flops / 1e9) for k, c in counts.items()}
    out |= {"gflop/total": _sig(total / 1e9), "gflop_per_s": _sig(flops_per_s / 1e9), "limit_s": _sig(limit)}
    if step_seconds:
        out["share_of_limit"] = _sig(limit / step_seconds)
    return out


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")
