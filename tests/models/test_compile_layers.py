"""Regional compilation of the learner (issue 38, item 3: the decoder layers compiled, dynamic shapes):
model.compile_layers. On a GPU it is measured by benchmarks/gpu.py's `compile` row; here, on CPU (inductor's
C++ backend), that the compiled layers compute what the eager ones do, that a copy of a compiled model (the KL
reference, a separate critic: copy.deepcopy) computes with its own weights and not the original's, and that the
sampler runs the layers eager."""

from __future__ import annotations

import copy

import pytest
import torch

from rlvr.config import ConfigError, load_config
from rlvr.models import build_tiny_model, score_tokens
from rlvr.models.loading import compile_layers, decoder_layers
from rlvr.rollout import HFGenerator, SamplingSpec
from rlvr.train.config import ModelConfig, TrainConfig
from rlvr.train.pg.loop import compile_layout_warning
from rlvr.train.policy import policy_from_config

SHAPE = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def _batch(tok, texts):
    ids = [tok.encode(t) for t in texts]
    T = max(map(len, ids))
    x = torch.full((len(ids), T), tok.pad_token_id)
    mask = torch.zeros(len(ids), T, dtype=torch.long)
    for i, row in enumerate(ids):
        x[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return x[:, :-1], x[:, 1:].masked_fill(mask[:, 1:] == 0, -100), mask[:, :-1]


def test_the_config_key_compiles_each_layer_of_the_policy_and_fsdp2_refuses_it():
    model, _ = policy_from_config(ModelConfig(**SHAPE, compile_layers=True))
    layers = decoder_layers(model)
    assert len(layers) == 2 and all("forward" in vars(layer) for layer in layers)  # bound per layer, one function
    assert vars(layers[0])["forward"].__func__ is vars(layers[1])["forward"].__func__
    plain, _ = policy_from_config(ModelConfig(**SHAPE))
    assert not any("forward" in vars(layer) for layer in decoder_layers(plain))
    with pytest.raises(ConfigError, match="compile_layers"):
        load_config(TrainConfig, None, ["model.compile_layers=true", "distributed.learner=fsdp2"])


def test_compiled_layers_on_the_cascade_layout_are_warned_of():
    """model.compile_layers is made for the packed layout; on the shared-prefix cascade (the CPU default) dynamo
    compiles a 2-layer model's layers 4 times per grad mode (rlvr.train.pg.loop.compile_layout_warning): the run says so."""
    base = ["model.compile_layers=true", *(f"model.{k}={v}" for k, v in SHAPE.items())]
    cfg = load_config(TrainConfig, None, base)
    model, _ = policy_from_config(cfg.model)
    assert "set algo.packing=true" in compile_layout_warning(cfg, model)
    for extra in ("algo.packing=true", "algo.shared_prefix=false", "model.compile_layers=false"):
        assert compile_layout_warning(load_config(TrainConfig, None, [*base, extra]), model) is None, extra


@pytest.mark.scale
def test_compiled_layers_match_eager_and_a_copy_uses_its_own_weights():
    """About a minute on 2 cores (inductor compiles the layer for CPU, with and without gradients)."""
    eager, tok = build_tiny_model(**SHAPE, seed=3)
    compiled = copy.deepcopy(eager)
    assert compile_layers(compiled) == 2
    x, y, m = _batch(tok, ["3+4=7", "12+5=17", "9+9=18 and more"])
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    want = score_tokens(eager, x, y, m).logprobs
    got = score_tokens(compiled, x, y, m).logprobs
    assert counters["stats"]["unique_graphs"] > graphs  # compiled, not silently eager
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # gradients through the compiled layers
    for model in (eager, compiled):
        model.zero_grad()
        score_tokens(model, x, y, m).logprobs.sum().backward()
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)

    # a copy (the KL reference's copy.deepcopy) computes with its own weights: moved, it must differ from the
    # original and equal an eager model with the same moved weights (a copy bound to the original's layers
    # would still give `want`: torch.compile(layer.forward) per layer does, measured: max difference 0.0)
    twin = copy.deepcopy(compiled)
    moved = copy.deepcopy(eager)
    with torch.no_grad():
        for model in (twin, moved):
            for p in decoder_layers(model)[0].parameters():
                p.add_(0.05)
    with torch.no_grad():
        got_twin = score_tokens(twin, x, y, m).logprobs
        torch.testing.assert_close(got_twin, score_tokens(moved, x, y, m).logprobs, atol=1e-5, rtol=1e-5)
        assert (got_twin - want).abs().max() > 1e-3
        torch.testing.assert_close(score_tokens(compiled, x, y, m).logprobs, want, atol=1e-5, rtol=1e-5)

    # the sampler runs the layers eager: the same tokens and logprobs as the eager model's, and no compile
    spec = SamplingSpec(n=2, temperature=1.0, max_tokens=6, seed=11)
    before = sum(counters["stats"].values())
    a = HFGenerator(eager, tok).generate(["3+4=", "12+5="], spec)
    b = HFGenerator(compiled, tok).generate(["3+4=", "12+5="], spec)
    assert sum(counters["stats"].values()) == before
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    for ra, rb in zip(a, b, strict=True):
        torch.testing.assert_close(torch.tensor(rb.logprobs), torch.tensor(ra.logprobs), atol=1e-6, rtol=1e-6)
