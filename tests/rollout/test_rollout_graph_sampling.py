"""Sampling inside the static-cache decode's captured step (rlvr.rollout.static_decode.sample_in_graph, issue 38
item 2): the same numbers as sample_step, nothing in it that a CUDA graph cannot hold (checked here by compiling it
whole: a host sync is a graph break), and the decode loop right with a graph's semantics (outputs overwritten by the
next replay, inputs read from the buffers it was captured on), emulated on the CPU."""

import warnings

import pytest
import torch

from rlvr.models import build_tiny_model
from rlvr.rollout import static_decode
from rlvr.rollout.hf_generator import HFGenerator
from rlvr.rollout.sampling import sample_step
from rlvr.rollout.static_decode import sample_in_graph, samples_in_graph
from rlvr.rollout.types import SamplingSpec

SPECS = {
    "t1": SamplingSpec(n=1, max_tokens=8, seed=1),
    "t0.7": SamplingSpec(n=1, max_tokens=8, seed=1, temperature=0.7),
    "top_k": SamplingSpec(n=1, max_tokens=8, seed=1, temperature=1.3, top_k=40),
    "greedy": SamplingSpec(n=1, max_tokens=8, temperature=0),
    "greedy_top_p": SamplingSpec(n=1, max_tokens=8, temperature=0, top_p=0.5),  # greedy ignores top-p
}


def _logits(B, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = 3.0 * torch.randn((B, V), generator=g)
    x[:, 7] = 16.0  # a likely token (the EOS of the ban below)
    return x.to(dtype), torch.rand((B,), generator=g, dtype=torch.float64)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("V,dtype", [(300, torch.float32), (5000, torch.bfloat16), (5000, torch.float32)])
@pytest.mark.parametrize("banned", [False, True])
def test_sample_in_graph_is_sample_step_bit_for_bit(name, V, dtype, banned):
    spec = SPECS[name]
    assert samples_in_graph(spec)
    logits, u = _logits(64, V, dtype, seed=V + banned)
    eos = torch.tensor([7, 11])
    ban = None
    if banned:  # before min_tokens: EOS removed
        ban = torch.zeros((V,), dtype=torch.float32)
        ban[eos] = float("-inf")
    # sample_step bans EOS at steps < min_tokens (step 0 with min_tokens=1), not from then on (step 1)
    want_lp, want = sample_step(logits, 0 if banned else 1, SamplingSpec(n=1, max_tokens=8, min_tokens=1,
                                temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p), eos, u)
    tok, lp = sample_in_graph(logits, u, ban, spec.temperature, spec.top_k)
    assert torch.equal(tok, want)
    assert torch.equal(lp, want_lp.gather(-1, want.unsqueeze(-1)).squeeze(-1).float())
    if banned:
        assert not torch.isin(tok, eos).any()
    else:
        assert torch.isin(tok, eos).any()  # the likely token is drawn when allowed: the ban is what removed it


def test_top_p_is_sampled_outside_the_graph():
    assert not samples_in_graph(SamplingSpec(n=1, max_tokens=8, top_p=0.9))


@pytest.mark.parametrize("name", ["t1", "top_k", "greedy"])
def test_sample_in_graph_compiles_whole_and_equals_eager(name):
    """fullgraph=True: any host sync (.item, .tolist, nonzero's data-dependent shape) is a graph break and raises,
    as it would break a CUDA graph's capture. The compiled (fused) sampler gives the eager one's tokens."""
    spec = SPECS[name]
    logits, u = _logits(32, 5000, torch.float32, seed=3)
    ban = torch.zeros((5000,), dtype=torch.float32)
    ban[7] = float("-inf")
    torch._dynamo.reset()
    try:
        fn = torch.compile(sample_in_graph, fullgraph=True, dynamic=True)
        for b in (32, 17):  # two row counts (the rows compacted): the same compiled function
            tok, lp = fn(logits[:b], u[:b], ban, spec.temperature, spec.top_k)
            want_tok, want_lp = sample_in_graph(logits[:b], u[:b], ban, spec.temperature, spec.top_k)
            assert torch.equal(tok, want_tok)
            assert torch.allclose(lp, want_lp, atol=1e-5, rtol=0)
    finally:
        torch._dynamo.reset()


def test_the_compile_check_catches_a_host_sync():
    """The check above can fail: top-p's threshold search (a nonzero over the rows, then a branch on its size)
    does not compile whole, which is why top-p samples outside the graph."""
    from rlvr.rollout.sampling import process_logits

    logits, _ = _logits(8, 5000, torch.float32, seed=4)
    torch._dynamo.reset()
    try:
        with pytest.raises(Exception, match="(?i)graph break|data.dependent|nonzero|Unsupported"):
            torch.compile(process_logits, fullgraph=True)(logits, 1.0, 0, 0.9)
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------------------------- the decode loop, graph emulated

PROMPTS = ["1+1=", "12*3=", "hello world, ", "7"]


class EmulatedGraph:
    """A CUDA graph's semantics on the CPU: the function runs at capture (after two warm-ups, as _Graph's) and again
    at each replay, its results written into the tensors the capture returned (a graph's outputs are static memory:
    whatever still holds them sees the next replay's values)."""

    made: list = []

    def __init__(self, fn):
        for _ in range(2):
            fn()
        self.fn, self.out = fn, fn()
        EmulatedGraph.made.append(self)

    def __call__(self):
        new = self.fn()
        if isinstance(self.out, tuple):
            for o, n in zip(self.out, new, strict=True):
                o.copy_(n)
        else:
            self.out.copy_(new)
        return self.out


@pytest.fixture()
def graphs_emulated(monkeypatch):
    init = static_decode.StaticDecoder.__init__

    def with_graph(self, *a, **k):
        init(self, *a, **k)
        self.use_graph = True

    monkeypatch.setattr(static_decode.StaticDecoder, "__init__", with_graph)
    monkeypatch.setattr(static_decode, "_Graph", EmulatedGraph)
    EmulatedGraph.made = []
    return EmulatedGraph


@pytest.fixture(scope="module")
def eos_likely():
    model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
    eos = tok.eos_token_id
    h = model.lm_head.register_forward_hook(lambda _m, _i, out: out + 3.0 * (torch.arange(out.shape[-1]) == eos))
    yield model, tok
    h.remove()


def _same(plain, fast):
    assert [r.response_ids for r in fast] == [r.response_ids for r in plain]
    assert [(r.finish_reason, r.stop_reason, r.text) for r in fast] == [
        (r.finish_reason, r.stop_reason, r.text) for r in plain]
    for a, b in zip(fast, plain, strict=True):
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0) <= 1e-5


@pytest.mark.parametrize("spec,in_graph", [
    (SamplingSpec(n=4, max_tokens=24, seed=11), True),
    (SamplingSpec(n=4, max_tokens=24, seed=11, min_tokens=6), True),
    (SamplingSpec(n=4, max_tokens=24, seed=12, temperature=1.3, top_k=5, min_tokens=3, stop=("0",)), True),
    (SamplingSpec(n=2, max_tokens=24, temperature=0, min_tokens=7), True),
    (SamplingSpec(n=4, max_tokens=24, seed=11, temperature=0.8, top_p=0.9), False),
], ids=["t1", "min_tokens", "top_k_stop", "greedy", "top_p"])
def test_graph_sampling_decode_equals_plain(eos_likely, graphs_emulated, spec, in_graph):
    """Rows end at different steps (EOS likely) and are compacted, min_tokens bans EOS for the first steps and is
    lifted in the captured steps' buffer: the tokens, texts and finish reasons are the plain loop's."""
    model, tok = eos_likely
    plain = HFGenerator(model, tok, batch_size=16).generate(PROMPTS, spec)
    gen = HFGenerator(model, tok, batch_size=16, static_cache=True, sync_every=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback of any kind
        fast = gen.generate(PROMPTS, spec)
    assert gen._static and gen._decoder.graph_sampling
    _same(plain, fast)
    lengths = [len(r.response_ids) for r in plain]
    assert any(r.stop_reason == "<eos>" for r in plain) and max(lengths) >= 6  # rows past the first checks (every 2 steps)
    if spec.min_tokens:
        assert min(lengths) >= spec.min_tokens + 1
    sampled = [k for k in gen._decoder.graphs if k[2] is not None]
    assert bool(sampled) == in_graph and len(graphs_emulated.made) == len(gen._decoder.graphs)
    if spec.temperature:
        assert len({b for b, _, _ in gen._decoder.graphs}) > 1  # graphs of compacted row counts too
    if in_graph:
        assert all(k[2] == (float(spec.temperature), spec.top_k, spec.min_tokens > 1) for k in sampled)


def test_a_sampling_graph_that_fails_to_capture_samples_after_the_graph(eos_likely, graphs_emulated, monkeypatch):
    """A step whose capture fails only with its sampling inside: one warning, the graph captured without it, and
    the same tokens (the fallback the GPU takes if some sampling op cannot be captured)."""
    model, tok = eos_likely

    class NoSamplingGraph(EmulatedGraph):
        def __init__(self, fn):
            out = fn()
            if isinstance(out, tuple):
                raise RuntimeError("operation not permitted when stream is capturing")
            super().__init__(fn)

    monkeypatch.setattr(static_decode, "_Graph", NoSamplingGraph)
    spec = SamplingSpec(n=4, max_tokens=16, seed=5, min_tokens=4)
    plain = HFGenerator(model, tok, batch_size=16).generate(PROMPTS, spec)
    gen = HFGenerator(model, tok, batch_size=16, static_cache=True, sync_every=4)
    with pytest.warns(UserWarning, match="capturing the decode step with its sampling failed") as rec:
        fast = gen.generate(PROMPTS, spec)
        again = gen.generate(PROMPTS, spec)
    assert len([w for w in rec if "sampling failed" in str(w.message)]) == 1
    assert gen._static and not gen._decoder.graph_sampling
    assert gen._decoder.graphs and all(k[2] is None for k in gen._decoder.graphs)
    _same(plain, fast)
    _same(plain, again)
