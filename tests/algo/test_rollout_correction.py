"""Sampler/trainer mismatch correction (algo.rollout_correction, rlvr.algo.correction) and the trainer
scoring the sampler's truncated (top-k / top-p) distribution.

- hand-computed weights, truncations and masks of every mode;
- exact enumeration through the real loss path (micro_batch_loss on a policy whose logits are a
  parameter table): E_{y~q}[w A grad log pi] with a large cap equals the sampler-free gradient
  E_{y~pi}[A grad log pi]; with a small cap it differs by the hand-computed clipped amount; the
  sequence weight on length-2 responses likewise;
- top-p / top-k: with the trainer scoring pi_K (the same kept-set rule as the sampler) the weighted
  gradient equals E_{pi_K}[A grad log pi_K] exactly, while a ratio against the full softmax is off
  by log(kept mass) on every token (the peers' bias);
- config: auto resolves by backend, a bad value names the key; a short `rlvr.train.pg.loop.train` run with a
  generator whose sampler logprobs are perturbed logs the correction metrics and a gradient that
  differs from algo.rollout_correction=none.
"""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
import torch

from rlvr.algo import (
    ROLLOUT_CORRECTIONS,
    TRUNCATED_LOGPROB,
    LossNormalizers,
    Truncation,
    rollout_correction,
)
from rlvr.config import ConfigError, load_config
from rlvr.models.tokenize import build_training_batch
from rlvr.rollout.hf_generator import process_logits
from rlvr.train.batching import ForwardSpec
from rlvr.train.config import AlgoConfig, TrainConfig
from rlvr.train.pg.objective import LossParts, Minibatch, Objective, accumulate_gradients, micro_batch_loss

# ------------------------------------------------------------------------------- the pure math

# one response of 3 valid tokens and a pad: d = old - sampler = [0.5, 0, -1.9]
OLD = torch.tensor([[-1.0, -0.5, -2.0, 0.0]])
SAMPLER = torch.tensor([[-1.5, -0.5, -0.1, 0.0]])
MASK = torch.tensor([[True, True, True, False]])
E05, E19 = math.exp(0.5), math.exp(-1.9)  # 1.648721, 0.149569


def _stats(c):
    return {k: float(v) for k, v in c.stats.items()}


def test_token_tis_hand_computed():
    c = rollout_correction("token_tis", OLD, SAMPLER, MASK, cap=1.5)
    # ratios [1.648721, 1, 0.149569]; min(ratio, 1.5) = [1.5, 1, 0.149569]; the pad gets 0
    assert torch.allclose(c.weight, torch.tensor([[1.5, 1.0, E19, 0.0]]), atol=1e-6)
    assert c.keep.tolist() == [[True, True, True, False]]
    st = _stats(c)
    assert st["correction_ratio_mean"] == pytest.approx((E05 + 1 + E19) / 3, abs=1e-6)  # 0.932763
    assert st["correction_ratio_min"] == pytest.approx(E19, abs=1e-6)
    assert st["correction_ratio_max"] == pytest.approx(E05, abs=1e-6)
    assert st["correction_truncated"] == pytest.approx(1 / 3) and st["correction_masked"] == 0
    assert st["correction_units"] == 3
    assert not c.weight.requires_grad


def test_token_mask_hand_computed():
    # cap 1.5, low 0.2: 1.6487 > 1.5 and 0.1496 < 0.2 leave; weight 1 for the token that stays
    c = rollout_correction("token_mask", OLD, SAMPLER, MASK, cap=1.5, low=0.2)
    assert c.weight.tolist() == [[0.0, 1.0, 0.0, 0.0]] and c.keep.tolist() == [[False, True, False, False]]
    assert _stats(c)["correction_masked"] == pytest.approx(2 / 3) and _stats(c)["correction_truncated"] == 0
    # low = 0 (the default): only ratios above the cap leave
    c = rollout_correction("token_mask", OLD, SAMPLER, MASK, cap=1.5)
    assert c.keep.tolist() == [[False, True, True, False]] and _stats(c)["correction_masked"] == pytest.approx(1 / 3)
    # bounds are inclusive: a ratio of exactly cap (d = ln 2) stays
    at_cap = rollout_correction("token_mask", torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1),
                                torch.ones(1, 1, dtype=torch.bool), cap=2.0)
    assert at_cap.keep.tolist() == [[True]]


def test_sequence_modes_hand_computed():
    old = torch.cat([OLD, torch.tensor([[-0.2, -0.3, 0.0, 0.0]])])
    sampler = torch.cat([SAMPLER, torch.tensor([[-0.9, -0.4, 0.0, 0.0]])])
    mask = torch.cat([MASK, torch.tensor([[True, True, False, False]])])
    # row 0: D = 0.5 + 0 - 1.9 = -1.4 -> e^-1.4 = 0.246597; row 1: D = 0.7 + 0.1 = 0.8 -> e^0.8 = 2.225541
    r0, r1 = math.exp(-1.4), math.exp(0.8)
    c = rollout_correction("seq_tis", old, sampler, mask, cap=2.0)
    assert torch.allclose(c.weight, torch.tensor([[r0, r0, r0, 0.0], [2.0, 2.0, 0.0, 0.0]]), atol=1e-6)
    st = _stats(c)
    assert st["correction_units"] == 2 and st["correction_truncated"] == pytest.approx(0.5)
    assert st["correction_ratio_mean"] == pytest.approx((r0 + r1) / 2, abs=1e-6)
    assert (st["correction_ratio_min"], st["correction_ratio_max"]) == (pytest.approx(r0), pytest.approx(r1))
    m = rollout_correction("seq_mask", old, sampler, mask, cap=2.0)  # row 1 (2.2255 > 2) leaves whole
    assert m.keep.tolist() == [[True, True, True, False], [False, False, False, False]]
    assert m.weight.tolist() == [[1.0, 1.0, 1.0, 0.0], [0.0] * 4]
    m = rollout_correction("seq_mask", old, sampler, mask, cap=2.0, low=0.3)  # and row 0 (0.2466 < 0.3) too
    assert not m.keep.any() and _stats(m)["correction_masked"] == 1.0


def test_labels_outside_the_trainers_support_get_weight_zero():
    # the trainer's truncation removed token 1 (its logprob is the floor): ratio 0, weight 0, it leaves the
    # loss in every mode, and its response's sequence ratio is 0
    old = torch.tensor([[-1.0, TRUNCATED_LOGPROB, -0.5]])
    sampler = torch.tensor([[-1.0, -3.0, -0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    for name in ROLLOUT_CORRECTIONS:
        c = rollout_correction(name, old, sampler, mask, cap=2.0)
        assert float(c.stats["correction_ratio_min"]) == 0.0, name
        if name.startswith("token"):
            assert c.weight.tolist() == [[1.0, 0.0, 1.0]] and c.keep.tolist() == [[True, False, True]], name
            assert float(c.stats["correction_masked"]) == pytest.approx(1 / 3), name
        else:
            assert c.weight.tolist() == [[0.0, 0.0, 0.0]] and not c.keep.any(), name


def test_bad_names_and_bounds():
    with pytest.raises(KeyError, match="known: seq_mask, seq_tis, token_mask, token_tis"):
        rollout_correction("tis", OLD, SAMPLER, MASK)
    with pytest.raises(ValueError, match="cap must be >= 1"):
        rollout_correction("token_tis", OLD, SAMPLER, MASK, cap=0.5)
    with pytest.raises(ValueError, match="low must be in"):
        rollout_correction("token_mask", OLD, SAMPLER, MASK, low=1.5)


# ------------------------------------------------- exact enumeration through the real loss path


class TableModel(torch.nn.Module):
    """A causal 'LM' whose next-token logits are a parameter table indexed by the previous token:
    logits[b, t] = table[input_ids[b, t]]. Input id V (one past the output vocabulary) is the prompt."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone().float())

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **kw):
        return SimpleNamespace(logits=self.table[input_ids])


def _algo(mode: str, cap: float = 2.0, low: float = 0.0) -> AlgoConfig:
    # the default loss (grpo_clip); seq_mean_token_sum with S = 1 below makes the loss a plain sum
    return AlgoConfig(loss="grpo_clip", aggregation="seq_mean_token_sum", shared_prefix=False,
                      rollout_correction=mode, rollout_correction_cap=cap, rollout_correction_low=low)


def _enumerated_grad(table, responses, sampler_lps, weight_adv, algo, truncation=None):
    """Gradient of sum_y [per-token loss of response y], each row's advantage being q(y) * A(y) (the
    enumeration's weight), on-policy (old = logp.detach()); one micro-batch, S = N = 1."""
    V = table.shape[1]
    model = TableModel(table)
    batch = build_training_batch([[V]] * len(responses), responses, 0, sampler_logprobs=sampler_lps)
    loss, stats = micro_batch_loss(model, Minibatch(batch, weight_adv), LossNormalizers(1.0, 1.0),
                                   LossParts.from_algo(algo), ForwardSpec.of(algo, 0, truncation=truncation))
    loss.backward()
    return model.table.grad.double(), stats


# pi = [0.5, 0.2, 0.3] (trainer), q = [0.7, 0.2, 0.1] (sampler), A = [1, -1, 2]; ratios pi/q = [5/7, 1, 3]
PI, Q, A = torch.tensor([0.5, 0.2, 0.3]), torch.tensor([0.7, 0.2, 0.1]), torch.tensor([1.0, -1.0, 2.0])


def _one_token(mode, cap):
    table = torch.zeros(4, 3)
    table[3] = PI.log()
    g, stats = _enumerated_grad(table, [[0], [1], [2]], [[float(math.log(q))] for q in Q.tolist()], Q * A,
                                _algo(mode, cap))
    return g[3], stats  # the prompt row of the table: the only logits used


def test_token_tis_enumeration_equals_the_sampler_free_gradient():
    # E_pi[A grad log pi] with grad_x log pi(y) = e_y - pi: pi*A - pi (pi.A), pi.A = 0.5 - 0.2 + 0.6 = 0.9
    # = [0.5, -0.2, 0.6] - [0.45, 0.18, 0.27] = [0.05, -0.38, 0.33]; the loss is its negative
    g, stats = _one_token("token_tis", cap=10.0)  # cap above every ratio (max 3): plain pi/q
    assert torch.allclose(g, torch.tensor([-0.05, 0.38, -0.33], dtype=torch.float64), atol=1e-6)
    assert float(stats["correction_truncated"]) == 0
    assert float(stats["correction_ratio_max"]) == pytest.approx(3.0, abs=1e-5)
    # without the correction: E_q[A grad log pi] = q*A - pi (q.A), q.A = 0.7 - 0.2 + 0.2 = 0.7
    # = [0.7, -0.2, 0.2] - [0.35, 0.14, 0.21] = [0.35, -0.34, -0.01]
    g_none, stats_none = _one_token("none", cap=10.0)
    assert torch.allclose(g_none, torch.tensor([-0.35, 0.34, 0.01], dtype=torch.float64), atol=1e-6)
    assert "correction_ratio_mean" not in stats_none


def test_token_tis_small_cap_differs_by_the_clipped_amount():
    # cap 2 clips token 2's ratio 3 -> 2: the gradient changes by q_2 (2 - 3) A_2 (e_2 - pi)
    # = 0.1 * (-1) * 2 * ([0, 0, 1] - [0.5, 0.2, 0.3]) = [0.1, 0.04, -0.14] -> [0.15, -0.34, 0.19]
    g, stats = _one_token("token_tis", cap=2.0)
    assert torch.allclose(g, torch.tensor([-0.15, 0.34, -0.19], dtype=torch.float64), atol=1e-6)
    assert float(stats["correction_truncated"]) == pytest.approx(1 / 3)
    # token_mask at cap 2 drops token 2 instead: [0.05, -0.38, 0.33] - q_2 * 3 * A_2 (e_2 - pi) ... with
    # weight 1 for the rest: sum_{y=0,1} q A (e_y - pi) = [0.7, -0.2, 0] - pi (0.7 - 0.2) = [0.45, -0.3, -0.15]
    g, stats = _one_token("token_mask", cap=2.0)
    assert torch.allclose(g, torch.tensor([-0.45, 0.3, 0.15], dtype=torch.float64), atol=1e-6)
    assert float(stats["correction_masked"]) == pytest.approx(1 / 3)


def test_masked_tokens_leave_every_term_of_the_loss():
    # token_mask at cap 2 with an entropy bonus c = 0.1: the masked token 2 drops its entropy term too.
    # H(pi) = 1.02965; dH/dx_j = -pi_j (ln pi_j + H) = [-0.16825, 0.115958, 0.052296]; per kept token the
    # loss has -c H, so the two kept rows add -0.2 dH/dx to [-0.45, 0.3, 0.15] (the test above)
    table = torch.zeros(4, 3)
    table[3] = PI.log()
    algo = dataclasses.replace(_algo("token_mask", cap=2.0), entropy_coef=0.1)
    g, _ = _enumerated_grad(table, [[0], [1], [2]], [[float(math.log(q))] for q in Q.tolist()], Q * A, algo)
    assert torch.allclose(g[3], torch.tensor([-0.41635, 0.276808, 0.139541], dtype=torch.float64), atol=1e-5)


def _two_token_setup():
    g = torch.Generator().manual_seed(0)
    trainer = torch.randn(4, 3, generator=g)  # rows 0..2: after token y1; row 3: after the prompt
    sampler = trainer + 0.6 * torch.randn(4, 3, generator=g)  # a real mismatch
    seqs = [[a, b] for a in range(3) for b in range(3)]
    qlp = torch.log_softmax(sampler.double(), -1)
    sampler_lps = [[float(qlp[3, a]), float(qlp[a, b])] for a, b in seqs]
    q = torch.tensor([math.exp(sum(lp)) for lp in sampler_lps], dtype=torch.float64)
    adv = torch.randn(9, generator=g, dtype=torch.float64)
    return trainer, seqs, sampler_lps, q, adv


def _seq_reference(trainer, seqs, q, adv, cap):
    """Independent float64: -sum_y q(y) min(pi(y)/q(y), cap) A(y) grad log pi(y), log pi by log_softmax."""
    x = trainer.double().requires_grad_()
    lp = torch.log_softmax(x, -1)
    logpi = torch.stack([lp[3, a] + lp[a, b] for a, b in seqs])
    w = torch.minimum(logpi.detach().exp() / q, torch.tensor(cap, dtype=torch.float64))
    (-(q * w * adv * logpi).sum()).backward()
    return x.grad, float((logpi.detach().exp() / q).max())


def test_seq_tis_enumeration_on_length_two_responses():
    trainer, seqs, sampler_lps, q, adv = _two_token_setup()
    assert float(q.sum()) == pytest.approx(1.0)
    # large cap: -E_pi[A grad log pi(y)] exactly
    ref, max_ratio = _seq_reference(trainer, seqs, q, adv, cap=1e9)
    got, stats = _enumerated_grad(trainer, seqs, sampler_lps, (q * adv).float(), _algo("seq_tis", cap=1e3))
    assert max_ratio < 1e3 and float(stats["correction_truncated"]) == 0
    assert torch.allclose(got, ref, atol=1e-5) and float(ref.abs().max()) > 0.05
    # small cap: the clipped amount, and no longer the sampler-free gradient
    capped, max_ratio = _seq_reference(trainer, seqs, q, adv, cap=1.2)
    assert max_ratio > 1.2
    got_capped, stats = _enumerated_grad(trainer, seqs, sampler_lps, (q * adv).float(), _algo("seq_tis", cap=1.2))
    assert torch.allclose(got_capped, capped, atol=1e-5) and not torch.allclose(got_capped, ref, atol=1e-3)
    assert 0 < float(stats["correction_truncated"]) < 1
    # the per-token weight is not the sequence's: token_tis does not give the sampler-free gradient here
    got_tok, _ = _enumerated_grad(trainer, seqs, sampler_lps, (q * adv).float(), _algo("token_tis", cap=1e3))
    assert not torch.allclose(got_tok, ref, atol=1e-3)


# -------------------------------------------------------------------------------- top-p / top-k

# trainer pi = [0.4, 0.25, 0.15, 0.12, 0.08], sampler q = [0.38, 0.27, 0.16, 0.11, 0.08] (T = 1).
# top_p = 0.7: mass before each sorted token pi: 0, 0.4, 0.65, 0.8 -> K = {0, 1, 2} (q: 0, 0.38, 0.65, 0.81:
# the same K); kept mass M = 0.8; pi_K = [0.5, 0.3125, 0.1875]; q_K = [0.38, 0.27, 0.16] / 0.81.
# top_k = 2: K = {0, 1}, M = 0.65, pi_K = [0.4, 0.25] / 0.65. top_k = 4 then top_p = 0.75: renormalized over
# the top 4 (mass 0.92), before = 0, 0.435, 0.707, 0.870 (q: 0, 0.413, 0.707, 0.880) -> K = {0, 1, 2}, M = 0.8.
PI5 = torch.tensor([0.4, 0.25, 0.15, 0.12, 0.08])
Q5 = torch.tensor([0.38, 0.27, 0.16, 0.11, 0.08])
A5 = torch.tensor([1.0, -0.5, 2.0, 0.3, -1.0])


@pytest.mark.parametrize(("top_k", "top_p", "kept", "mass"), [(0, 0.7, 3, 0.8), (2, 1.0, 2, 0.65), (4, 0.75, 3, 0.8)])
def test_truncated_proposal_is_corrected_exactly_against_pi_K(top_k, top_p, kept, mass):
    # the sampler's proposal: its truncated distribution, by the HF sampler's own rule
    q_lp = process_logits(Q5.log().unsqueeze(0), 1.0, top_k, top_p)[0]  # (5,), -inf outside K
    support = [y for y in range(5) if q_lp[y] > float("-inf")]
    assert len(support) == kept
    q = q_lp[support].double().exp()
    table = torch.zeros(6, 5)
    table[5] = PI5.log()
    tr = Truncation(top_k, top_p)
    pi = PI5.double()
    pi_K = torch.zeros(5, dtype=torch.float64)
    pi_K[:kept] = pi[:kept] / mass
    # E_{pi_K}[A grad log pi_K], grad_x log pi_K(y) = e_y - pi_K on K: pi_K*A - pi_K (pi_K.A); minus for the loss
    a = A5.double()
    want = -(pi_K * a - pi_K * (pi_K * a).sum())
    if (top_k, top_p) == (0, 0.7):  # written out: pi_K.A = 0.5 - 0.15625 + 0.375 = 0.71875
        assert torch.allclose(want, -torch.tensor([0.140625, -0.380859375, 0.240234375, 0, 0], dtype=torch.float64))
    got, stats = _enumerated_grad(table, [[y] for y in support], [[float(q_lp[y])] for y in support],
                                  (q * a[support]).float(), _algo("token_tis", cap=10.0), truncation=tr)
    assert torch.allclose(got[5], want, atol=1e-6)
    assert float(stats["correction_masked"]) == 0  # trainer and sampler keep the same set

    # the peers' bias: the same ratio against the trainer's FULL softmax is off by log(kept mass) per token
    trunc_lp, _ = _score(table, support, tr)
    full_lp, _ = _score(table, support, None)
    assert torch.allclose(full_lp - trunc_lp, torch.full((kept,), math.log(mass)), atol=1e-6)
    # log 0.8 = -0.22314, log 0.65 = -0.43078
    assert float((full_lp - trunc_lp)[0]) == pytest.approx({0.8: -0.22314, 0.65: -0.43078}[mass], abs=1e-5)
    # ... so its weights are M pi_K/q_K and its gradient is not E_{pi_K}[A grad log pi_K]
    got_full, stats_full = _enumerated_grad(table, [[y] for y in support], [[float(q_lp[y])] for y in support],
                                            (q * a[support]).float(), _algo("token_tis", cap=10.0))
    assert float(stats_full["correction_ratio_mean"]) == pytest.approx(mass * float(stats["correction_ratio_mean"]),
                                                                      rel=1e-5)
    assert not torch.allclose(got_full[5], want, atol=1e-3)


def _score(table, support, truncation):
    from rlvr.models import score_tokens

    V = table.shape[1]
    batch = build_training_batch([[V]] * len(support), [[y] for y in support], 0)
    with torch.no_grad():
        out = score_tokens(TableModel(table), batch.input_ids, batch.labels, batch.attention_mask,
                           truncation=truncation)
    return out.logprobs[:, 0], out


def test_a_label_the_trainer_removed_gets_the_floor_and_leaves_the_loss():
    # the sampler kept token 2 (its numbers differ), the trainer's top_p = 0.6 removes it: floor logprob, no
    # gradient, weight 0, out of the loss (its advantage would otherwise push); the other tokens as usual
    table = torch.zeros(4, 3)
    table[3] = torch.tensor([0.5, 0.3, 0.2]).log()  # K = {0, 1} at top_p = 0.6
    tr = Truncation(top_p=0.6)
    lps = [[math.log(0.6)], [math.log(0.3)], [math.log(0.1)]]
    adv = torch.tensor([1.0, -1.0, 5.0])
    got, stats = _enumerated_grad(table, [[0], [1], [2]], lps, adv, _algo("token_tis", cap=10.0), truncation=tr)
    assert float(stats["correction_masked"]) == pytest.approx(1 / 3)
    assert float(stats["correction_ratio_min"]) == 0.0
    # rows 0, 1 only: -(w0 A0 (e0 - pK) + w1 A1 (e1 - pK)), pK = [0.625, 0.375, 0], w = pK/q = [1.041667, 1.25]
    pk = torch.tensor([0.625, 0.375, 0.0], dtype=torch.float64)
    w0, w1 = 0.625 / 0.6, 0.375 / 0.3
    want = -(w0 * 1.0 * (torch.tensor([1.0, 0, 0], dtype=torch.float64) - pk)
             + w1 * -1.0 * (torch.tensor([0, 1.0, 0], dtype=torch.float64) - pk))
    assert torch.allclose(got[3], want, atol=1e-6)
    # with the correction off the removed token still leaves the loss (it has no probability under pi_K)
    got_none, _ = _enumerated_grad(table, [[0], [1], [2]], lps, adv, _algo("none"), truncation=tr)
    want_none = -(1.0 * (torch.tensor([1.0, 0, 0], dtype=torch.float64) - pk)
                  - 1.0 * (torch.tensor([0, 1.0, 0], dtype=torch.float64) - pk))
    assert torch.allclose(got_none[3], want_none, atol=1e-6)


def test_no_sampler_logprobs_means_weight_one_and_a_note_once():
    table = torch.zeros(4, 3)
    table[3] = PI.log()
    V = 3
    batch = build_training_batch([[V]] * 3, [[0], [1], [2]], 0)  # no sampler logprobs
    assert batch.sampler_logprobs is None
    grads = []
    for mode in ("token_tis", "none"):
        model = TableModel(table)
        loss, stats = micro_batch_loss(model, Minibatch(batch, Q * A), LossNormalizers(1.0, 1.0),
                                       LossParts.from_algo(_algo(mode)), ForwardSpec.of(_algo(mode), 0))
        loss.backward()
        grads.append(model.table.grad.clone())
        assert "correction_ratio_mean" not in stats
    assert torch.equal(grads[0], grads[1])
    obj = Objective(_algo("token_tis"), 2, 16, None)
    note = obj.correction_note(batch)
    assert note is not None and "algo.rollout_correction=token_tis" in note and "weight 1" in note
    assert obj.correction_note(batch) is None  # once
    assert Objective(_algo("none"), 2, 16, None).correction_note(batch) is None


def test_masked_tokens_keep_the_normalizer_and_splits_give_the_same_gradient():
    """token_mask with the minibatch's global normalizers: micro-batches of 1 row give the gradient of the
    whole batch (rlvr.algo.aggregation's contract), masked tokens counted in N but contributing 0."""
    g = torch.Generator().manual_seed(2)
    table = torch.randn(6, 5, generator=g)
    responses = [[int(t) for t in torch.randint(0, 5, (n,), generator=g)] for n in (3, 1, 4, 2)]
    sampler = [[float(-1.5 + 0.8 * torch.randn((), generator=g)) for _ in r] for r in responses]
    batch = build_training_batch([[5]] * 4, responses, 0, sampler_logprobs=sampler)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2])
    algo = dataclasses.replace(_algo("token_mask", cap=1.3, low=0.7), aggregation="token_mean")
    parts = LossParts.from_algo(algo)
    out = []
    for micro in (4, 1):
        model = TableModel(table)
        from rlvr.train.pg.objective import StepStats

        st = StepStats()
        accumulate_gradients(model, Minibatch(batch, adv), parts, ForwardSpec.of(algo, micro), norm_length=0, stats=st)
        out.append((model.table.grad.clone(), st))
    (g_all, st_all), (g_split, st_split) = out
    assert torch.allclose(g_all, g_split, atol=1e-6) and float(g_all.abs().max()) > 1e-3
    masked = st_all.means()["correction_masked"]
    assert 0 < masked < 1 and st_split.means()["correction_masked"] == pytest.approx(masked)
    assert st_split.mins["correction_ratio_min"] == pytest.approx(st_all.mins["correction_ratio_min"])
    assert st_split.maxs["correction_ratio_max"] == pytest.approx(st_all.maxs["correction_ratio_max"])


# ---------------------------------------------------------------------------------------- config


def test_auto_resolves_by_backend_and_bad_values_name_the_key():
    import typing

    assert Objective(AlgoConfig(), 2, 16, None, rollout_backend="vllm").correction == "token_tis"
    assert Objective(AlgoConfig(), 2, 16, None, rollout_backend="hf").correction == "none"
    assert Objective(AlgoConfig(), 2, 16, None, rollout_backend="vllm").parts.correction == ("token_tis", 2.0, 0.0)
    assert Objective(AlgoConfig(), 2, 16, None).parts.correction is None
    explicit = Objective(_algo("seq_mask", cap=3.0, low=0.25), 2, 16, None, rollout_backend="vllm")
    assert explicit.correction == "seq_mask" and explicit.parts.correction == ("seq_mask", 3.0, 0.25)
    modes = typing.get_args(typing.get_type_hints(AlgoConfig)["rollout_correction"])
    assert modes == ("auto", "none", *ROLLOUT_CORRECTIONS)  # the Literal the help lists
    with pytest.raises(ConfigError, match="algo.rollout_correction='tis' is unknown"):
        load_config(TrainConfig, None, ["algo.rollout_correction=tis"])
    with pytest.raises(ConfigError, match="algo.rollout_correction_cap=0.5 must be >= 1"):
        load_config(TrainConfig, None, ["algo.rollout_correction_cap=0.5"])
    with pytest.raises(ConfigError, match="algo.rollout_correction_low=2.0 must be in"):
        load_config(TrainConfig, None, ["algo.rollout_correction_low=2.0"])
    with pytest.raises(ConfigError, match="sampling.top_k=-2 must be >= 0"):
        load_config(TrainConfig, None, ["sampling.top_k=-2"])


# ------------------------------------------------------------------------------ through the trainer

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=40", "data.num_eval=4", "data.digits=1", "sampling.n_prompts=2", "sampling.group_size=4",
        "sampling.max_tokens=4", "run.steps=1", "run.progress=false", "run.num_threads=1", "optim.lr=1e-2",
        "data.reward=helpers.dense_reward:letter_share", "run.log_samples_every=0"]


class _Perturbed:
    """The HF generator with its sampler logprobs shifted by a fixed pattern (as a bf16 engine's would
    be): the trainer's logprobs of the same tokens differ by up to 0.8 nats."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, spec, **kw):
        out = self.inner.generate(prompts, spec, **kw)
        for i, ro in enumerate(out):
            if ro.logprobs is not None:  # evaluation asks for none
                ro.logprobs = [lp + 0.8 * math.sin(1.7 * i + 2.3 * k) for k, lp in enumerate(ro.logprobs)]
        return out


def _run(tmp_path, monkeypatch, *extra):
    import rlvr.rollout.builder as builder
    import rlvr.train.pg.loop as pg
    import rlvr.train.session as session

    monkeypatch.setitem(builder.GENERATOR_BACKENDS, "hf", lambda *a, **k: _Perturbed(builder._hf(*a, **k)))
    monkeypatch.setattr(session, "finish_run", lambda path, last: {})  # no plots: most of the run's time
    cfg = load_config(TrainConfig, None, TINY + [f"run.out_dir={tmp_path}", *extra])
    res = pg.train(cfg)
    return [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_trainer_applies_the_correction_and_logs_it(tmp_path, monkeypatch):
    (on,) = _run(tmp_path / "on", monkeypatch, "algo.rollout_correction=token_tis", "algo.rollout_correction_cap=1.5")
    (off,) = _run(tmp_path / "off", monkeypatch, "algo.rollout_correction=none")
    # the same rollouts and rewards (same seeds), so only the weights differ
    assert on["reward/mean"] == off["reward/mean"] and on["rollout/logprob_diff_mean"] == off["rollout/logprob_diff_mean"]
    assert on["rollout/logprob_diff_mean"] > 0.2
    for k in ("rollout/correction_ratio_mean", "rollout/correction_ratio_min", "rollout/correction_ratio_max",
              "rollout/correction_truncated", "rollout/correction_masked"):
        assert k in on and k not in off, k
    assert on["rollout/correction_ratio_min"] < 1 < on["rollout/correction_ratio_max"]
    assert 0 < on["rollout/correction_truncated"] < 1 and on["rollout/correction_masked"] == 0
    assert on["grad_norm"] > 0 and abs(on["grad_norm"] - off["grad_norm"]) > 1e-4 * off["grad_norm"]
    assert on["loss"] != off["loss"]
    # the hf backend's auto is none: the same run as `none`
    (auto,) = _run(tmp_path / "auto", monkeypatch)
    assert auto["grad_norm"] == off["grad_norm"] and "rollout/correction_ratio_mean" not in auto


def test_trainer_scores_the_truncated_distribution_at_top_p(tmp_path, monkeypatch):
    # sampling.top_p / top_k: the sampler draws from pi_K; the trainer scores pi_K too, so the HF backend's
    # sampler and trainer logprobs agree (before: off by log(kept mass) on every token); the correction
    # has only the engine's numerics to weigh
    import rlvr.train.pg.loop as pg
    import rlvr.train.session as session

    monkeypatch.setattr(session, "finish_run", lambda path, last: {})
    # the old logprobs from their own no-grad forward, and a KL to the (start = current) reference: every
    # forward (training, old, reference) must score the same pi_K
    cfg = load_config(TrainConfig, None, TINY + [f"run.out_dir={tmp_path / 'plain'}", "sampling.top_p=0.5",
                                                 "sampling.top_k=12", "algo.reuse_logprobs_on_policy=false",
                                                 "algo.kl_coef=0.05"])
    res = pg.train(cfg)
    (row,) = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["rollout/logprob_diff_max"] < 1e-4  # old (no-grad forward) vs sampler: the same distribution
    assert row["ratio/max"] - row["ratio/min"] < 1e-4  # training forward vs old
    assert row["kl"] < 1e-6  # reference vs training forward
    assert row["entropy"] > 0
