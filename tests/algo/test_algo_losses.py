"""Policy losses: ratio-1 gradients, clip hand values, GSPO, Kimi and CISPO against independent forms."""

import math

import pytest
import torch

from rlvr.algo import (
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    loss_normalizers,
    masked_mean,
    policy_loss,
    value_loss,
)


def _grad(name, logp_vals, old_vals, adv, mask, agg="seq_mean_token_mean", **kw):
    logp = torch.tensor(logp_vals, dtype=torch.float64, requires_grad=True)
    old = torch.tensor(old_vals, dtype=torch.float64)
    per_tok, meta = POLICY_LOSSES[name](logp, old, adv, mask, **kw)
    loss = LOSS_AGGREGATIONS[agg](per_tok, mask, loss_normalizers(mask, constant=8.0))
    (g,) = torch.autograd.grad(loss, logp)
    return loss.detach(), g, per_tok.detach(), meta


def test_ratio_one_gradients_equal_policy_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 6, dtype=torch.float64) - 2
    mask = (torch.rand(3, 6) > 0.3).int()
    adv = torch.tensor([1.3, -0.7, 0.2], dtype=torch.float64)
    ref = _grad("reinforce_with_baseline", logp.tolist(), logp.tolist(), adv, mask)[1]
    assert ref.abs().sum() > 0
    for name in ("grpo_clip", "grpo_no_clip", "gspo", "cispo"):
        g = _grad(name, logp.tolist(), logp.tolist(), adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)[1]
        assert torch.allclose(g, ref, atol=1e-12), name
    # Kimi's per-response squared loss, averaged per sequence, has the gradient of REINFORCE with
    # the whole response's log-prob (token SUM): compare with reinforce under seq_mean_token_sum
    ref_sum = _grad("reinforce_with_baseline", logp.tolist(), logp.tolist(), adv, mask, agg="seq_mean_token_sum")[1]
    gk = _grad("kimi", logp.tolist(), logp.tolist(), adv, mask, tau=0.3)[1]
    assert torch.allclose(gk, ref_sum, atol=1e-12)


def test_seed_per_token_coefficients():
    # Two responses, 2 and 8 valid tokens, at ratio 1. The seeds' "coefficient" is per response;
    # our seq mean divides by S = 2 sequences, so coefficient = -dL/dlogp * S.
    mask = torch.zeros(2, 8, dtype=torch.int64)
    mask[0, :2] = 1
    mask[1, :] = 1
    logp = [[-1.0] * 8, [-1.0] * 8]
    for a in (1.0, -1.0):
        adv = torch.tensor([a, a], dtype=torch.float64)
        _, g, _, _ = _grad("grpo_clip", logp, logp, adv, mask, agg="seq_mean_token_mean")
        coef = -g * 2
        # per-response averaging: A/T_i = +-0.5 at 2 tokens, +-0.125 at 8 tokens
        assert coef[0, :2].tolist() == pytest.approx([0.5 * a] * 2)
        assert coef[1].tolist() == pytest.approx([0.125 * a] * 8)
        assert coef[0, 2:].abs().sum() == 0
        # a shared constant 8 (Dr. GRPO): A/8 = +-0.125 at both lengths
        _, g, _, _ = _grad("grpo_clip", logp, logp, adv, mask, agg="seq_mean_token_sum_norm")
        coef = -g * 2
        assert coef[0, :2].tolist() == pytest.approx([0.125 * a] * 2)
        assert coef[1].tolist() == pytest.approx([0.125 * a] * 8)


def test_clip_hand_values_and_fractions():
    # one token per row, ratios exp(logp - old); clip_low 0.2, clip_high 0.28:
    # row 0: A=+1, ratio 1.5 > 1.28 -> loss -1.28, grad 0 (clipped high)
    # row 1: A=+1, ratio 0.5 -> loss -min(0.5, 0.8) = -0.5, grad d(-r)/dlogp = -0.5
    # row 2: A=-1, ratio 0.5 < 0.8 -> loss -min(-0.5, -0.8) = 0.8, grad 0 (clipped low)
    # row 3: A=-1, ratio 1.5 -> loss -min(-1.5, -1.28) = 1.5, grad 1.5
    # row 4: A=-1, ratio 4, no dual clip -> loss 4, grad 4
    ratios = torch.tensor([1.5, 0.5, 0.5, 1.5, 4.0], dtype=torch.float64)
    old = torch.zeros(5, 1, dtype=torch.float64)
    logp = ratios.log().unsqueeze(1).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(5, 1)
    per_tok, meta = policy_loss("grpo_clip", logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert per_tok.squeeze(1).tolist() == pytest.approx([-1.28, -0.5, 0.8, 1.5, 4.0])
    (g,) = torch.autograd.grad(per_tok.sum(), logp)
    assert g.squeeze(1).tolist() == pytest.approx([0.0, -0.5, 0.0, 1.5, 4.0])
    assert meta["clip_frac_high"].item() == pytest.approx(1 / 5)
    assert meta["clip_frac_low"].item() == pytest.approx(1 / 5)
    assert meta["clip_frac_dual"].item() == 0
    assert meta["ratio_max"].item() == pytest.approx(4.0)
    assert meta["ratio_min"].item() == pytest.approx(0.5)
    assert meta["ratio_mean"].item() == pytest.approx(8.0 / 5)
    # dual clip c = 3: row 4 (A<0, ratio 4 > 3) is capped at -c*A = 3 with zero gradient;
    # row 3 (ratio 1.5 < 3) unchanged
    per_tok, meta = policy_loss("grpo_clip", logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert per_tok.squeeze(1).tolist() == pytest.approx([-1.28, -0.5, 0.8, 1.5, 3.0])
    (g,) = torch.autograd.grad(per_tok.sum(), logp)
    assert g.squeeze(1).tolist() == pytest.approx([0.0, -0.5, 0.0, 1.5, 0.0])
    assert meta["clip_frac_dual"].item() == pytest.approx(1 / 5)
    # no clip: loss = -ratio*A, gradient -ratio*A everywhere
    per_tok, _ = policy_loss("grpo_no_clip", logp, old, adv, mask)
    assert per_tok.squeeze(1).tolist() == pytest.approx([-1.5, -0.5, 0.5, 1.5, 4.0])
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss("grpo_clip", logp, old, adv, mask, dual_clip=0.5)
    with pytest.raises(KeyError, match="known: cispo, grpo_clip, grpo_no_clip, gspo, kimi"):
        policy_loss("ppo", logp, old, adv, mask)


def test_masked_positions_are_zero_even_with_garbage():
    logp = torch.tensor([[-1.0, float("nan"), float("inf")]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 0]])
    for name in POLICY_LOSSES:
        per_tok, meta = POLICY_LOSSES[name](logp, old, torch.tensor([1.0]), mask)
        assert per_tok[0, 1:].tolist() == [0.0, 0.0], name
        (g,) = torch.autograd.grad(per_tok.sum(), logp)
        assert torch.isfinite(g).all(), name
        assert all(torch.isfinite(v) for v in meta.values()), name


def test_gspo_matches_sequence_level_form():
    # Independent form: per response s_i = exp(mean_t(logp - old)), loss_i = -min(s_i A_i,
    # clip(s_i) A_i), averaged over responses. Token form + seq_mean_token_mean must equal it
    # in value and gradient, inside and outside the clip range.
    torch.manual_seed(3)
    old = torch.randn(4, 5, dtype=torch.float64) - 2
    delta = torch.tensor([0.01, 0.3, -0.4, 0.05], dtype=torch.float64).unsqueeze(1)
    logp0 = old + delta + 0.02 * torch.randn(4, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    adv = torch.tensor([1.0, 1.0, -1.0, -0.5], dtype=torch.float64)
    lo, hi = 0.2, 0.28
    logp = logp0.clone().requires_grad_()
    per_tok, meta = POLICY_LOSSES["gspo"](logp, old, adv, mask, clip_low=lo, clip_high=hi)
    loss = LOSS_AGGREGATIONS["seq_mean_token_mean"](per_tok, mask, loss_normalizers(mask))
    (g,) = torch.autograd.grad(loss, logp)
    logp2 = logp0.clone().requires_grad_()
    s = torch.exp(masked_mean(logp2 - old, mask, dim=-1))
    ref = (-torch.minimum(s * adv, s.clamp(1 - lo, 1 + hi) * adv)).mean()
    (g2,) = torch.autograd.grad(ref, logp2)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(g, g2, atol=1e-12)
    # row 1 has s ~ exp(0.3) = 1.35 > 1.28 with A > 0: clipped, no gradient
    assert g[1].abs().sum() == 0 and g[0].abs().sum() > 0
    assert meta["clip_frac_high"].item() == pytest.approx(5 / 11)  # 5 of 11 valid tokens


def test_kimi_hand_value():
    # A = 0.5, tau = 0.1, token log-ratios [0.15, 0.05] sum to 0.2:
    # L = (0.5 - 0.1*0.2)^2 / (2*0.1) = 0.48^2 / 0.2 = 1.152, on each valid token;
    # dL/dlogp_t = 2*(0.48)*(-0.1)/(0.2) = -0.48 for each token (token-mean over 2 tokens
    # then gives -0.24 per token)
    old = torch.tensor([[-1.0, -2.0, 0.0]], dtype=torch.float64)
    logp = (old + torch.tensor([[0.15, 0.05, 7.0]], dtype=torch.float64)).requires_grad_()
    mask = torch.tensor([[1, 1, 0]])
    per_tok, _ = policy_loss("kimi", logp, old, torch.tensor([0.5], dtype=torch.float64), mask, tau=0.1)
    assert per_tok[0].tolist() == pytest.approx([1.152, 1.152, 0.0])
    loss = LOSS_AGGREGATIONS["seq_mean_token_mean"](per_tok, mask, loss_normalizers(mask))
    assert loss.item() == pytest.approx(1.152)
    (g,) = torch.autograd.grad(loss, logp)
    assert g[0].tolist() == pytest.approx([-0.48, -0.48, 0.0])
    with pytest.raises(ValueError, match="one advantage per response"):
        policy_loss("kimi", logp, old, torch.ones(1, 3), mask)


def test_value_loss_hand_values():
    # token 0: V=1.0, old=0.5, R=2.0, clip 0.2 -> V_clip = 0.7; errors 1.0 vs 1.69 -> 0.5*1.69 = 0.845,
    #          the clipped branch wins and its gradient w.r.t. V is 0 (clamp saturated)
    # token 1: V=0.6, old=0.5, R=2.0 -> inside the clip range: 0.5*1.4^2 = 0.98, grad V - R = -1.4
    # token 2: masked
    v = torch.tensor([[1.0, 0.6, 5.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.0]])
    ret = torch.tensor([[2.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, meta = value_loss(v, old, ret, mask, clip_range=0.2)
    assert loss[0].tolist() == pytest.approx([0.845, 0.98, 0.0])
    (g,) = torch.autograd.grad(loss.sum(), v)
    assert g[0].tolist() == pytest.approx([0.0, -1.4, 0.0])
    assert meta["value_clip_frac"].item() == pytest.approx(0.5)
    loss, _ = value_loss(v, old, ret, mask)  # unclipped: 0.5*(1-2)^2 = 0.5
    assert loss[0].tolist() == pytest.approx([0.5, 0.98, 0.0])


def test_cispo_hand_values_and_fractions():
    # the rows of test_clip_hand_values_and_fractions (one token each, old logp 0, logp = log ratio),
    # clip_low 0.2 / clip_high 0.28: the detached weight w = clip(ratio, 0.8, 1.28), loss -w A logp,
    # gradient -w A (never 0, unlike grpo_clip on rows 0 and 2):
    # row 0: A=+1, ratio 1.5 -> w 1.28, loss -1.28 ln 1.5,         grad -1.28
    # row 1: A=+1, ratio 0.5 -> w 0.8,  loss -0.8 ln 0.5 = +0.5545, grad -0.8
    # row 2: A=-1, ratio 0.5 -> w 0.8,  loss +0.8 ln 0.5,          grad +0.8
    # row 3: A=-1, ratio 1.5 -> w 1.28, loss +1.28 ln 1.5,         grad +1.28
    # row 4: A=-1, ratio 4   -> w 1.28, loss +1.28 ln 4 = 1.7745,  grad +1.28
    ratios = torch.tensor([1.5, 0.5, 0.5, 1.5, 4.0], dtype=torch.float64)
    old = torch.zeros(5, 1, dtype=torch.float64)
    logp = ratios.log().unsqueeze(1).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(5, 1)
    per_tok, meta = policy_loss("cispo", logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    ln15, ln05, ln4 = math.log(1.5), math.log(0.5), math.log(4.0)
    assert per_tok.squeeze(1).tolist() == pytest.approx(
        [-1.28 * ln15, -0.8 * ln05, 0.8 * ln05, 1.28 * ln15, 1.28 * ln4])
    assert per_tok[4, 0].item() == pytest.approx(1.7744563, abs=1e-6)
    (g,) = torch.autograd.grad(per_tok.sum(), logp)
    assert g.squeeze(1).tolist() == pytest.approx([-1.28, -0.8, 0.8, 1.28, 1.28])
    # the weight is clipped on rows 1, 2 (low) and 0, 3, 4 (high), whatever the sign of A
    assert meta["clip_frac_low"].item() == pytest.approx(2 / 5)
    assert meta["clip_frac_high"].item() == pytest.approx(3 / 5)
    assert meta["ratio_max"].item() == pytest.approx(4.0) and meta["ratio_min"].item() == pytest.approx(0.5)
    # MiniMax-M1's setting: no lower bound (clip_low = 1), only the cap; rows 1 and 2 keep their weight 0.5
    per_tok, meta = policy_loss("cispo", logp, old, adv, mask, clip_low=1.0, clip_high=0.28)
    (g,) = torch.autograd.grad(per_tok.sum(), logp)
    assert g.squeeze(1).tolist() == pytest.approx([-1.28, -0.5, 0.5, 1.28, 1.28])
    assert meta["clip_frac_low"].item() == 0.0
    with pytest.raises(ValueError, match="clip_low and clip_high must be >= 0"):
        policy_loss("cispo", logp, old, adv, mask, clip_low=-0.1)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_cispo_matches_an_independent_autograd_form(agg):
    # Independent form, off policy, per-token advantages: w = clip(exp(logp - old), 1 - lo, 1 + hi)
    # computed without gradient; J = sum over valid tokens of w A logp, normalized like the aggregation.
    torch.manual_seed(5)
    old = torch.randn(3, 6, dtype=torch.float64) - 2
    logp0 = old + 0.4 * torch.randn(3, 6, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]])
    adv = torch.randn(3, 6, dtype=torch.float64)
    lo, hi = 0.1, 0.3
    logp = logp0.clone().requires_grad_()
    per_tok, _ = POLICY_LOSSES["cispo"](logp, old, adv, mask, clip_low=lo, clip_high=hi)
    loss = LOSS_AGGREGATIONS[agg](per_tok, mask, loss_normalizers(mask))
    (g,) = torch.autograd.grad(loss, logp)
    logp2 = logp0.clone().requires_grad_()
    with torch.no_grad():
        w = torch.exp(logp0 - old).clamp(1 - lo, 1 + hi)
    m = mask.double()
    tok = -w * adv * logp2 * m
    ref = tok.sum() / m.sum() if agg == "token_mean" else (tok.sum(-1) / m.sum(-1)).mean()
    (g2,) = torch.autograd.grad(ref, logp2)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(g, g2, atol=1e-12)
    # some weights were clipped at each end, and every valid token still has a gradient
    r = torch.exp(logp0 - old)[mask.bool()]
    assert (r < 1 - lo).any() and (r > 1 + hi).any()
    assert (g[mask.bool()] != 0).all() and (g[~mask.bool()] == 0).all()
