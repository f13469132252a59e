"""HFGenerator: sampler logprobs vs scoring, stop strings, min_tokens, grouping, seeds, weights."""

import math

import pytest
import torch

from rlvr.models import build_tiny_model, score_tokens
from rlvr.rollout import HFGenerator, SamplingSpec, rollouts_to_batch
from rlvr.rollout.hf_generator import process_logits, sample_rows

PROMPTS = ["12+3=", "7*8=", "100-1="]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=0)


def test_process_logits_hand_computed():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    # temperature 1, no truncation: unchanged
    assert torch.allclose(
        process_logits(logits, 1.0, 0, 1.0).exp(), torch.tensor([[0.5, 0.3, 0.2]]), atol=1e-6
    )
    # top_p = 0.6: mass before 0.3 is 0.5 < 0.6 (kept), before 0.2 is 0.8 >= 0.6 (dropped);
    # renormalized: 0.5/0.8 = 0.625, 0.3/0.8 = 0.375
    assert torch.allclose(
        process_logits(logits, 1.0, 0, 0.6).exp(), torch.tensor([[0.625, 0.375, 0.0]]), atol=1e-6
    )
    # top_k = 1: point mass on the argmax
    assert torch.allclose(process_logits(logits, 1.0, 1, 1.0).exp(), torch.tensor([[1.0, 0.0, 0.0]]))
    # temperature 2: p ∝ sqrt(p) = .70711, .54772, .44721 (sum 1.70204) -> .41544, .32180, .26275
    assert torch.allclose(
        process_logits(logits, 2.0, 0, 1.0).exp(), torch.tensor([[0.41544, 0.32180, 0.26275]]), atol=1e-4
    )


def test_sample_rows_inverse_cdf_hand_computed():
    # cdf = 0.5, 0.5, 0.8, 1.0: u < 0.5 -> 0; token 1 has p = 0 and is skipped; 0.5 < u < 0.8 -> 2
    logp = torch.log(torch.tensor([[0.5, 0.0, 0.3, 0.2]])).expand(5, 4)
    u = torch.tensor([0.0, 0.49, 0.51, 0.79, 0.999], dtype=torch.float64)
    assert sample_rows(logp, u).tolist() == [0, 0, 2, 2, 3]
    # u at the very top never lands on a removed (p = 0) token at the end of the vocabulary
    tail_removed = torch.log(torch.tensor([[0.25, 0.75, 0.0, 0.0]]))
    assert sample_rows(tail_removed, torch.tensor([1.0 - 1e-17], dtype=torch.float64)).tolist() == [1]


def test_sample_rows_frequencies_follow_probabilities():
    logp = torch.log(torch.tensor([[0.5, 0.0, 0.3, 0.2]]))
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    u = torch.rand(4000, generator=g, dtype=torch.float64)
    for k in range(4000):
        counts[sample_rows(logp, u[k : k + 1])[0]] += 1
    freq = counts / 4000
    assert freq[1] == 0  # zero-probability token never drawn
    # binomial std at p=0.5, n=4000 is 0.0079; 4 sigma = 0.032
    assert torch.allclose(freq, torch.tensor([0.5, 0.0, 0.3, 0.2]), atol=0.032)


def test_sampler_logprobs_equal_scoring_forward_at_temperature_one(tiny):
    model, tok = tiny
    gen = HFGenerator(model, tok, batch_size=4)
    rollouts = gen.generate(PROMPTS, SamplingSpec(n=2, max_tokens=12, seed=3))
    batch = rollouts_to_batch(rollouts, tok.pad_token_id)
    with torch.no_grad():
        s = score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask)
    m = batch.response_mask
    assert m.sum() == sum(len(r.response_ids) for r in rollouts)
    assert torch.allclose(s.logprobs[m], batch.sampler_logprobs[m], atol=1e-4)
    # and the per-rollout logprobs are log-probabilities: negative, finite
    assert all(-30 < lp <= 0 for r in rollouts for lp in r.logprobs)


def test_sampler_logprobs_at_temperature_are_the_tempered_distribution(tiny):
    model, tok = tiny
    gen = HFGenerator(model, tok)
    rollouts = gen.generate(PROMPTS[:1], SamplingSpec(n=2, temperature=0.7, max_tokens=8, seed=1))
    batch = rollouts_to_batch(rollouts, tok.pad_token_id)
    with torch.no_grad():
        s = score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask, temperature=0.7)
    m = batch.response_mask
    assert torch.allclose(s.logprobs[m], batch.sampler_logprobs[m], atol=1e-4)


def test_n_per_prompt_grouped_prompt_major(tiny):
    model, tok = tiny
    rollouts = HFGenerator(model, tok, batch_size=4).generate(
        PROMPTS, SamplingSpec(n=3, max_tokens=4, seed=0)
    )
    assert [r.group for r in rollouts] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [r.sample_index for r in rollouts] == [0, 1, 2] * 3
    assert [r.prompt for r in rollouts] == [p for p in PROMPTS for _ in range(3)]
    assert all(r.prompt_ids == tok.encode(r.prompt) for r in rollouts)
    assert len({tuple(r.response_ids) for r in rollouts}) > 1


def test_same_seed_same_rollouts_independent_of_batch_size(tiny):
    model, tok = tiny
    spec = SamplingSpec(n=3, max_tokens=10, seed=11)
    a = HFGenerator(model, tok, batch_size=9).generate(PROMPTS, spec)
    b = HFGenerator(model, tok, batch_size=2).generate(PROMPTS, spec)
    c = HFGenerator(model, tok, batch_size=9).generate(PROMPTS, SamplingSpec(n=3, max_tokens=10, seed=12))
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.text for r in a] == [r.text for r in b]
    assert [r.response_ids for r in a] != [r.response_ids for r in c]
    # the global RNG does not matter when a seed is given
    torch.manual_seed(999)
    d = HFGenerator(model, tok, batch_size=9).generate(PROMPTS, spec)
    assert [r.response_ids for r in a] == [r.response_ids for r in d]


def test_kv_cache_and_full_recompute_agree(tiny):
    model, tok = tiny
    spec = SamplingSpec(n=2, max_tokens=10, seed=5)
    a = HFGenerator(model, tok, use_cache=True).generate(PROMPTS, spec)
    b = HFGenerator(model, tok, use_cache=False).generate(PROMPTS, spec)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    for x, y in zip(a, b, strict=True):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4


def test_left_padding_does_not_change_greedy_output(tiny):
    model, tok = tiny
    spec = SamplingSpec(temperature=0, max_tokens=8)
    together = HFGenerator(model, tok).generate(["1", "123456789+1="], spec)
    alone = HFGenerator(model, tok).generate(["1"], spec)
    assert together[0].response_ids == alone[0].response_ids


def test_top_k_one_is_greedy_with_logprob_zero(tiny):
    model, tok = tiny
    greedy = HFGenerator(model, tok).generate(PROMPTS, SamplingSpec(temperature=0, max_tokens=6))
    k1 = HFGenerator(model, tok).generate(PROMPTS, SamplingSpec(top_k=1, max_tokens=6, seed=4))
    assert [r.response_ids for r in greedy] == [r.response_ids for r in k1]
    # the sampled distribution is a point mass: log 1 = 0
    assert all(lp == 0.0 for r in k1 for lp in r.logprobs)
    # greedy reports the untempered model logprob, which is < 0
    assert all(lp < 0 for r in greedy for lp in r.logprobs)


def test_stop_strings_cut_text_and_set_finish_reason(tiny):
    model, tok = tiny
    gen = HFGenerator(model, tok)
    free = gen.generate(["5+5="], SamplingSpec(temperature=0, max_tokens=12))[0]
    assert free.finish_reason == "length" and len(free.text) == 12  # 12 char tokens, no EOS
    stop = free.text[4:6]  # a 2-character stop string; its first occurrence decides
    k = free.text.find(stop)
    cut = gen.generate(["5+5="], SamplingSpec(temperature=0, max_tokens=12, stop=("zzz", stop)))[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == free.text[:k]
    # char tokenizer: the stop completes at token k+1 (0-based), which is the last one kept
    assert cut.response_ids == free.response_ids[: k + 2]
    kept = gen.generate(
        ["5+5="], SamplingSpec(temperature=0, max_tokens=12, stop=(stop,), include_stop_str_in_output=True)
    )[0]
    assert kept.text == free.text[: k + 2] and kept.finish_reason == "stop"


@pytest.fixture()
def eos_loving(tiny):
    model, tok = tiny
    eos = tok.eos_token_id

    def hook(_module, _inputs, output):
        output = output.clone()
        output[..., eos] += 50.0  # EOS becomes the overwhelming favourite at every step
        return output

    handle = model.lm_head.register_forward_hook(hook)
    yield model, tok
    handle.remove()


def test_eos_stops_and_min_tokens_suppresses_it(eos_loving):
    model, tok = eos_loving
    gen = HFGenerator(model, tok)
    r = gen.generate(["1+1="], SamplingSpec(max_tokens=10, seed=0))[0]
    assert r.response_ids == [tok.eos_token_id] and r.text == "" and r.finish_reason == "stop"
    assert r.stop_reason == "<eos>"
    r = gen.generate(["1+1="], SamplingSpec(max_tokens=10, min_tokens=4, seed=0))[0]
    # 4 forced non-EOS tokens, then EOS at the 5th step
    assert len(r.response_ids) == 5 and r.response_ids[-1] == tok.eos_token_id
    assert tok.eos_token_id not in r.response_ids[:4]
    assert r.text == tok.decode(r.response_ids[:4], skip_special_tokens=True)  # the text ends before EOS
    # before min_tokens EOS had probability 0 in the sampled distribution; logprobs renormalized
    assert all(math.isfinite(x) for x in r.logprobs)


def test_min_tokens_also_defers_stop_strings(tiny):
    model, tok = tiny
    gen = HFGenerator(model, tok)
    free = gen.generate(["5+5="], SamplingSpec(temperature=0, max_tokens=12))[0]
    stop = free.text[0]  # completes at the first token
    r = gen.generate(["5+5="], SamplingSpec(temperature=0, max_tokens=12, stop=(stop,), min_tokens=3))[0]
    # stops are checked once the response has min_tokens = 3 tokens: an occurrence must end at
    # character (= token) index >= 2, i.e. start at >= 3 - len(stop)
    later = free.text.find(stop, 3 - len(stop))
    if later == -1:
        assert r.finish_reason == "length" and r.text == free.text
    else:
        assert r.finish_reason == "stop" and r.text == free.text[:later]


def test_update_weights_copies_into_a_separate_model(tiny):
    model, tok = tiny
    other, _ = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=1)
    spec = SamplingSpec(temperature=0, max_tokens=8)
    target = HFGenerator(other, tok).generate(PROMPTS, spec)
    copy, _ = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=0)
    gen = HFGenerator(copy, tok)
    before = gen.generate(PROMPTS, spec)
    assert [r.text for r in before] != [r.text for r in target]
    gen.update_weights(other.named_parameters(), version=3)
    after = gen.generate(PROMPTS, spec)
    assert [r.response_ids for r in after] == [r.response_ids for r in target]
    assert gen.weight_version == 3 and all(r.weight_version == 3 for r in after)
    with pytest.raises(KeyError, match="unknown tensor 'nope'"):
        gen.update_weights([("nope", torch.zeros(1))], version=4)


def test_colocated_generator_sees_trainer_updates(tiny):
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=2)
    gen = HFGenerator(model, tok)
    spec = SamplingSpec(temperature=0, max_tokens=5)
    before = gen.generate(["9="], spec)[0].response_ids
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight))
    gen.update_weights(model.named_parameters(), version=1)  # same storage: only the version moves
    after = gen.generate(["9="], spec)[0]
    assert after.response_ids != before and after.weight_version == 1


def test_spec_validation_names_the_field():
    with pytest.raises(ValueError, match="top_p"):
        SamplingSpec(top_p=0)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingSpec(max_tokens=3, min_tokens=4)
    assert SamplingSpec(stop="</answer>").stop == ("</answer>",)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_dropping_finished_rows_changes_nothing(tiny, monkeypatch, shared_prefix):
    # EOS made fairly likely: responses end at different steps, so finished rows are dropped
    # from the batch (and its KV cache: the rows' own K/V under cascade attention, the whole
    # DynamicCache otherwise) mid-generation; each row must still get exactly what it gets when
    # decoded alone.
    from transformers import DynamicCache

    from rlvr.models.cascade import SharedPrefixKV

    model, tok = tiny
    selects = []
    for cls, name in ((DynamicCache, "batch_select_indices"), (SharedPrefixKV, "select_rows")):
        original = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, idx, _o=original: (selects.append(len(idx)), _o(self, idx))[1])
    h = model.lm_head.register_forward_hook(
        lambda _m, _i, out: out + 3.0 * (torch.arange(out.shape[-1]) == 2)
    )
    try:
        spec = SamplingSpec(n=4, max_tokens=16, seed=21)
        batched = HFGenerator(model, tok, batch_size=12, shared_prefix=shared_prefix).generate(PROMPTS, spec)
        alone = HFGenerator(model, tok, batch_size=1).generate(PROMPTS, spec)
        recompute = HFGenerator(model, tok, batch_size=12, use_cache=False).generate(PROMPTS, spec)
    finally:
        h.remove()
    lengths = sorted(len(r.response_ids) for r in batched)
    assert lengths[0] <= 4 and lengths[-1] >= 8  # rows really finished at different steps
    assert selects and min(selects) <= 9  # the 12-row batch was compacted at least once
    assert [r.response_ids for r in batched] == [r.response_ids for r in alone]
    assert [r.response_ids for r in batched] == [r.response_ids for r in recompute]
    for a, b in zip(batched, alone, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
