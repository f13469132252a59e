"""MasterWeightAdamW's multi-tensor step (issue 38, item 3: "a fused or foreach optimizer step over the fp32
masters"): the same numbers as its per-parameter loop, bit for bit on the CPU (on CUDA benchmarks/gpu.py's
correctness stage checks the same comparison within 1 ulp), across buckets, parameters stepped a different number
of times, float32 and bf16 parameters mixed, and the float32 gradient sums of micro-batched backwards."""

from __future__ import annotations

import pytest
import torch

import rlvr.train.precision as precision
from rlvr.models.tiny import build_tiny_model
from rlvr.train.precision import MasterWeightAdamW


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(16, 8), (8,), (33, 5), (7,), (64, 3), (3, 3, 2)]
    out = []
    for i, s in enumerate(shapes):
        t = torch.randn(s, generator=g)
        out.append(torch.nn.Parameter(t if i == 3 else t.to(torch.bfloat16)))  # one float32 among the bf16
    return out


def _run(foreach: bool, steps: int = 6) -> tuple[list[torch.Tensor], list[torch.Tensor], dict]:
    params = _params(0)
    opt = MasterWeightAdamW(params, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=foreach)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, p in enumerate(params):
            if i == 1 and step % 2:  # some steps without a gradient: its step count (bias correction) lags
                p.grad = None
                continue
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
        opt.step()
    return ([p.detach().clone() for p in params], [m.detach().clone() for m in opt.master_params()],
            {i: dict(opt.state[p]) for i, p in enumerate(params)})


@pytest.mark.parametrize("bucket", [1 << 26, 200])  # one bucket; several (and tensors larger than a bucket)
def test_foreach_step_equals_the_per_parameter_loop_bitwise(bucket, monkeypatch):
    monkeypatch.setattr(precision, "FOREACH_BUCKET_ELEMENTS", bucket)
    fe_p, fe_m, fe_s = _run(True)
    lo_p, lo_m, lo_s = _run(False)
    for a, b in zip(fe_p + fe_m, lo_p + lo_m, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for i in fe_s:
        assert fe_s[i]["step"] == lo_s[i]["step"]
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(fe_s[i][k], lo_s[i][k])
    assert fe_s[1]["step"] == 3 and fe_s[0]["step"] == 6
    assert fe_s[0]["master"].dtype == torch.float32 and "master" not in fe_s[3]


def test_buckets_cut_by_size_and_keep_the_order(monkeypatch):
    monkeypatch.setattr(precision, "FOREACH_BUCKET_ELEMENTS", 100)
    items = [(None, torch.zeros(n), None, None) for n in (60, 30, 20, 500, 10, 90, 5)]
    sizes = [[it[1].numel() for it in b] for b in precision._buckets(items)]
    assert sizes == [[60, 30], [20], [500], [10, 90], [5]]


def test_foreach_step_keeps_the_float32_gradient_sums_of_micro_batches():
    """A bf16 tiny model, two micro-batch backwards per step (the fp32 gradient-sum hooks move each into the
    optimizer's float32 sums), three steps: the foreach step and the loop give the same parameters and masters."""
    out = {}
    for foreach in (True, False):
        model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=5)
        model = model.to(torch.bfloat16).train()
        opt = MasterWeightAdamW(model.parameters(), lr=1e-3, weight_decay=0.01, foreach=foreach)
        ids = torch.tensor([tok.encode("12+34=46")] * 4)
        for _ in range(3):
            for half in (ids[:2], ids[2:]):
                logits = model(input_ids=half).logits[:, :-1].float()
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), half[:, 1:].flatten())
                loss.backward()
            assert opt.grads32 and all(p.grad is None for p in model.parameters())  # the sums hold them
            opt.step()
            opt.zero_grad()
        out[foreach] = [p.detach().clone() for p in model.parameters()] + [m.clone() for m in opt.master_params()]
    assert all(torch.equal(a, b) for a, b in zip(out[True], out[False], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(out[True], _fresh_params(), strict=False))


def _fresh_params() -> list[torch.Tensor]:
    model, _ = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=5)
    return [p.detach().to(torch.bfloat16) for p in model.parameters()]
