"""benchmarks/compute_limit.py: FLOPs against hand-computed counts, the replayed throughput and the limit."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from helpers import REPO

sys.path.insert(0, str(REPO))
from benchmarks.compute_limit import count_flops, limit_seconds, matmul_throughput, summary  # noqa: E402


def test_linear_forward_and_backward_flops_match_hand_counts():
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 256, bias=True)
    x = torch.randn(64, 128, requires_grad=True)
    fwd = count_flops(lambda: lin(x))
    assert fwd.flops == 2 * 64 * 128 * 256  # one addmm: 2*m*k*n
    assert fwd.by_op == {"addmm": 2 * 64 * 128 * 256}
    assert fwd.result.shape == (64, 256)
    fb = count_flops(lambda: lin(x).sum().backward())
    # forward + grad wrt input + grad wrt weight: three matmuls of the same size
    assert fb.flops == 3 * 2 * 64 * 128 * 256
    assert sum(o.flops * o.calls for o in fb.ops) == fb.flops
    assert x.grad is not None and lin.weight.grad is not None  # fn really ran


def test_repeated_ops_are_deduplicated_with_call_counts():
    w = torch.randn(32, 16)
    c = count_flops(lambda: [torch.randn(8, 32) @ w for _ in range(5)])
    assert len(c.ops) == 1 and c.ops[0].calls == 5 and c.ops[0].flops == 2 * 8 * 32 * 16
    assert c.flops == 5 * 2 * 8 * 32 * 16


def test_throughput_and_limit():
    lin = torch.nn.Linear(64, 64, bias=False)
    x = torch.randn(128, 64)
    c = count_flops(lambda: lin(x).sum().backward())
    before = torch.get_num_threads()
    tp = matmul_throughput(c.ops, threads=1, repeats=2, min_seconds=0.01)
    assert torch.get_num_threads() == before  # restored
    assert math.isfinite(tp) and 1e6 < tp < 1e14  # FLOP/s of any CPU of this era
    assert limit_seconds(3e9, 1.5e9) == pytest.approx(2.0)
    s = summary({"train": c}, 2e9, step_seconds=c.flops / 2e9 * 4)
    assert s["gflop/train"] == pytest.approx(c.flops / 1e9, rel=1e-3) and s["share_of_limit"] == pytest.approx(0.25, abs=1e-3)
    with pytest.raises(ValueError, match="no FLOP-counted ops"):
        matmul_throughput([], threads=1)
    with pytest.raises(ValueError, match="flops_per_s"):
        limit_seconds(1.0, 0.0)
