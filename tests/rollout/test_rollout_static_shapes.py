"""The static-cache decode's shapes (issue 38, S2 and S5): the distinct prompts are prefilled once, finished rows are
compacted out, a step attends to the written slots only (in blocks) with the query heads of a KV head together (no
per-head copy of the cache), and the outputs stay equal to the plain loop's at fixed seeds."""

import warnings

import pytest
import torch

from rlvr.models import build_tiny_model
from rlvr.rollout import static_decode
from rlvr.rollout.hf_generator import HFGenerator
from rlvr.rollout.static_decode import row_counts
from rlvr.rollout.types import SamplingSpec

PROMPTS = ["1+1=", "12*3=", "hello world, ", "7"]


@pytest.fixture(scope="module", params=["qwen2_gqa", "llama_mqa", "qwen2_eager"])
def model_tok(request):
    if request.param == "qwen2_gqa":
        return build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=2)
    if request.param == "qwen2_eager":
        return build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=4,
                                attn_implementation="eager")
    return build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=1, arch="llama", seed=1)


@pytest.fixture()
def eos_likely(model_tok):
    model, tok = model_tok
    eos = tok.eos_token_id
    h = model.lm_head.register_forward_hook(lambda _m, _i, out: out + 2.5 * (torch.arange(out.shape[-1]) == eos))
    yield model, tok
    h.remove()


def static_gen(model, tok, **kw):
    kw.setdefault("batch_size", 12)
    kw.setdefault("sync_every", 3)
    return HFGenerator(model, tok, static_cache=True, **kw)


def generate(gen, spec, prompts=PROMPTS):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to the plain loop would warn
        out = gen.generate(prompts, spec)
    assert gen._static
    return out


def assert_same(a, b, tol=1e-5):
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.text for r in a] == [r.text for r in b]
    assert [(r.finish_reason, r.stop_reason) for r in a] == [(r.finish_reason, r.stop_reason) for r in b]
    for x, y in zip(a, b, strict=True):
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0.0) <= tol


def test_row_counts():
    assert row_counts(512) == [512, 256, 128, 64, 32]
    assert row_counts(12) == [12, 6]
    assert row_counts(16) == [16, 8, 4]
    assert row_counts(3) == [3]


def test_distinct_prompts_prefilled_once(model_tok):
    model, tok = model_tok
    batches = []
    h = model.register_forward_pre_hook(lambda _m, _a, kw: batches.append(tuple(kw["input_ids"].shape)),
                                        with_kwargs=True)
    try:
        spec = SamplingSpec(n=3, max_tokens=8, seed=1)
        fast = generate(static_gen(model, tok), spec)
        prefill = batches[0]
        batches.clear()
        every = generate(static_gen(model, tok, shared_prefix=False), spec)
        prefill_every = batches[0]
    finally:
        h.remove()
    assert prefill == (len(PROMPTS), 16) and prefill_every == (len(PROMPTS) * 3, 16)  # 4 prompts, not 12 rows
    plain = HFGenerator(model, tok, batch_size=12).generate(PROMPTS, spec)
    assert_same(fast, plain)
    assert_same(every, plain)


def test_finished_rows_compacted_out(eos_likely):
    model, tok = eos_likely
    spec = SamplingSpec(n=3, max_tokens=24, seed=11)
    gen = static_gen(model, tok)
    fast = generate(gen, spec)
    rows = [b for b, _ in gen._decoder.shapes]
    assert rows[0] == 12 and rows[-1] == 6 and rows == sorted(rows, reverse=True)  # 12 rows, then 6
    kept = static_gen(model, tok, drop_finished=False)
    full = generate(kept, spec)
    assert {b for b, _ in kept._decoder.shapes} == {12}
    lengths = sorted(len(r.response_ids) for r in fast)
    assert lengths[0] <= 4 and lengths[-1] >= 12  # rows really finished at scattered steps
    plain = HFGenerator(model, tok, batch_size=12).generate(PROMPTS, spec)
    assert_same(fast, plain)
    assert_same(full, plain)


@pytest.mark.parametrize("spec", [SamplingSpec(n=3, max_tokens=24, seed=12, temperature=0.8, top_p=0.9),
                                  SamplingSpec(n=3, max_tokens=24, seed=13, top_k=6, min_tokens=3)],
                         ids=["top_p", "top_k_min_tokens"])
def test_a_rows_tokens_do_not_depend_on_the_batch(eos_likely, spec):
    """Each row draws from its own RNG stream: decoded alone or inside a batch that compacts, the same tokens."""
    model, tok = eos_likely
    batched = generate(static_gen(model, tok), spec)
    alone = generate(static_gen(model, tok, batch_size=1), spec)
    assert_same(batched, alone)


def test_attention_over_the_written_slots_grouped_by_kv_head(model_tok, monkeypatch):
    model, tok = model_tok
    seen, inside = [], [False]
    gqa, sdpa = static_decode.gqa_attention, torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **kw):  # the decode step's attention function (the cache hands it every slot: it reads the mask's width)
        inside[0] = True
        try:
            return gqa(*a, **kw)
        finally:
            inside[0] = False

    def sdpa_spy(q, k, v, attn_mask=None, **kw):  # what it really attends with
        if inside[0]:
            seen.append((tuple(q.shape), tuple(k.shape), tuple(attn_mask.shape)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(static_decode, "gqa_attention", spy)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_spy)
    spec = SamplingSpec(n=2, max_tokens=40, seed=3, min_tokens=40)  # every row decodes all 40 steps
    gen = static_gen(model, tok, batch_size=8)
    fast = generate(gen, spec)
    d = gen._decoder
    L0, heads, kv = 16, model.config.num_attention_heads, model.config.num_key_value_heads
    widths = [w for _, w in d.shapes]
    assert d.max_len == L0 + 48
    # block of 16 response slots: steps 1..16 attend to 32 slots, 17..32 to 48, 33..39 to 64
    assert widths == [L0 + 16] * 16 + [L0 + 32] * 16 + [L0 + 48] * 7
    if model.config._attn_implementation == "sdpa":
        layers = model.config.num_hidden_layers
        assert len(seen) == layers * len(widths)
        for (q, k, m), w in zip(seen, [w for w in widths for _ in range(layers)], strict=True):
            # the query heads of a KV head together, over the written slots only: K/V not repeated per head
            assert q[1:3] == (kv, heads // kv) and k[1:3] == (kv, w) and m[-1] == w
    else:
        assert not seen  # eager attention keeps transformers' own function (over the written slots too)
    plain = HFGenerator(model, tok, batch_size=8).generate(PROMPTS, spec)
    assert_same(fast, plain)


def test_gqa_attention_equals_repeated_heads():
    g = torch.Generator().manual_seed(0)
    b, h, hkv, S, d = 3, 8, 2, 20, 16
    q = torch.randn(b, h, 1, d, generator=g)
    k, v = torch.randn(b, hkv, S, d, generator=g), torch.randn(b, hkv, S, d, generator=g)
    mask = torch.zeros(b, 1, 1, S)
    mask[0, ..., :5] = torch.finfo(torch.float32).min
    mask[2, ..., 11:] = torch.finfo(torch.float32).min
    out, _ = static_decode.gqa_attention(None, q, k, v, mask, scaling=d**-0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1), attn_mask=mask, scale=d**-0.5)
    assert out.shape == (b, 1, h, d)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-6, atol=1e-6)
