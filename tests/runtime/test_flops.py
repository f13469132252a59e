"""rlvr.runtime's FLOP count (issue 38, item 3: "perf/mfu counts the FLOPs the step really does"): the terms of a
tiny config against a hand count, and FlopCounter against hand-counted tokens, LM-head positions and query-key
pairs for each layout the learner forwards (padded rows, packed rows, packed with each group's prompt once, a
group split across micro-batches), with and without the backward, LoRA and tied embeddings."""

from __future__ import annotations

import threading

import pytest
import torch

from rlvr.config import load_config
from rlvr.models.packed import PackPlan, score_packed
from rlvr.models.tiny import build_tiny_model
from rlvr.models.tokenize import build_training_batch
from rlvr.runtime import FlopCounter, FlopTerms, mfu
from rlvr.train.batching import ForwardSpec
from rlvr.train.config import TrainConfig
from rlvr.train.pg.objective import LossParts, Minibatch, accumulate_gradients, batch_logprobs
from rlvr.train.pg.recipes import get_recipe
from rlvr.train.policy import build_policy

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

H, LAYERS, HEADS, FFN = 32, 2, 2, 64
# per layer: q, k, v, o (H x H each; 2 KV heads of 16 = H) and gate, up, down (H x FFN each)
LINEAR_PER_LAYER = 4 * H * H + 3 * H * FFN  # 10,240
ATTENTION = 4 * HEADS * (H // HEADS) * LAYERS  # 256 FLOPs per query-key pair (QK^T and PV, all layers)
A, B = [5, 6, 7, 8], [9, 10, 11]  # two prompts: 4 and 3 tokens


def _model(tied: bool = False):
    model, tok = build_tiny_model(hidden_size=H, num_layers=LAYERS, num_heads=HEADS, intermediate_size=FFN, seed=0,
                                  tie_word_embeddings=tied)
    return model.train(), tok


def _batch(order=("A3", "A2", "B4", "B1")):
    """Rows named by prompt and response length. Inputs (rlvr.models.tokenize.build_training_batch): the longest
    rows' prompt + response - 1 (the labels are shifted), a shorter row's prompt + response (its last token is an
    input without a label). Here: A3 6, A2 6, B4 6, B1 4 inputs; 10 loss labels."""
    prompts = {"A": A, "B": B}
    P = [prompts[r[0]] for r in order]
    R = [[20 + i for i in range(int(r[1:]))] for r in order]
    return build_training_batch(P, R, 0)


def _hand(t: int, k: int, a: int, vocab: int, *, grad: bool) -> float:
    fwd = 2 * LINEAR_PER_LAYER * LAYERS * t + 2 * H * vocab * k + ATTENTION * a
    return 3 * fwd if grad else fwd  # a full fine-tune's backward: input and weight gradients, 2x the forward


def test_terms_of_a_tiny_config_by_hand():
    model, _ = _model()
    V = model.config.vocab_size
    t = FlopTerms.of(model)
    assert (t.linear, t.linear_grad, t.head, t.head_grad, t.attention) == (
        2 * LINEAR_PER_LAYER * LAYERS, 2 * LINEAR_PER_LAYER * LAYERS, 2 * H * V, 2 * H * V, ATTENTION)
    tied = FlopTerms.of(_model(tied=True)[0])  # the shared embedding is the LM head's matmul, counted once
    assert tied.head == 2 * H * V and tied.linear == t.linear
    assert t.backward(10, 4, 30) == pytest.approx(2 * t.forward(10, 4, 30))


def test_terms_of_a_lora_policy_train_the_adapters_only():
    model, _ = build_policy("tiny", seed=0, lora_rank=4, hidden_size=H, num_layers=LAYERS, num_heads=HEADS,
                            intermediate_size=FFN)
    r = 4
    adapters = LAYERS * (4 * r * (H + H) + 3 * r * (H + FFN))  # A (r x in) and B (out x r) of every linear
    t = FlopTerms.of(model)
    assert t.linear == 2 * (LINEAR_PER_LAYER * LAYERS + adapters)
    assert t.linear_grad == 2 * adapters and t.head_grad == 0 and t.head == 2 * H * model.config.vocab_size
    assert t.attention == ATTENTION


@pytest.mark.parametrize("packing, shared, tokens, logits, pairs", [
    # padded rows (inputs 6, 6, 6, 4): every real token, the LM head everywhere, n (n + 1) / 2 pairs per row
    (False, False, 22, 22, 21 + 21 + 21 + 10),
    # packed rows: the same tokens and pairs, the LM head at the 10 loss labels only
    (True, False, 22, 10, 73),
    # packed, each prompt once: A (inputs 0..3: 4 tokens, 10 pairs) + two suffixes at positions 4, 5 (5 + 6 each);
    # B (3 tokens, 6 pairs) + suffixes at 3, 4, 5 (4 + 5 + 6) and at 3 (4)
    (True, True, 4 + 2 + 2 + 3 + 3 + 1, 10, 10 + 11 + 11 + 6 + 15 + 4),
])
def test_no_grad_forwards_count_what_each_layout_forwards(packing, shared, tokens, logits, pairs):
    model, _ = _model()
    batch = _batch()
    counter = FlopCounter(model)
    with counter.counting():
        batch_logprobs(model, batch, 8, shared_prefix=shared, packing=packing)
    c = counter.counts()
    assert (c["tokens_nograd"], c["logits_nograd"], c["pairs_nograd"]) == (tokens, logits, pairs)
    assert c["tokens_grad"] == 0
    assert counter.flops() == _hand(tokens, logits, pairs, model.config.vocab_size, grad=False)


def test_a_packed_training_step_counts_forward_and_backward_per_micro_batch():
    """accumulate_gradients, packed with the shared prompt, under a budget of 7 tokens: micro-batches [A3], [A2],
    [B4, B1] (rlvr.train.batching.micro_batches: A2 would add 2 tokens to A3's 6), so A's prompt is forwarded
    twice (once per micro-batch holding its group) and B's once."""
    model, _ = _model()
    batch = _batch()
    algo = load_config(TrainConfig, None, ["algo.kl_coef=0", "algo.entropy_coef=0", "algo.packing=true",
                                           "algo.shared_prefix=true", "algo.micro_batch_tokens=7"],
                       base=get_recipe("grpo")).algo
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])  # rows A3, A2, B4, B1
    counter = FlopCounter(model)
    with counter.counting():
        accumulate_gradients(model, Minibatch(batch, adv), LossParts.from_algo(algo), ForwardSpec.of(algo, 8))
    c = counter.counts()
    # [A3] and [A2]: A (4 inputs, 10 pairs) + a suffix at 4, 5 each; [B4, B1]: B (3, 6) + suffixes at 3, 4, 5 and 3
    tokens, pairs = (4 + 2) * 2 + (3 + 3 + 1), (10 + 11) * 2 + (6 + 15 + 4)
    assert (c["tokens_grad"], c["logits_grad"], c["pairs_grad"], c["tokens_nograd"]) == (tokens, 10, pairs, 0)
    V = model.config.vocab_size
    assert counter.flops() == _hand(tokens, 10, pairs, V, grad=True)
    assert any(p.grad is not None for p in model.parameters())  # the backward did run
    # against the old count: 6 N per trained token (every real input, the LM head and attention aside)
    n = sum(p.numel() for p in model.parameters())
    assert counter.flops() != 6 * n * int(batch.attention_mask.sum())


def test_a_packed_forward_called_directly_counts_its_plan():
    model, _ = _model()
    batch = _batch()
    plan = PackPlan.build(batch.attention_mask, batch.response_mask, "cpu", input_ids=batch.input_ids, share=True)
    counter = FlopCounter(model)
    with counter.counting():
        score_packed(model, batch.input_ids, batch.labels, plan)
    c = counter.counts()
    assert c["tokens_grad"] == plan.tokens == 15 and c["logits_grad"] == 10 and c["pairs_grad"] == 57


def test_only_calls_inside_the_window_and_on_its_thread_count():
    model, tok = _model()
    ids = torch.tensor([tok.encode("12+34=")])
    counter = FlopCounter(model)
    with torch.no_grad():
        model(input_ids=ids)  # before the window
        with counter.counting():
            t = threading.Thread(target=lambda: model(input_ids=ids))  # a sampler thread, say
            t.start()
            t.join()
            with counter.suspend():
                model(input_ids=ids)
            model(input_ids=ids)  # the one counted
    n = ids.shape[1]
    assert counter.counts()["tokens_nograd"] == n and counter.counts()["pairs_nograd"] == n * (n + 1) // 2
    counter.detach()
    with counter.counting(), torch.no_grad():
        model(input_ids=ids)
    assert counter.flops() == 0.0


def test_mfu_divides_by_the_peak():
    assert mfu(989e12 * 0.5, 2.0, 989.0) == pytest.approx(0.25)
    assert mfu(None, 1.0, 989.0) is None and mfu(1e12, 1.0, 0.0) is None and mfu(1e12, 0.0, 1.0) is None


def test_a_call_the_counter_cannot_read_never_breaks_the_forward(monkeypatch):
    model, tok = _model()
    ids = torch.tensor([tok.encode("12+34=")])
    counter = FlopCounter(model)

    def unreadable(*a, **k):
        raise TypeError("an argument of a kind the counter does not know")

    monkeypatch.setattr(counter, "_count", unreadable)
    with counter.counting(), torch.no_grad():
        out = model(input_ids=ids)
    assert out.logits.shape[:2] == ids.shape and counter.error.startswith("TypeError") and counter.flops() == 0.0
