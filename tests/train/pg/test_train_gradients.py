"""Gradients of the policy-gradient trainer on a real tiny model (in-process, no learning).

- on-policy `grpo_clip` with one epoch gives the same parameter gradient as
  `reinforce_with_baseline` (ratio == 1 in value, grad(ratio) == grad(logp));
- taking old logprobs from a separate no-grad forward or as logp.detach() is the same;
- micro-batching does not change the accumulated gradient (global normalizers);
- the trainer's gradient equals an independent implementation of
  -(1/S) sum_i A_i sum_t grad log pi(y_it) written with plain log_softmax.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlvr.algo import compute_advantages
from rlvr.config import load_config
from rlvr.models import build_tiny_model
from rlvr.rollout import HFGenerator, SamplingSpec
from rlvr.rollout.batch import rollouts_to_batch
from rlvr.train.batching import ForwardSpec
from rlvr.train.config import AlgoConfig, TrainConfig
from rlvr.train.pg.objective import LossParts, Minibatch, accumulate_gradients, batch_logprobs
from rlvr.train.pg.recipes import get_recipe


@pytest.fixture(scope="module")
def setup():
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=3)
    gen = HFGenerator(model, tok)
    prompts = ["12+7=", "3+45=", "60+1=", "8+8="]
    rollouts = gen.generate(prompts, SamplingSpec(n=4, temperature=1.0, max_tokens=5, seed=11))
    batch = rollouts_to_batch(rollouts, tok.pad_token_id)
    # Fixed rewards with spread in every group; group_mean advantages A_i = r_i - mean_group(r).
    rewards = torch.tensor([1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0.5, 0, 1, 0, 0, 1], dtype=torch.float32)
    adv = compute_advantages("group_mean", rewards, 4)
    # group 1: mean 1/4 -> [0.75, -0.25, -0.25, -0.25]
    assert torch.allclose(adv[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    model.train()
    return model, batch, adv


def _algo(recipe: str, **over) -> AlgoConfig:
    cfg = load_config(TrainConfig, None, [], base=get_recipe(recipe))
    return dataclasses.replace(cfg.algo, **over)


def _grads(model, batch, adv, algo, micro, old_logp=None):
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, Minibatch(batch, adv, old_logp), LossParts.from_algo(algo), ForwardSpec.of(algo, micro),
                         norm_length=5)
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(g1, g2, atol=1e-6):
    assert g1.keys() == g2.keys() and len(g1) > 3
    for k in g1:
        assert torch.allclose(g1[k], g2[k], atol=atol, rtol=1e-5), k
    assert max(float(g.abs().max()) for g in g1.values()) > 1e-4  # a real, non-zero gradient


@pytest.mark.parametrize("aggregation", ["seq_mean_token_sum", "seq_mean_token_mean", "token_mean"])
def test_on_policy_grpo_clip_equals_reinforce_with_baseline(setup, aggregation):
    model, batch, adv = setup
    base = _algo("reinforce_with_baseline", aggregation=aggregation)
    clip = dataclasses.replace(base, loss="grpo_clip")
    _assert_same(_grads(model, batch, adv, base, 16), _grads(model, batch, adv, clip, 16))


def test_old_logprobs_from_separate_forward_equal_detached_logp(setup):
    model, batch, adv = setup
    algo = _algo("grpo", kl_coef=0.0)
    old = batch_logprobs(model, batch, micro_batch_size=16)
    _assert_same(_grads(model, batch, adv, algo, 16), _grads(model, batch, adv, algo, 16, old_logp=old))


@pytest.mark.parametrize("recipe", ["grpo", "dr_grpo", "dapo"])
def test_micro_batching_does_not_change_the_gradient(setup, recipe):
    model, batch, adv = setup
    algo = _algo(recipe, kl_coef=0.0)
    _assert_same(_grads(model, batch, adv, algo, 16), _grads(model, batch, adv, algo, 3))


def test_gradient_matches_independent_sequence_score_formula(setup):
    model, batch, adv = setup
    algo = _algo("reinforce_with_baseline")  # seq_mean_token_sum: -(1/S) sum_i A_i sum_t logp_it
    ours = _grads(model, batch, adv, algo, 16)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1)  # (S, T)
    seq_logp = (logp * batch.response_mask).sum(-1)  # (S,) log pi(y_i | x_i)
    (-(adv * seq_logp).sum() / adv.shape[0]).backward()
    ref = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    _assert_same(ours, ref, atol=1e-5)


@pytest.mark.parametrize("recipe", ["rloo", "reinforce_with_baseline", "reinforce"])
def test_reinforce_losses_off_policy_are_importance_weighted(setup, recipe):
    """From the second minibatch (or epoch) on, the rollouts come from pi_old != pi_theta: the REINFORCE
    losses then weight each token by ratio = pi_theta / pi_old (verl's and TRL's losses all carry the ratio),
    so the gradient is -(1/S) sum_i A_i sum_t ratio_it grad log pi(y_it); at ratio 1 it is REINFORCE."""
    model, batch, adv = setup
    algo = _algo(recipe, num_minibatches=2)  # seq_mean_token_sum
    now = batch_logprobs(model, batch, micro_batch_size=16)
    g = torch.Generator().manual_seed(5)
    # an old policy that gave the sampled tokens other probabilities: ratios in exp([-0.3, 0.3])
    old = now + 0.6 * (torch.rand(now.shape, generator=g) - 0.5)
    a = adv if recipe != "reinforce" else torch.linspace(0.0, 1.0, adv.shape[0])  # raw rewards for no_baseline
    ours = _grads(model, batch, a, algo, 4, old_logp=old)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1)  # (S, T)
    ratio = torch.exp(logp.detach() - old) * batch.response_mask
    assert float(ratio[batch.response_mask].min()) < 0.8 and float(ratio.max()) > 1.2
    (-(a.unsqueeze(1) * ratio * logp).sum() / a.shape[0]).backward()
    indep = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    _assert_same(ours, indep, atol=1e-5)
