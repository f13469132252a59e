"""Thinking budget: forced stop-thinking text, loss mask, budget 0, natural close, EOS."""

import pytest
import torch

from rlvr.models import build_tiny_model, score_tokens
from rlvr.rollout import HFGenerator, SamplingSpec, rollouts_to_batch
from rlvr.rollout.thinking import QWEN3_STOP_THINKING, generate_with_thinking_budget

PROMPTS = ["Q: 12+3=? <think>", "Q: 7*8=? <think>"]


@pytest.fixture(scope="module")
def gen():
    model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=0)
    return HFGenerator(model, tok, batch_size=8)


def test_budget_forces_the_answer_and_masks_forced_tokens(gen):
    tok = gen.tokenizer
    forced = tok.encode(QWEN3_STOP_THINKING, add_special_tokens=False)
    assert tok.decode(forced) == QWEN3_STOP_THINKING  # the forced text is in the tiny alphabet
    spec = SamplingSpec(n=2, max_tokens=5, seed=3)
    rollouts = generate_with_thinking_budget(gen, PROMPTS, spec, budget_tokens=6)
    assert [r.group for r in rollouts] == [0, 0, 1, 1]
    for r in rollouts:
        # 6 sampled reasoning tokens, the forced text, then up to 5 sampled answer tokens
        assert r.response_ids[6 : 6 + len(forced)] == forced
        assert r.loss_mask == [True] * 6 + [False] * len(forced) + [True] * (
            len(r.response_ids) - 6 - len(forced)
        )
        assert 1 <= len(r.response_ids) - 6 - len(forced) <= 5
        assert r.text[6 : 6 + len(QWEN3_STOP_THINKING)] == QWEN3_STOP_THINKING  # 1 char per token
        assert all(lp == 0.0 for lp, m in zip(r.logprobs, r.loss_mask, strict=True) if not m)
    # the trainer's forward over the same tokens reproduces the sampler logprobs of every
    # sampled token, including answer tokens that condition on the forced text
    batch = rollouts_to_batch(rollouts, tok.pad_token_id)
    assert batch.response_mask.sum() == sum(sum(r.loss_mask) for r in rollouts)
    with torch.no_grad():
        s = score_tokens(gen.model, batch.input_ids, batch.labels, batch.attention_mask)
    m = batch.response_mask
    assert torch.allclose(s.logprobs[m], batch.sampler_logprobs[m], atol=1e-4)


def test_natural_close_within_budget_adds_nothing(gen):
    free = gen.generate(PROMPTS[:1], SamplingSpec(temperature=0, max_tokens=20))[0]
    think_end = free.text[2:4]  # the greedy reasoning "closes" at token 3 (0-based) at the latest
    k = free.text.find(think_end)
    spec = SamplingSpec(temperature=0, max_tokens=6)
    r = generate_with_thinking_budget(gen, PROMPTS[:1], spec, budget_tokens=10, think_end=think_end)[0]
    assert all(r.loss_mask)
    # greedy all the way: reasoning up to the close, then 6 answer tokens = the free greedy run
    assert r.response_ids == free.response_ids[: k + 2 + 6]
    assert r.text == free.text[: k + 2 + 6]


def test_budget_zero_puts_an_empty_think_block_in_the_prompt(gen):
    spec = SamplingSpec(temperature=0, max_tokens=4)
    rs = generate_with_thinking_budget(gen, ["Q: 1+1=? <think>", "Q: 2+2=?"], spec, budget_tokens=0)
    assert rs[0].prompt == "Q: 1+1=? <think>\n\n</think>\n\n"
    assert rs[1].prompt == "Q: 2+2=?<think>\n\n</think>\n\n"
    assert rs[0].prompt_ids == gen.tokenizer.encode(rs[0].prompt)
    assert all(r.loss_mask is None and len(r.response_ids) == 4 for r in rs)


def test_eos_inside_thinking_ends_the_response(gen):
    model, tok = gen.model, gen.tokenizer

    def hook(_m, _i, out):
        out = out.clone()
        out[..., tok.eos_token_id] += 50.0
        return out

    h = model.lm_head.register_forward_hook(hook)
    try:
        r = generate_with_thinking_budget(
            gen, PROMPTS[:1], SamplingSpec(max_tokens=5, seed=0), budget_tokens=8
        )[0]
    finally:
        h.remove()
    assert r.response_ids == [tok.eos_token_id] and r.finish_reason == "stop" and r.loss_mask == [True]


def test_negative_budget_is_rejected(gen):
    with pytest.raises(ValueError, match="budget_tokens must be >= 0"):
        generate_with_thinking_budget(gen, PROMPTS, SamplingSpec(), budget_tokens=-1)


def test_budget_ending_inside_a_multi_token_closing_tag_completes_the_tag(gen):
    # The tiny tokenizer spells every tag in one token per character, as many real tokenizers spell
    # "</think>". When the budget runs out after the tag's first characters, the rest of the tag is
    # forced (then what follows the tag in the forced text), not the whole forced text after "</th".
    budget = 12
    for seed in range(50):  # a sampled reasoning whose 5-character window below occurs only once
        spec = SamplingSpec(max_tokens=4, seed=seed)  # per-sample seeds: phase 1 = the free run's start
        free = gen.generate(PROMPTS[:1], SamplingSpec(max_tokens=30, seed=seed))[0]
        think_end = free.text[budget - 3 : budget + 2]  # the reasoning's last 3 characters open the tag
        if len(free.text) >= budget + 2 and think_end not in free.text[: budget + 1]:
            break
    assert think_end not in free.text[: budget + 1]  # (so the stop string does not fire earlier)
    forced_text = "\n\nAnswer now.\n" + think_end + "\n\n"
    r = generate_with_thinking_budget(gen, PROMPTS[:1], spec, budget_tokens=budget,
                                      stop_thinking_text=forced_text, think_end=think_end)[0]
    tail = think_end[3:] + "\n\n"
    assert r.text[:budget] == free.text[:budget]
    assert r.text[budget : budget + len(tail)] == tail  # the tag completed, nothing else forced
    assert think_end in r.text and "Answer now." not in r.text
    assert r.loss_mask == [True] * budget + [False] * len(tail) + [True] * (len(r.response_ids) - budget - len(tail))
    # a budget that ends elsewhere still gets the whole forced text
    r2 = generate_with_thinking_budget(gen, PROMPTS[:1], spec, budget_tokens=budget - 5,
                                       stop_thinking_text=forced_text, think_end=think_end)[0]
    assert r2.text[budget - 5 : budget - 5 + len(forced_text)] == forced_text
