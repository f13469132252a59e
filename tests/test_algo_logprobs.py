"""Chunked token logprobs / entropy against naive log_softmax and cross_entropy references."""

import math

import pytest
import torch
import torch.nn.functional as F

from rlvr.algo import entropy_from_logits, logprobs_and_entropy, token_logprobs_from_logits


def _naive(logits, labels, temperature=1.0):
    ls = torch.log_softmax(logits.double() / temperature, dim=-1)
    lp = ls.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * (labels != -100)
    ent = -(ls.exp() * ls).sum(-1)
    return lp, ent


def test_hand_values():
    # logits [0, ln 3] -> p = [1/4, 3/4]; log p(label 1) = ln(3/4) = -0.28768...
    # entropy = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.34657 + 0.21576 = 0.56233
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    lp, ent = logprobs_and_entropy(logits, torch.tensor([[1]]), with_entropy=True)
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    assert lp.dtype == torch.float32


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_naive_values_and_gradients(chunk, temperature):
    g = torch.Generator().manual_seed(chunk)
    logits = (torch.randn(3, 5, 17, generator=g, dtype=torch.float64) * 4).requires_grad_()
    labels = torch.randint(0, 17, (3, 5), generator=g)
    labels[0, :2] = -100
    labels[2, 4] = -100
    lp, ent = logprobs_and_entropy(logits, labels, chunk_size=chunk, with_entropy=True, temperature=temperature)
    rlp, rent = _naive(logits, labels, temperature)
    assert torch.allclose(lp, rlp, atol=1e-10)
    assert torch.allclose(ent, rent, atol=1e-10)
    assert (lp[labels == -100] == 0).all()
    w1 = torch.randn(3, 5, generator=g, dtype=torch.float64)
    w2 = torch.randn(3, 5, generator=g, dtype=torch.float64)
    (gc,) = torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), logits)
    (gr,) = torch.autograd.grad((rlp * w1).sum() + (rent * w2).sum(), logits)
    assert torch.allclose(gc, gr, atol=1e-10)
    # -100 rows get no gradient from the logprob term
    (gl,) = torch.autograd.grad(logprobs_and_entropy(logits, labels, chunk)[0].sum(), logits)
    assert (gl[0, :2] == 0).all() and (gl[2, 4] == 0).all()


def test_gradcheck_float64():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, -100, 5], [0, 2, 3]])
    assert torch.autograd.gradcheck(lambda a: logprobs_and_entropy(a, labels, 2, True, 0.7), (x,))


def test_against_cross_entropy_float32_and_bf16():
    # Independent implementation: log p(label) = -cross_entropy(logits, label).
    torch.manual_seed(1)
    logits = torch.randn(4, 9, 50) * 3
    labels = torch.randint(0, 50, (4, 9))
    ref = -F.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1), reduction="none").reshape(4, 9)
    assert torch.allclose(token_logprobs_from_logits(logits, labels, chunk_size=5), ref, atol=1e-5)
    lp16 = token_logprobs_from_logits(logits.bfloat16(), labels, chunk_size=5)
    assert lp16.dtype == torch.float32
    ref16 = -F.cross_entropy(logits.bfloat16().float().reshape(-1, 50), labels.reshape(-1), reduction="none")
    assert torch.allclose(lp16, ref16.reshape(4, 9), atol=1e-5)  # same bf16 inputs, fp32 math
    # gradient has the logits' dtype
    x = logits.bfloat16().requires_grad_()
    token_logprobs_from_logits(x, labels, chunk_size=5).sum().backward()
    assert x.grad.dtype == torch.bfloat16


def test_no_grad_and_large_logits_are_stable():
    # logits of +-1e4 overflow a naive exp; logsumexp does not
    logits = torch.tensor([[[1e4, 0.0, -1e4]]])
    with torch.no_grad():
        lp, ent = logprobs_and_entropy(logits, torch.tensor([[0]]), with_entropy=True)
    assert lp.item() == 0.0 and torch.isfinite(ent).all() and ent.item() == pytest.approx(0.0, abs=1e-6)
    # -inf (masked vocabulary) entries give finite entropy: uniform over 2 finite ones = ln 2
    logits = torch.tensor([[[0.0, 0.0, float("-inf")]]], requires_grad=True)
    ent = entropy_from_logits(logits)
    assert ent.item() == pytest.approx(math.log(2), abs=1e-6)
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_all_ignored_and_empty():
    logits = torch.randn(2, 3, 4, requires_grad=True)
    labels = torch.full((2, 3), -100)
    lp = token_logprobs_from_logits(logits, labels)
    assert (lp == 0).all()
    lp.sum().backward()
    assert (logits.grad == 0).all()
    assert token_logprobs_from_logits(torch.randn(0, 3, 4), torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="labels shape"):
        token_logprobs_from_logits(torch.randn(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs_from_logits(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), chunk_size=0)


def test_autograd_saves_only_logits_and_labels():
    # The bounded-memory claim, checked without timing: under autograd, the only tensors kept for
    # backward are the (bf16) logits and the labels -- no fp32 copy, no log_softmax output.
    # The naive version saves a full fp32 (B, T, V) tensor (4 bytes/elt vs 2 for bf16 logits).
    logits = torch.randn(2, 8, 300).bfloat16().requires_grad_()
    labels = torch.randint(0, 300, (2, 8))
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logprobs_and_entropy(logits, labels, chunk_size=4, with_entropy=True)
    logit_bytes = logits.numel() * logits.element_size()
    assert logit_bytes <= sum(saved) <= logit_bytes + labels.numel() * 8  # hooks did fire
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _naive(logits.float(), labels)
    assert sum(saved) >= 2 * logit_bytes  # the reference keeps at least one fp32 copy
