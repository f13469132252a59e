"""The KL penalty under a sampler truncation (sampling.top_p < 1 / top_k > 0): a divergence between the policy
and the reference (or the on-policy distillation teacher) as models, both scored untruncated at the sampling
temperature; the truncation belongs to the importance ratio only (docs/algorithms.md, "KL under top-p /
top-k"). Hand-computed where the two nuclei differ:

    policy pi = [0.6, 0.3, 0.1], reference rho = [0.2, 0.3, 0.5], top_p = 0.8
    policy nucleus:    before = 0, 0.6, 0.9        -> K_pi  = {0, 1}, pi_K = [2/3, 1/3, 0]
    reference nucleus: before (sorted 2, 1, 0) = 0, 0.5, 0.8 -> K_rho = {1, 2}: token 0 is outside it

The policy samples token 0 (outside the reference's nucleus) and token 1 (inside both). With the models'
own probabilities d = log pi - log rho is ln 3 on token 0 and 0 on token 1:

    k1 = ln 3 = 1.0986123, k2 = (ln 3)^2 / 2 = 0.6034745, k3 = 1/3 + ln 3 - 1 = 0.4319456   (token 0)
    k1 = k2 = k3 = 0                                                                     (token 1)

Scored on the truncated supports (the bug) token 0's reference logprob was the floor -40 (d = 39.59) and
token 1's d was ln((1/3) / (3/8)) = -0.1178 although both models give it 0.3.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from rlvr.algo import LossNormalizers, Truncation, token_scores
from rlvr.models import build_training_batch
from rlvr.train.batching import BatchPlan, ForwardSpec
from rlvr.train.config import AlgoConfig
from rlvr.train.pg.loop import Learner, learn
from rlvr.train.pg.objective import LossParts, Minibatch, Objective, accumulate_gradients, micro_batch_loss
from rlvr.train.pg.reference import ReferencePolicy

PI = torch.tensor([0.6, 0.3, 0.1])
RHO = torch.tensor([0.2, 0.3, 0.5])
TOP_P = Truncation(top_p=0.8)
LN3 = math.log(3.0)
K_TOKEN0 = {"k1": LN3, "k2": 0.5 * LN3 ** 2, "k3": 1 / 3 + LN3 - 1}
V = 3  # input id V is the prompt


class TableModel(torch.nn.Module):
    """A causal 'LM' whose next-token logits are a parameter table indexed by the previous token:
    logits[b, t] = table[input_ids[b, t]]; input id V (one past the vocabulary) is the prompt."""

    def __init__(self, probs: torch.Tensor):
        super().__init__()
        table = torch.zeros(V + 1, V)
        table[V] = probs.log()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **kw):
        return SimpleNamespace(logits=self.table[input_ids])


def _batch():
    return build_training_batch([[V], [V]], [[0], [1]], 0)  # one-token responses: token 0, token 1


def _algo(**kw) -> AlgoConfig:
    base = dict(loss="grpo_clip", aggregation="seq_mean_token_sum", shared_prefix=False, kl_coef=0.1,
                rollout_correction="none")
    return AlgoConfig(**(base | kw))


def test_token_scores_give_both_logprobs_under_truncation():
    logits = PI.log().expand(2, V).clone()
    out = token_scores(logits, torch.tensor([0, 2]), truncation=TOP_P)
    assert out.logp.tolist() == pytest.approx([math.log(2 / 3), -40.0], abs=1e-6)  # pi_K; token 2 is outside K
    assert out.full_logp.tolist() == pytest.approx([math.log(0.6), math.log(0.1)], abs=1e-6)
    assert token_scores(logits, torch.tensor([0, 2])).full_logp is None  # untruncated: logp is the model's


def test_full_logprob_gradient_is_the_untruncated_softmax_one():
    # d log pi(y) / dx = e_y - pi over the whole vocabulary (token 2 included), while the truncated logprob's
    # gradient is e_y - pi_K on K and 0 elsewhere
    x = PI.log().clone().requires_grad_()
    out = token_scores(x.unsqueeze(0), torch.tensor([0]), truncation=TOP_P)
    (g_full,) = torch.autograd.grad(out.full_logp.sum(), x, retain_graph=True)
    assert g_full.tolist() == pytest.approx([0.4, -0.3, -0.1], abs=1e-6)
    (g_trunc,) = torch.autograd.grad(out.logp.sum(), x)
    assert g_trunc.tolist() == pytest.approx([1 / 3, -1 / 3, 0.0], abs=1e-6)
    # both at once with weights: the sum of the two
    x2 = PI.log().clone().requires_grad_()
    out2 = token_scores(x2.unsqueeze(0), torch.tensor([0]), truncation=TOP_P, with_entropy=True)
    (2.0 * out2.logp + 3.0 * out2.full_logp).sum().backward()
    assert x2.grad.tolist() == pytest.approx((2 * g_trunc + 3 * g_full).tolist(), abs=1e-6)


@pytest.mark.parametrize("teacher", [False, True])
def test_reference_is_scored_untruncated(teacher):
    # the reference's (or teacher's) logprobs of the sampled tokens are its model probabilities: ln 0.2 for token
    # 0 although 0 is outside its nucleus (was the floor -40), ln 0.3 for token 1 (was ln(0.3 / 0.8))
    policy, ref_model = TableModel(PI), TableModel(RHO)
    ref = ReferencePolicy(policy, enabled=True, teacher=ref_model if teacher else None)
    if not teacher:
        ref.model.load_state_dict(ref_model.state_dict())
    fwd = ForwardSpec(micro_batch=2, truncation=TOP_P)
    lp = ref.logprobs(_batch(), fwd)
    assert lp[:, 0].tolist() == pytest.approx([math.log(0.2), math.log(0.3)], abs=1e-6)


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_kl_in_the_loss_hand_numbers(estimator):
    # advantage 0: the gradient is the KL term's alone, coef * k'(d) (e_y - pi) on token 0 (token 1: d = 0);
    # k2' = d = ln 3, k3' = 1 - exp(-d) = 2/3; e_0 - pi = [0.4, -0.3, -0.1]
    algo = _algo(kl_estimator=estimator)
    policy = TableModel(PI)
    batch = _batch()
    ref_logp = ReferencePolicy(policy, enabled=True, teacher=TableModel(RHO)).logprobs(
        batch, ForwardSpec(micro_batch=2, truncation=TOP_P))
    fwd = ForwardSpec.of(algo, 2, truncation=TOP_P)
    mb = Minibatch(batch, torch.zeros(2), ref_logp=ref_logp)
    loss, stats = micro_batch_loss(policy, mb, LossNormalizers(1.0, 1.0), LossParts.from_algo(algo), fwd)
    loss.backward()
    assert float(stats["kl"]) == pytest.approx(K_TOKEN0[estimator] / 2, abs=1e-5)  # mean over the two tokens
    slope = {"k2": LN3, "k3": 2 / 3}[estimator]
    expected = [0.1 * slope * v for v in (0.4, -0.3, -0.1)]
    assert policy.table.grad[V].tolist() == pytest.approx(expected, abs=1e-6)


def _learner(algo, teacher=True):
    policy = TableModel(PI)
    plan = BatchPlan(rollout_batch=2, train_batch=2, micro_batch=2, epochs=1, optimizer_steps_per_rollout_batch=1,
                     accumulation_steps=1, on_policy=True)
    objective = Objective(algo, group_size=2, max_tokens=1, plan=plan, truncation=TOP_P)
    ref = ReferencePolicy(policy, enabled=True, teacher=TableModel(RHO) if teacher else None)
    if not teacher:
        ref.model.load_state_dict(TableModel(RHO).state_dict())
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    grads = []

    def step_fn(model, optimizer, scheduler, grad_clip):  # record the gradient instead of stepping
        grads.append(model.table.grad[V].clone())
        optimizer.zero_grad()
        return 0.0

    learner = Learner(policy, opt, sched, objective, ref, None, ForwardSpec.of(algo, 2, truncation=TOP_P),
                      grad_fn=accumulate_gradients, grad_clip=0.0, seed=0, step_fn=step_fn)
    return learner, grads


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("teacher", [False, True])
def test_kl_in_the_reward_hand_numbers(estimator, teacher):
    # algo.kl_in=reward (on-policy distillation's setting with the teacher, advantage zero): token 0's advantage
    # is -coef * k(ln 3), token 1's -coef * k(0) = 0; the policy term's gradient (grpo_clip, on-policy, ratio 1)
    # is -A (e_y - pi_K) with pi_K = [2/3, 1/3, 0], over the 2 sequences (seq_mean_token_sum):
    # coef * k(ln 3) * [1/3, -1/3, 0] / 2
    algo = _algo(kl_in="reward", kl_estimator=estimator, advantage="zero")
    learner, grads = _learner(algo, teacher=teacher)
    learn(learner, _batch(), torch.zeros(2), torch.arange(2), step=1)
    k = K_TOKEN0[estimator]
    assert grads[0].tolist() == pytest.approx([0.1 * k / 6, -0.1 * k / 6, 0.0], abs=1e-6)


def test_kl_in_the_reward_with_a_recorded_old_policy():
    # the behaviour policy's function (sampling ahead, partial rollouts) is asked for the untruncated forward too
    algo = _algo(kl_in="reward", kl_estimator="k1", advantage="zero")
    learner, grads = _learner(algo)
    asked = []

    def old_logp_fn(model, batch, fwd):
        asked.append(fwd.truncation)
        from rlvr.train.pg.objective import forward_logprobs
        return forward_logprobs(model, batch, fwd)

    learn(learner, _batch(), torch.zeros(2), torch.arange(2), step=1, old_logp_fn=old_logp_fn)
    assert asked == [TOP_P, None]
    assert grads[0].tolist() == pytest.approx([0.1 * LN3 / 6, -0.1 * LN3 / 6, 0.0], abs=1e-6)


def test_untruncated_run_is_unchanged():
    # without a truncation every logprob is the model's: the KL in the loss is the same formula as before
    algo = _algo(kl_estimator="k3")
    policy = TableModel(PI)
    batch = _batch()
    ref_logp = ReferencePolicy(policy, enabled=True, teacher=TableModel(RHO)).logprobs(batch, ForwardSpec(2))
    mb = Minibatch(batch, torch.zeros(2), ref_logp=ref_logp)
    _, stats = micro_batch_loss(policy, mb, LossNormalizers(1.0, 1.0), LossParts.from_algo(algo),
                                dataclasses.replace(ForwardSpec.of(algo, 2), truncation=None))
    assert float(stats["kl"]) == pytest.approx(K_TOKEN0["k3"] / 2, abs=1e-5)


# ------------------------------------------------------- every forward path gives the untruncated logprobs


def _tiny_batch(seed=0):
    import random

    rng = random.Random(seed)
    P, R = [], []
    for _ in range(3):
        p = [rng.randrange(4, 90) for _ in range(rng.randrange(2, 6))]
        for _ in range(3):  # groups of three rows share a prompt (the shared-prefix path groups them)
            P.append(p)
            R.append([rng.randrange(4, 90) for _ in range(rng.randint(1, 9))])
    return build_training_batch(P, R, 0)


@pytest.mark.parametrize("path", ["plain", "shared_prefix", "packed"])
def test_every_forward_path_scores_the_untruncated_logprobs(path):
    # independent: log_softmax(logits / T) of a plain forward in float64, gathered at the labels; the truncated
    # logprobs of the same call stay those of pi_K (<= the floor outside K, >= the full ones inside K)
    from rlvr.models import score_tokens
    from rlvr.models.packed import PackPlan, score_packed
    from rlvr.models.prefix import prefix_groups, score_shared_prefix
    from rlvr.models.tiny import build_tiny_model

    model = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=0)[0].double()
    batch, T, tr = _tiny_batch(), 0.7, Truncation(top_k=20, top_p=0.6)
    m = batch.response_mask
    am = batch.attention_mask
    pos = (am.long().cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=batch.input_ids, attention_mask=am, position_ids=pos).logits.double()
    lab = batch.labels.clamp_min(0)
    want = torch.log_softmax(logits / T, -1).gather(-1, lab.unsqueeze(-1)).squeeze(-1)
    if path == "plain":
        out = score_tokens(model, batch.input_ids, batch.labels, am, temperature=T, truncation=tr)
    elif path == "shared_prefix":
        groups = prefix_groups(batch.input_ids, m, am)
        assert groups is not None and groups.n_groups == 3
        out = score_shared_prefix(model, batch.input_ids, batch.labels, am, groups, temperature=T, truncation=tr,
                                  use_cascade=False)
    else:
        plan = PackPlan.build(am, m, "cpu", input_ids=batch.input_ids, share=False)
        out = score_packed(model, batch.input_ids, batch.labels, plan, temperature=T, truncation=tr)
    full = out.full_logprobs
    assert full is not None and torch.allclose(full[m], want[m].to(full.dtype), atol=1e-5)
    inside = out.logprobs[m] > -40.0
    assert bool((~inside).any()) and bool(inside.any())  # the batch has labels on both sides of K
    assert bool((out.logprobs[m][inside] >= full[m][inside] - 1e-6).all())  # renormalized over K: larger


def test_ratio_statistics_leave_out_the_tokens_out_of_the_loss():
    # token 2 is outside the current policy's nucleus (floor logprob) but its old logprob was ln 0.1: its ratio
    # is ~0 and the token leaves the loss; ratio/min and ratio/mean are over the tokens that stay (token 0: 1)
    algo = _algo(kl_coef=0.0)
    policy = TableModel(PI)
    batch = build_training_batch([[V], [V]], [[0], [2]], 0)
    old = torch.tensor([[math.log(2 / 3)], [math.log(0.1)]])
    mb = Minibatch(batch, torch.tensor([1.0, -1.0]), old_logp=old)
    _, stats = micro_batch_loss(policy, mb, LossNormalizers(1.0, 1.0), LossParts.from_algo(algo),
                                ForwardSpec.of(algo, 2, truncation=TOP_P))
    assert float(stats["ratio_min"]) == pytest.approx(1.0, abs=1e-6)
    assert float(stats["ratio_mean"]) == pytest.approx(1.0, abs=1e-6)
    assert float(stats["ratio_max"]) == pytest.approx(1.0, abs=1e-6)
    assert float(stats["clip_frac_low"]) == 0.0  # the dropped token's ratio ~0 with A < 0 was a "clipped" token


@pytest.mark.cli
def test_rlvr_train_under_top_p_logs_a_kl_between_the_models(tmp_path):
    # the command: GRPO at top_p 0.5 with a large lr; scored on the two truncated supports the logged KL
    # was 8-11 nats per token from step 3 on (a token outside the reference's nucleus at the floor -40); between
    # the models it stays small (measured: at most 0.05)
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off"}
    res = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", "--recipe", "grpo", "sampling.top_p=0.5", "optim.lr=3e-2",
         "algo.kl_coef=0.04", "run.steps=6", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
         "model.intermediate_size=64", "sampling.n_prompts=4", "run.eval_every=0", f"run.out_dir={tmp_path / 'r'}"],
        capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    kl = [json.loads(x)["kl"] for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(kl) == 6 and max(kl) < 1.0, kl
