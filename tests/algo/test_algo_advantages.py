"""Advantage estimators: the seeds' worked numbers, exact expectations, GAE, process supervision."""

import itertools
import math

import pytest
import torch

from rlvr.algo import (
    ADVANTAGE_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    compute_advantages,
    gae,
    loss_normalizers,
    masked_mean,
    masked_normalize,
    masked_sum,
    process_supervision_advantages,
    whiten,
)

S3 = math.sqrt(3.0)


def test_seed_grpo_1000_population_std():
    # mean 1/4; population std sqrt((3/4)^2/4 + 3*(1/4)^2/4) = sqrt(12/64) = sqrt(3)/4
    # A = (1 - 1/4) / (sqrt(3)/4) = sqrt(3) = 1.732; (0 - 1/4) / (sqrt(3)/4) = -1/sqrt(3) = -0.577
    a = ADVANTAGE_ESTIMATORS["grpo"](torch.tensor([1.0, 0, 0, 0]), 4, eps=1e-8)
    assert a.tolist() == pytest.approx([S3, -1 / S3, -1 / S3, -1 / S3], rel=1e-6)


def test_seed_grpo_1100_and_identical():
    # mean 1/2, population std 1/2 -> [1, 1, -1, -1]
    a = compute_advantages("grpo", torch.tensor([1.0, 1, 0, 0]), 4, eps=1e-8)
    assert a.tolist() == pytest.approx([1, 1, -1, -1], rel=1e-6)
    # identical rewards: numerator exactly 0, denominator eps > 0 -> exactly 0 (not nan, not huge)
    for r in (0.0, 1.0):
        a = compute_advantages("grpo", torch.full((4,), r), 4, eps=1e-6)
        assert (a == 0).all()


def test_grpo_sample_std_and_two_groups():
    # [1,0,0,0]: sum of squared deviations 0.75; sample var 0.75/3 = 0.25, std 0.5
    # A = [0.75/0.5, -0.25/0.5 x3] = [1.5, -0.5, -0.5, -0.5]; group 2 [1,1,0,0]: sample std
    # sqrt(1/3) -> A = 0.5*sqrt(3) = 0.866
    a = compute_advantages("grpo", torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0]), 4, eps=0.0, std="sample")
    h = 0.5 * S3
    assert a.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, h, h, -h, -h], rel=1e-6)


def test_group_mean_rloo_no_baseline_batch_std():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    # group mean: [0.75, -0.25 x3, 0.5, 0.5, -0.5, -0.5]
    gm = compute_advantages("group_mean", r, 4)
    assert gm.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])
    # leave-one-out: 1 - 0 = 1, 0 - 1/3; group 2: 1 - 1/3 = 2/3, 0 - 2/3
    lo = compute_advantages("rloo", r, 4)
    assert lo.tolist() == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3])
    assert torch.allclose(lo, gm * 4 / 3)  # rloo = G/(G-1) * group mean
    assert compute_advantages("no_baseline", r, 4).tolist() == r.tolist()
    # batch std: raw mean 3/8, population var 3/8 * 5/8 = 15/64, std sqrt(15)/8 = 0.48412
    bs = compute_advantages("batch_std", r, 4, eps=0.0)
    assert torch.allclose(bs, gm / (math.sqrt(15) / 8))


def test_estimator_errors():
    with pytest.raises(KeyError, match="known: batch_std, group_mean, grpo, no_baseline, rloo"):
        compute_advantages("ppo", torch.zeros(4), 2)
    with pytest.raises(ValueError, match="multiple of group_size"):
        compute_advantages("grpo", torch.zeros(5), 2)
    with pytest.raises(ValueError, match="rloo needs group_size >= 2"):
        compute_advantages("rloo", torch.zeros(3), 1)
    with pytest.raises(ValueError, match="std must be one of"):
        compute_advantages("grpo", torch.zeros(4), 2, std="unbiased")


def _expected_gradients(probs_logits, rewards, group_size, estimator, scale=1.0):
    """E over all G-tuples of actions of the estimator's gradient, computed exactly.

    Enumerates the 3^G outcomes, weights each by its probability (detached) and uses the library's
    reinforce_with_baseline loss with seq_mean_token_mean aggregation (one token per response):
    loss = (1/G) sum_i -A_i log pi(a_i), so -grad(loss) = (1/G) sum_i A_i grad log pi(a_i).
    """
    theta = probs_logits.clone().requires_grad_()
    logp_all = torch.log_softmax(theta, dim=0)
    outcomes = list(itertools.product(range(len(rewards)), repeat=group_size))
    total = torch.zeros((), dtype=torch.float64)
    for acts in outcomes:
        a = torch.tensor(acts)
        prob = logp_all.detach()[a].sum().exp()
        adv = ADVANTAGE_ESTIMATORS[estimator](rewards[a], group_size) * scale
        logp = logp_all[a].unsqueeze(1)  # (G, 1)
        mask = torch.ones_like(logp)
        per_tok, _ = POLICY_LOSSES["reinforce_with_baseline"](logp, logp.detach(), adv, mask)
        total = total + prob * LOSS_AGGREGATIONS["seq_mean_token_mean"](per_tok, mask, loss_normalizers(mask))
    (g,) = torch.autograd.grad(-total, theta)
    return g


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_exact_expected_gradient_group_mean_vs_rloo(group_size):
    theta = torch.tensor([0.3, -0.5, 0.1], dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    t = theta.clone().requires_grad_()
    (true_grad,) = torch.autograd.grad((torch.softmax(t, 0) * rewards).sum(), t)  # grad of J
    gm = _expected_gradients(theta, rewards, group_size, "group_mean")
    lo = _expected_gradients(theta, rewards, group_size, "rloo")
    nb = _expected_gradients(theta, rewards, group_size, "no_baseline")
    gm_fixed = _expected_gradients(theta, rewards, group_size, "group_mean", scale=group_size / (group_size - 1))
    assert torch.allclose(gm, (1 - 1 / group_size) * true_grad, atol=1e-12)  # the seeds' (1 - 1/G)
    assert torch.allclose(lo, true_grad, atol=1e-12)  # leave-one-out is unbiased
    assert torch.allclose(nb, true_grad, atol=1e-12)
    assert torch.allclose(gm_fixed, true_grad, atol=1e-12)
    assert not torch.allclose(gm, true_grad, atol=1e-6)  # the bias is real, this test can fail


def test_gae_gamma_lambda_one_telescopes():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7]; A_t = sum_{k>=t} r_k - V_t = [0.5, 0.4, 0.3]
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.2, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7, 9.0], [9.0, 0.1, 0.2, 0.3]])
    m = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])  # right padding, left padding
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0)
    # row 2 (left padded): sums of future rewards [1.2, 1.0, 1.0] minus V [0.1, 0.2, 0.3]
    assert adv.tolist()[0] == pytest.approx([0.5, 0.4, 0.3, 0.0])
    assert adv.tolist()[1] == pytest.approx([0.0, 1.1, 0.8, 0.7])
    assert ret.tolist()[0] == pytest.approx([1.0, 1.0, 1.0, 0.0])  # returns = sum of future rewards
    assert ret.tolist()[1] == pytest.approx([0.0, 1.2, 1.0, 1.0])


def test_gae_discounted_hand_values():
    # gamma 0.9, lam 0.5, r = [0, 1], V = [0.5, 0.2], terminal V = 0:
    # delta_1 = 1 + 0.9*0 - 0.2 = 0.8; delta_0 = 0 + 0.9*0.2 - 0.5 = -0.32
    # A_1 = 0.8; A_0 = -0.32 + 0.45 * 0.8 = 0.04; returns = A + V = [0.54, 1.0]
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.2]]), torch.ones(1, 2), 0.9, 0.5)
    assert adv.tolist()[0] == pytest.approx([0.04, 0.8])
    assert ret.tolist()[0] == pytest.approx([0.54, 1.0])


def test_process_supervision_hand_values():
    # group of 2: response 0 has steps with rewards [1, 0] ending at tokens 1 and 3;
    # response 1 has one step with reward 0 ending at token 2. All steps: [1, 0, 0]:
    # mean 1/3, population std sqrt(2/9) = 0.4714 -> normalized [sqrt 2, -1/sqrt 2, -1/sqrt 2]
    # response 0: tokens 0-1 get sqrt2 - 1/sqrt2 = 0.7071; tokens 2-3 get -0.7071; token 4 gets 0
    # response 1: tokens 0-2 get -0.7071; tokens 3-4 get 0
    a = process_supervision_advantages([[1.0, 0.0], [0.0]], [[1, 3], [2]], group_size=2, num_tokens=5, eps=0.0)
    h = 1 / math.sqrt(2)
    assert a[0].tolist() == pytest.approx([h, h, -h, -h, 0.0], abs=1e-6)
    assert a[1].tolist() == pytest.approx([-h, -h, -h, 0.0, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="strictly increasing"):
        process_supervision_advantages([[1.0, 0.0]], [[3, 1]], 1, 5)
    with pytest.raises(ValueError, match="response 0: 2 step rewards but 1"):
        process_supervision_advantages([[1.0, 0.0]], [[3]], 1, 5)


def test_masked_reductions_and_empty_rows():
    x = torch.tensor([[1.0, 2.0, float("nan")], [5.0, 6.0, 7.0]], requires_grad=True)
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert masked_sum(x, m).item() == 3.0  # nan under mask 0 ignored
    assert masked_mean(x, m, dim=-1).tolist() == [1.5, 0.0]  # empty row -> 0, not nan
    assert masked_mean(x, m, dim=0).tolist() == [1.0, 2.0, 0.0]
    assert masked_normalize(x, m, 4.0, dim=-1).tolist() == [0.75, 0.0]  # (1 + 2) / 4
    masked_mean(x, m, dim=-1).sum().backward()
    assert x.grad.tolist() == [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    assert masked_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0


def test_whiten():
    # masked values [1, 2, 3]: mean 2, population var 2/3 -> [-1.2247, 0, 1.2247]
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    w = whiten(x, m, eps=0.0)
    s = math.sqrt(1.5)
    assert torch.allclose(w, torch.tensor([[-s, 0.0, 0.0], [s, 0.0, 0.0]]))
    w2 = whiten(x, m, shift_mean=False, eps=0.0)
    assert torch.allclose(w2, torch.tensor([[-s + 2, 2.0, 0.0], [s + 2, 0.0, 0.0]]))


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.5, 1.0), (1.0, 0.0)])
def test_gae_matches_direct_sum(gamma, lam):
    # Independent form on right-padded rows of length n: A_t = sum_{l=0}^{n-1-t} (gamma*lam)^l delta_{t+l},
    # delta_k = r_k + gamma * V_{k+1} - V_k with V_n = 0; left-padding the same row shifts the result.
    g = torch.Generator().manual_seed(7)
    r = torch.randn(3, 6, generator=g)
    v = torch.randn(3, 6, generator=g)
    lengths = [6, 4, 1]
    mask = torch.zeros(3, 6, dtype=torch.int64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    adv, ret = gae(r, v, mask, gamma, lam)
    for i, n in enumerate(lengths):
        vv = torch.cat([v[i, :n], torch.zeros(1)])
        delta = r[i, :n] + gamma * vv[1:] - vv[:-1]
        ref = [sum((gamma * lam) ** k * delta[t + k] for k in range(n - t)) for t in range(n)]
        assert torch.allclose(adv[i, :n], torch.stack(ref), atol=1e-5)
        assert (adv[i, n:] == 0).all() and (ret[i, n:] == 0).all()
        # the same row left-padded gives the same advantages, shifted
        shift = 6 - n
        lm = torch.zeros(1, 6, dtype=torch.int64)
        lm[0, shift:] = 1
        a2, _ = gae(torch.roll(r[i : i + 1], shift, 1), torch.roll(v[i : i + 1], shift, 1), lm, gamma, lam)
        assert torch.allclose(a2[0, shift:], adv[i, :n], atol=1e-6)
