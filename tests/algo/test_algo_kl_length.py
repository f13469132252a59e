"""KL estimators and length rewards: hand values, exact expectations, the Kimi table."""

import math

import pytest
import torch

from rlvr.algo import (
    KL_ESTIMATORS,
    dapo_overlong_penalty,
    kimi_length_reward,
    kl_estimate,
    kl_shaped_rewards,
    last_valid_index,
)

LN2 = math.log(2.0)


def test_kl_hand_values():
    # policy 0.5, reference 0.25: d = ln 2 = 0.6931
    # k1 = 0.6931; k2 = 0.5 * 0.6931^2 = 0.2402; k3 = e^-d + d - 1 = 0.5 + 0.6931 - 1 = 0.1931
    # reversed (policy 0.25, ref 0.5): d = -ln 2: k3 = 2 - 0.6931 - 1 = 0.3069, k1_clamped = 0
    lp = torch.tensor([math.log(0.5), math.log(0.25)])
    ref = torch.tensor([math.log(0.25), math.log(0.5)])
    assert kl_estimate("k1", lp, ref).tolist() == pytest.approx([LN2, -LN2])
    assert kl_estimate("k2", lp, ref).tolist() == pytest.approx([0.5 * LN2**2] * 2)
    assert kl_estimate("k3", lp, ref).tolist() == pytest.approx([0.5 + LN2 - 1, 2 - LN2 - 1], abs=1e-6)
    assert kl_estimate("k1_clamped", lp, ref).tolist() == pytest.approx([LN2, 0.0])
    with pytest.raises(KeyError, match="known: k1, k1_clamped, k2, k3"):
        kl_estimate("low_var_kl", lp, ref)


def test_k1_k3_unbiased_exactly_and_k3_nonnegative():
    # E_{x~p}[k] summed exactly over a categorical: k1 and k3 give KL(p || q) exactly,
    # k1_clamped overestimates it, k2 is biased
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    kl = (p * (p / q).log()).sum()
    lp, lq = p.log(), q.log()
    assert (p * KL_ESTIMATORS["k1"](lp, lq)).sum().item() == pytest.approx(kl.item(), abs=1e-12)
    assert (p * KL_ESTIMATORS["k3"](lp, lq)).sum().item() == pytest.approx(kl.item(), abs=1e-12)
    assert (p * KL_ESTIMATORS["k1_clamped"](lp, lq)).sum().item() > kl.item() + 1e-3
    torch.manual_seed(0)
    a, b = torch.randn(1000) * 5, torch.randn(1000) * 5
    assert (KL_ESTIMATORS["k3"](a, b) >= 0).all()
    assert torch.isfinite(KL_ESTIMATORS["k3"](torch.tensor([0.0]), torch.tensor([500.0]))).all()


# Exact expectations over a 3-token softmax (float64). The sample y is drawn from pi, so E_{y~pi}[.]
# weights by pi(y) WITHOUT differentiating through the weights: E[grad k(logp(y), ref(y))] in the
# loss, E[k(y) grad logp(y)] with k detached in the reward (the score-function gradient of a penalty).
# Closed forms for softmax logits theta, d = log pi - log ref:
#   grad_theta KL(pi || ref) = pi * (d - KL(pi || ref));   grad_theta KL(ref || pi) = pi - ref.
# theta = [2, 0, -1], ref logits [0, 1, 0.5]: pi = [0.8438, 0.1142, 0.0420], ref = [0.1863, 0.5065, 0.3072].
THETA = [2.0, 0.0, -1.0]
REF_LOGITS = [0.0, 1.0, 0.5]
GRAD_KL_PI_REF = [0.4131, -0.2867, -0.1265]  # grad KL(pi || ref)
GRAD_KL_REF_PI = [0.6575, -0.3923, -0.2652]  # grad KL(ref || pi)


def _expected_grad(name: str, where: str) -> list[float]:
    theta = torch.tensor(THETA, dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(theta, -1)
    ref = torch.log_softmax(torch.tensor(REF_LOGITS, dtype=torch.float64), -1)
    pi = logp.detach().exp()  # sampling weights: not differentiated
    if where == "loss":
        (pi * KL_ESTIMATORS[name](logp, ref)).sum().backward()
    else:  # reward: -coef * k is a reward, its policy gradient (as a loss) is E[k grad logp]
        (pi * KL_ESTIMATORS[name](logp.detach(), ref) * logp).sum().backward()
    return theta.grad.tolist()


def test_kl_estimator_gradients_exact_enumeration():
    pi = torch.softmax(torch.tensor(THETA, dtype=torch.float64), -1)
    ref = torch.softmax(torch.tensor(REF_LOGITS, dtype=torch.float64), -1)
    d = pi.log() - ref.log()
    fwd = (pi * (d - (pi * d).sum())).tolist()  # independent closed forms
    rev = (pi - ref).tolist()
    assert fwd == pytest.approx(GRAD_KL_PI_REF, abs=1e-4)
    assert rev == pytest.approx(GRAD_KL_REF_PI, abs=1e-4)
    # in the loss: k1 regularises nothing, k2 descends KL(pi || ref), k3 descends KL(ref || pi)
    assert _expected_grad("k1", "loss") == pytest.approx([0.0, 0.0, 0.0], abs=1e-15)
    assert _expected_grad("k2", "loss") == pytest.approx(fwd, abs=1e-12)
    assert _expected_grad("k3", "loss") == pytest.approx(rev, abs=1e-12)
    # k1_clamped: E[1[d > 0] grad logp] = grad pi(S), S = {y: pi(y) > ref(y)} = {0}: pi_0 (e_0 - pi)
    s = pi[0].item()
    assert _expected_grad("k1_clamped", "loss") == pytest.approx(
        [s * (1 - s), -s * pi[1].item(), -s * pi[2].item()], abs=1e-12)
    # in the reward: only k1 gives grad KL(pi || ref); k3's is grad KL(pi||ref) - grad KL(ref||pi)
    assert _expected_grad("k1", "reward") == pytest.approx(fwd, abs=1e-12)
    assert _expected_grad("k3", "reward") == pytest.approx([a - b for a, b in zip(fwd, rev, strict=True)], abs=1e-12)
    assert _expected_grad("k3", "reward") == pytest.approx([-0.2443, 0.1056, 0.1387], abs=1e-4)
    assert _expected_grad("k2", "reward") == pytest.approx([-0.0267, -0.0072, 0.0339], abs=1e-4)


def test_kl_shaped_rewards():
    # right- and left-padded rows; kl 0.1 everywhere, coef 0.5 -> -0.05 on valid tokens;
    # terminal reward 1.0 / 2.0 added on the last valid token (index 2 and 3); empty row gets 0
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0]])
    assert last_valid_index(mask).tolist() == [2, 3, -1]
    kl = torch.full((3, 4), 0.1)
    out = kl_shaped_rewards(torch.tensor([1.0, 2.0, 3.0]), kl, 0.5, mask)
    assert out[0].tolist() == pytest.approx([-0.05, -0.05, 0.95, 0.0])
    assert out[1].tolist() == pytest.approx([0.0, -0.05, -0.05, 1.95])
    assert out[2].tolist() == [0.0, 0.0, 0.0, 0.0]
    tok = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    out = kl_shaped_rewards(tok, kl, 0.5, mask)
    assert out[0].tolist() == pytest.approx([-0.05, 0.95, 1.95, 0.0])


def test_kimi_length_table():
    # lengths 100, 300, 500 (min 100, max 500): lambda = 0.5 - (len - 100)/400 = [0.5, 0, -0.5]
    # correct -> lambda; incorrect -> min(0, lambda) = [0, 0, -0.5]
    lengths = torch.tensor([100, 300, 500, 100, 300, 500])
    correct = torch.tensor([True, True, True, False, False, False])
    r = kimi_length_reward(lengths, correct)
    assert r.tolist() == pytest.approx([0.5, 0.0, -0.5, 0.0, 0.0, -0.5])
    # per group: two groups of 3; the second has all lengths equal -> 0
    r = kimi_length_reward(torch.tensor([100, 300, 500, 7, 7, 7]), torch.ones(6, dtype=torch.bool), group_size=3)
    assert r.tolist() == pytest.approx([0.5, 0.0, -0.5, 0.0, 0.0, 0.0])
    # zero crossing at the midrange, not the mean: lengths 100, 100, 100, 500 -> 100s get +0.5
    r = kimi_length_reward(torch.tensor([100, 100, 100, 500]), torch.ones(4, dtype=torch.bool))
    assert r.tolist() == pytest.approx([0.5, 0.5, 0.5, -0.5])


def test_dapo_overlong():
    # max 20, cache 4: 0 up to 16, then (16 - len)/4: 18 -> -0.5, 20 -> -1, beyond -> -1
    r = dapo_overlong_penalty(torch.tensor([10, 16, 17, 18, 20, 21, 100]), max_len=20, cache_len=4)
    assert r.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    with pytest.raises(ValueError, match="cache_len"):
        dapo_overlong_penalty(torch.tensor([1]), max_len=4, cache_len=8)
