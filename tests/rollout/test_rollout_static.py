"""The hf sampler's static-cache decode (rlvr.rollout.static_decode: the CUDA-graph path, run here on CPU without
capture) gives the same tokens, logprobs, texts and finish reasons as the plain loop at fixed seeds."""

import warnings

import pytest
import torch

from rlvr.models import build_tiny_model
from rlvr.rollout.hf_generator import HFGenerator
from rlvr.rollout.types import SamplingSpec

PROMPTS = ["1+1=", "12*3=", "hello world, ", "7"]  # different lengths: left padding in the batch


@pytest.fixture(scope="module", params=["qwen2", "llama_gqa", "qwen2_gqa_eager"])
def model_tok(request):
    if request.param == "qwen2":
        return build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, seed=0)
    if request.param == "qwen2_gqa_eager":  # eager attention adds the 4-D mask itself
        return build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=4,
                                attn_implementation="eager")
    return build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=1, arch="llama", seed=1)


def both(model, tok, spec, *, sync_every=4, batch_size=12):
    plain = HFGenerator(model, tok, batch_size=batch_size).generate(PROMPTS, spec)
    gen = HFGenerator(model, tok, batch_size=batch_size, static_cache=True, sync_every=sync_every)
    assert gen._static  # the static path was chosen (no fallback)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn
        fast = gen.generate(PROMPTS, spec)
    assert gen._static
    return plain, fast


def assert_same(plain, fast, tol=1e-5):
    assert [r.response_ids for r in fast] == [r.response_ids for r in plain]
    assert [r.text for r in fast] == [r.text for r in plain]
    assert [(r.finish_reason, r.stop_reason) for r in fast] == [(r.finish_reason, r.stop_reason) for r in plain]
    for a, b in zip(fast, plain, strict=True):
        assert len(a.logprobs) == len(b.logprobs)
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0) <= tol


@pytest.mark.parametrize("spec", [
    SamplingSpec(n=3, max_tokens=20, seed=3),
    SamplingSpec(n=3, max_tokens=20, seed=4, temperature=0.7, top_p=0.9),
    SamplingSpec(n=2, max_tokens=20, seed=5, temperature=1.3, top_k=5),
    SamplingSpec(n=1, max_tokens=20, temperature=0),
], ids=["t1", "t0.7_top_p", "top_k", "greedy"])
def test_static_decode_equals_plain(model_tok, spec):
    model, tok = model_tok
    plain, fast = both(model, tok, spec)
    assert len({tuple(r.response_ids) for r in plain}) > 1  # the rows really differ
    assert_same(plain, fast)


@pytest.fixture()
def eos_likely(model_tok):
    """EOS made likely: rows end at different steps (and chunks end before max_tokens)."""
    model, tok = model_tok
    eos = tok.eos_token_id
    h = model.lm_head.register_forward_hook(lambda _m, _i, out: out + 3.0 * (torch.arange(out.shape[-1]) == eos))
    yield model, tok
    h.remove()


@pytest.mark.parametrize("sync_every", [1, 3, 16])
def test_static_decode_eos_and_min_tokens(eos_likely, sync_every):
    model, tok = eos_likely
    spec = SamplingSpec(n=4, max_tokens=24, seed=11)
    plain, fast = both(model, tok, spec, sync_every=sync_every)
    lengths = sorted(len(r.response_ids) for r in plain)
    assert lengths[0] <= 3 and lengths[-1] >= 8  # rows finished at different steps
    assert any(r.stop_reason == "<eos>" for r in plain)
    assert_same(plain, fast)
    spec = SamplingSpec(n=4, max_tokens=24, seed=11, min_tokens=5)
    plain, fast = both(model, tok, spec, sync_every=sync_every)
    assert min(len(r.response_ids) for r in plain) >= 6 or all(r.finish_reason == "length" for r in plain)
    assert_same(plain, fast)


def test_static_decode_stop_strings(model_tok):
    model, tok = model_tok
    free = HFGenerator(model, tok).generate(PROMPTS, SamplingSpec(n=2, max_tokens=20, seed=7))
    # stop strings taken from the free texts: rows stop at different steps (some never)
    stops = (free[0].text[5:7], free[3].text[9:10], free[5].text[2:4])
    for include in (False, True):
        spec = SamplingSpec(n=2, max_tokens=20, seed=7, stop=stops, include_stop_str_in_output=include, min_tokens=2)
        plain, fast = both(model, tok, spec, sync_every=5)
        assert sum(r.finish_reason == "stop" for r in plain) >= 3
        assert_same(plain, fast)


def test_failure_falls_back_to_the_plain_loop_with_one_warning(model_tok, monkeypatch):
    from rlvr.rollout import static_decode

    model, tok = model_tok
    spec = SamplingSpec(n=2, max_tokens=10, seed=2)
    plain = HFGenerator(model, tok).generate(PROMPTS, spec)

    def broken(self, *args):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(static_decode.StaticDecoder, "prefill", broken)
    gen = HFGenerator(model, tok, static_cache=True)
    with pytest.warns(UserWarning, match="static-cache decode failed.*capture failed") as rec:
        got = gen.generate(PROMPTS, spec)
        again = gen.generate(PROMPTS, spec)  # no second warning: the plain loop from then on
    assert len([w for w in rec if "static-cache" in str(w.message)]) == 1
    assert not gen._static
    assert_same(plain, got)
    assert_same(plain, again)


def test_unsupported_model_is_not_chosen(model_tok):
    model, tok = model_tok
    # auto on CPU: off, silently (CPU speed unchanged)
    assert not HFGenerator(model, tok)._static
    assert not HFGenerator(model, tok, cuda_graphs="auto", static_cache=None)._static
    # true on CPU: a warning naming why, then the plain loop
    with pytest.warns(UserWarning, match="not a CUDA device"):
        assert not HFGenerator(model, tok, cuda_graphs=True)._static
    old = model.config._attn_implementation
    model.config._attn_implementation = "flex_attention"
    try:
        with pytest.warns(UserWarning, match="attention implementation 'flex_attention'"):
            assert not HFGenerator(model, tok, static_cache=True)._static
    finally:
        model.config._attn_implementation = old
    with pytest.raises(ValueError, match="cuda_graphs"):
        HFGenerator(model, tok, cuda_graphs="yes")


def test_decoder_reused_for_the_same_shape(model_tok):
    model, tok = model_tok
    gen = HFGenerator(model, tok, batch_size=8, static_cache=True)
    spec = SamplingSpec(n=2, max_tokens=6, seed=1)
    first = gen.generate(PROMPTS, spec)
    d = gen._decoder
    second = gen.generate(PROMPTS, spec)  # same shape: the same cache (reset in place), same results
    assert gen._decoder is d
    assert_same(first, second, tol=0.0)
    gen.generate(PROMPTS, SamplingSpec(n=2, max_tokens=7, seed=1))  # 6 and 7 slots round to the same 16
    assert gen._decoder is d
    gen.generate(PROMPTS, SamplingSpec(n=2, max_tokens=17, seed=1))
    assert gen._decoder is not d and gen._decoder.max_len == 16 + 32


def test_static_decode_stop_strings_with_eos_and_min_tokens(eos_likely):
    # EOS and stop strings in one run: a row's EOS ends it before a later stop string would
    model, tok = eos_likely
    free = HFGenerator(model, tok).generate(PROMPTS, SamplingSpec(n=3, max_tokens=24, seed=13, min_tokens=2))
    longest = max(free, key=lambda r: len(r.text))
    assert len(longest.text) >= 5
    stops = (longest.text[3:5],)
    spec = SamplingSpec(n=3, max_tokens=24, seed=13, stop=stops, min_tokens=2)
    plain, fast = both(model, tok, spec, sync_every=3)
    assert {r.stop_reason for r in plain} >= {"<eos>", stops[0]}
    assert_same(plain, fast)


def test_static_decode_stop_string_at_the_min_tokens_boundary(model_tok):
    # greedy, char tokens: the stop string completes exactly at the min_tokens-th token of row 0
    model, tok = model_tok
    free = HFGenerator(model, tok).generate(PROMPTS, SamplingSpec(temperature=0, max_tokens=12))
    r = next(i for i, x in enumerate(free) if len(tok.decode(x.response_ids[:3], skip_special_tokens=True)) == 3)
    stop = tok.decode(free[r].response_ids[:3])[2]
    spec = SamplingSpec(temperature=0, max_tokens=12, stop=(stop,), min_tokens=3)
    plain, fast = both(model, tok, spec, sync_every=2)
    assert plain[r].finish_reason == "stop" and len(plain[r].response_ids) == 3
    assert_same(plain, fast)


def test_config_key_reaches_the_generator(model_tok):
    from rlvr.config import ConfigError, load_config
    from rlvr.rollout.builder import build_generator
    from rlvr.train.config import RolloutConfig, TrainConfig

    assert load_config(TrainConfig, None, []).rollout.cuda_graphs == "auto"
    with pytest.raises(ConfigError, match="rollout.cuda_graphs"):
        load_config(TrainConfig, None, ["rollout.cuda_graphs=yes"])
    with pytest.raises(ConfigError, match="rollout.cuda_graphs=true: the policy is on the CPU"):
        load_config(TrainConfig, None, ["rollout.cuda_graphs=true", "model.device=cpu"])
    model, tok = model_tok
    with pytest.warns(UserWarning, match="not a CUDA device"):  # true reaches HFGenerator as True
        gen = build_generator(RolloutConfig(backend="hf", batch_size=4, cuda_graphs="true"), model, tok)
    assert not gen._static
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not build_generator(RolloutConfig(backend="hf", batch_size=4, cuda_graphs="false"), model, tok)._static


def test_a_graph_that_cannot_be_captured_falls_back(model_tok, monkeypatch):
    # the CUDA-graph branch forced on a CPU model: the capture fails (no CUDA here), the chunk is redone by
    # the plain loop with one warning, and the results are the plain loop's
    from rlvr.rollout import static_decode

    model, tok = model_tok
    init = static_decode.StaticDecoder.__init__

    def with_graph(self, *a, **k):
        init(self, *a, **k)
        self.use_graph = True

    monkeypatch.setattr(static_decode.StaticDecoder, "__init__", with_graph)
    spec = SamplingSpec(n=2, max_tokens=8, seed=6)
    plain = HFGenerator(model, tok).generate(PROMPTS, spec)
    gen = HFGenerator(model, tok, static_cache=True)
    with pytest.warns(UserWarning, match="static-cache decode failed"):
        got = gen.generate(PROMPTS, spec)
    assert not gen._static and gen._decoder is None
    assert_same(plain, got)


# ----------------------------------------------------------------- rollout.compile_decode (the step compiled)


def test_compiled_decode_step_equals_plain_and_compiles_once(model_tok):
    """The decode step compiled (torch.compile, dynamic shapes) gives the plain loop's tokens and logprobs, and one
    compile serves every step shape of the call: the rows compacted as they end (EOS made likely) and the attended
    slots growing. The step's views never span a whole buffer (a spare row and spare slots), else the layouts
    differ between steps (a view's stride equal to its width, duck-sized equal dims) and it compiled 2-3 times.
    Eager-attention models decode uncompiled, with one warning."""
    from torch._dynamo.utils import counters

    model, tok = model_tok
    eos = tok.eos_token_id
    # (registered before the compile: dynamo does not guard on hooks added after it)
    h = model.lm_head.register_forward_hook(lambda _m, _i, out: out + 2.5 * (torch.arange(out.shape[-1]) == eos))
    torch._dynamo.reset()
    counters.clear()
    try:
        spec = SamplingSpec(n=4, max_tokens=40, seed=11, stop=("0",))
        plain = HFGenerator(model, tok, batch_size=16).generate(PROMPTS, spec)
        gen = HFGenerator(model, tok, batch_size=16, static_cache=True, sync_every=4, compile_decode=True)
        eager_attention = model.config._attn_implementation == "eager"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fast = gen.generate(PROMPTS, spec)
        said = [str(w.message) for w in caught if "compile_decode" in str(w.message)]
        assert gen._static
        assert_same(plain, fast)
        if eager_attention:
            assert len(said) == 1 and "eager" in said[0] and not gen.compile_decode
            assert counters["stats"]["unique_graphs"] == 0
            return
        assert not said and gen._decoder.compiled is not None
        shapes = set(gen._decoder.shapes)
        assert len({b for b, _ in shapes}) > 1 and len({S for _, S in shapes}) > 1, shapes  # compacted, widened
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    finally:
        h.remove()
        torch._dynamo.reset()


def test_a_decode_step_that_fails_to_compile_runs_uncompiled(model_tok, monkeypatch):
    from rlvr.rollout import static_decode

    model, tok = model_tok
    if model.config._attn_implementation == "eager":
        pytest.skip("eager attention is never compiled")

    def broken(*a, **k):
        raise RuntimeError("inductor: no compiler here")

    monkeypatch.setattr(static_decode, "compiled_step", lambda: broken)
    monkeypatch.setattr(static_decode, "compiled_sample_step", lambda: broken)  # (the step with its sampling)
    spec = SamplingSpec(n=2, max_tokens=8, seed=6)
    plain = HFGenerator(model, tok).generate(PROMPTS, spec)
    gen = HFGenerator(model, tok, static_cache=True, compile_decode=True)
    with pytest.warns(UserWarning, match="compile_decode: compiling the decode step failed .*no compiler here"):
        got = gen.generate(PROMPTS, spec)
    assert gen._static and not gen.compile_decode  # the static path stays, uncompiled
    assert_same(plain, got)


def test_compile_decode_key_reaches_the_generator_and_is_refused_where_it_does_nothing(model_tok):
    from rlvr.config import ConfigError, load_config
    from rlvr.rollout.builder import build_generator
    from rlvr.train.config import ModelConfig, RolloutConfig, TrainConfig

    assert load_config(TrainConfig, None, []).rollout.compile_decode is False
    with pytest.raises(ConfigError, match=r"rollout\.compile_decode=true: the policy is on the CPU"):
        load_config(TrainConfig, None, ["rollout.compile_decode=true"])
    gpu = ModelConfig(device="cuda")
    RolloutConfig(backend="hf", compile_decode=True).check_placement(gpu)  # where it runs: accepted
    with pytest.raises(ConfigError, match=r"rollout\.compile_decode=true: rollout\.cuda_graphs=false"):
        RolloutConfig(backend="hf", compile_decode=True, cuda_graphs="false").check_placement(gpu)
    with pytest.raises(ConfigError, match=r"rollout\.compile_decode=true: it compiles the hf sampler"):
        RolloutConfig(backend="vllm", compile_decode=True).check_placement(gpu)
    model, tok = model_tok
    assert build_generator(RolloutConfig(backend="hf", batch_size=4, compile_decode=True), model, tok).compile_decode
    assert not build_generator(RolloutConfig(backend="hf", batch_size=4), model, tok).compile_decode
