"""algo.kl_in=reward (KL to the reference as per-token reward shaping, REINFORCE++ style) and
algo.whiten_advantages: hand-computed token advantages, validation, and the real loop."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from rlvr.algo import masked_mean, masked_var
from rlvr.config import ConfigError, load_config
from rlvr.train.config import AlgoConfig, TrainConfig
from rlvr.train.pg import objective
from rlvr.train.pg.loop import train, validate_train_config
from rlvr.train.pg.recipes import get_recipe
from rlvr.train.pg.targets import kl_reward_to_go, token_advantages

# Two responses, T = 4. Position 0 is a prompt token (mask 0); row 1 has 2 response tokens + 1 pad.
MASK = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
KL = torch.tensor([[9.0, 0.1, 0.2, 0.4], [7.0, 1.0, 2.0, 5.0]])  # entries off the mask must not count
ADV = torch.tensor([1.0, -1.0])


def test_kl_reward_to_go_by_hand():
    # coef 0.5 -> token rewards row0 = [., -0.05, -0.1, -0.2], row1 = [., -0.5, -1.0, .]
    # reward-to-go row0: t1 = -0.05-0.1-0.2 = -0.35, t2 = -0.1-0.2 = -0.3, t3 = -0.2
    #              row1: t1 = -0.5-1.0 = -1.5, t2 = -1.0; prompt and pad positions 0
    rtg = kl_reward_to_go(KL, 0.5, MASK)
    want = torch.tensor([[0.0, -0.35, -0.3, -0.2], [0.0, -1.5, -1.0, 0.0]])
    assert torch.allclose(rtg, want, atol=1e-6)


def _algo(**kw) -> AlgoConfig:
    return AlgoConfig(kl_coef=0.5, kl_in="reward", **kw)


def test_token_advantages_k1_by_hand():
    # k1 = old - ref, so ref = old - KL makes the estimator return KL exactly (old logprobs -1)
    old = torch.full((2, 4), -1.0)
    ref = old - KL
    a = token_advantages(ADV, MASK, _algo(kl_estimator="k1"), old, ref)
    # outcome advantage + KL reward-to-go: row0 1 + [-0.35, -0.3, -0.2] = [0.65, 0.7, 0.8];
    # row1 -1 + [-1.5, -1.0] = [-2.5, -2.0]
    want = torch.tensor([[0.0, 0.65, 0.7, 0.8], [0.0, -2.5, -2.0, 0.0]])
    assert a.shape == (2, 4)
    assert torch.allclose(a, want, atol=1e-6)


def test_token_advantages_k3_uses_old_vs_ref():
    # d = old - ref = ln 2 on row 0's last token only: k3 = exp(-ln 2) + ln 2 - 1 = 0.5 + 0.693147 - 1
    # = 0.193147; coef 0.5 -> penalty -0.0965736 on that token, so tokens 1..3 all get it in their
    # reward-to-go (it is the last token); row 1 has d = 0 -> k3 = 0 -> advantage unchanged
    old = torch.full((2, 4), -1.0)
    ref = old.clone()
    ref[0, 3] = -1.0 - math.log(2.0)
    a = token_advantages(ADV, MASK, _algo(kl_estimator="k3"), old, ref)
    pen = 0.5 * (0.5 + math.log(2.0) - 1.0)
    assert torch.allclose(a[0, 1:], torch.full((3,), 1.0 - pen), atol=1e-6)
    assert torch.allclose(a[1], torch.tensor([0.0, -1.0, -1.0, 0.0]), atol=1e-6)


def test_whitened_token_advantages_by_hand():
    old = torch.full((2, 4), -1.0)
    a = token_advantages(ADV, MASK, _algo(kl_estimator="k1", whiten_advantages=True), old, old - KL)
    # valid values [0.65, 0.7, 0.8, -2.5, -2.0]: mean = -2.35 / 5 = -0.47;
    # deviations 1.12, 1.17, 1.27, -2.03, -1.53; squares sum 1.2544+1.3689+1.6129+4.1209+2.3409
    # = 10.698; population var 2.1396
    sd = math.sqrt(2.1396 + 1e-8)
    want = torch.tensor([[0.0, 1.12 / sd, 1.17 / sd, 1.27 / sd], [0.0, -2.03 / sd, -1.53 / sd, 0.0]])
    assert torch.allclose(a, want, atol=1e-5)
    assert abs(float(masked_mean(a, MASK))) < 1e-6
    assert abs(float(masked_var(a, MASK)) - 1.0) < 1e-5


def test_whitening_per_response_advantages_weights_tokens():
    # kl_in=loss: (B,) [1, -1] broadcast over 3 and 2 tokens -> [1, 1, 1, -1, -1]: mean 0.2,
    # var (3 * 0.8^2 + 2 * 1.2^2) / 5 = (1.92 + 2.88) / 5 = 0.96 -> 0.8 / 0.9798 and -1.2 / 0.9798
    a = token_advantages(ADV, MASK, AlgoConfig(whiten_advantages=True))
    sd = math.sqrt(0.96 + 1e-8)
    want = torch.tensor([[0.0, 0.8 / sd, 0.8 / sd, 0.8 / sd], [0.0, -1.2 / sd, -1.2 / sd, 0.0]])
    assert torch.allclose(a, want, atol=1e-6)


def test_defaults_leave_advantages_alone():
    assert token_advantages(ADV, MASK, AlgoConfig()) is ADV  # same (B,) tensor, no copy


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        (dict(kl_in="reward", kl_coef=0.0), "algo.kl_in='reward' with algo.kl_coef=0"),
        (dict(loss="kimi", advantage="group_mean", whiten_advantages=True), "algo.loss='kimi'"),
        (dict(loss="kimi", advantage="group_mean", kl_in="reward", kl_coef=0.1), "algo.loss='kimi'"),
        (dict(kl_in="both"), "algo.kl_in='both'"),
        (dict(kl_coef=0.1, kl_estimator="k1"), "algo.kl_estimator='k1' with algo.kl_in=loss regularises nothing"),
    ],
)
def test_validation(over, needle):
    cfg = TrainConfig()
    cfg.algo = dataclasses.replace(cfg.algo, **over)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        validate_train_config(cfg)


def test_unknown_kl_in_is_a_config_error():
    with pytest.raises(ConfigError, match="algo.kl_in"):
        load_config(TrainConfig, None, ["algo.kl_in=advantage"])


@pytest.mark.parametrize("extra", [[], ["algo.kl_in=loss"]])
def test_k1_in_the_loss_is_refused(extra):
    # E_{y~pi}[grad (logp - ref)] = sum_y grad pi(y) = 0: k1 in the loss regularises nothing
    with pytest.raises(ConfigError, match=r"algo.kl_estimator='k1' with algo.kl_in=loss.*k2.*algo.kl_in=reward"):
        load_config(TrainConfig, None, ["algo.kl_coef=0.1", "algo.kl_estimator=k1", *extra])
    # what the message suggests loads
    for ok in (["algo.kl_estimator=k2"], ["algo.kl_in=reward"]):
        load_config(TrainConfig, None, ["algo.kl_coef=0.1", "algo.kl_estimator=k1", *ok])
    # k1 with no KL term at all: the estimator is unused, refused as inert naming both keys (issue 36)
    with pytest.raises(ConfigError, match=r"algo.kl_estimator='k1' picks the estimator of the KL term, which "
                                          r"algo.kl_coef=0 turns off"):
        load_config(TrainConfig, None, ["algo.kl_coef=0.1", "algo.kl_estimator=k1", "algo.kl_coef=0", *extra])


TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=80", "data.num_eval=8", "data.digits=1", "sampling.n_prompts=4", "sampling.group_size=4",
        "sampling.max_tokens=4", "run.steps=2", "run.progress=false", "run.num_threads=1", "optim.lr=1e-2",
        "data.reward=helpers.dense_reward:letter_share"]


def test_loop_with_kl_in_reward_and_whitening(tmp_path, monkeypatch):
    seen = []
    real = objective.token_advantages

    def spy(adv, mask, algo, old_logp=None, ref_logp=None):
        out = real(adv, mask, algo, old_logp, ref_logp)
        raw = real(adv, mask, dataclasses.replace(algo, whiten_advantages=False), old_logp, ref_logp)
        seen.append((adv.clone(), mask.clone(), raw, out))
        return out

    monkeypatch.setattr(objective, "token_advantages", spy)  # Objective looks it up at call time
    cfg = load_config(TrainConfig, None, TINY + [f"run.out_dir={tmp_path}", "algo.kl_in=reward", "algo.kl_coef=0.1",
                                                 "algo.whiten_advantages=true",
                                                 # a dense reward: variance at step 1, so the policy moves
                                                 "run.seed=1"], base=get_recipe("grpo"))
    res = train(cfg)
    rows = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for k in ("loss", "grad_norm", "entropy", "kl", "reward/mean"):
            assert math.isfinite(r[k]), k
    assert rows[0]["grad_norm"] > 0  # step 1 updated the policy ...
    assert rows[-1]["kl"] > 0  # ... so at step 2 it is away from the reference
    assert len(seen) == 2
    for step, (adv, mask, raw, out) in enumerate(seen, start=1):
        assert out.shape == mask.shape
        assert abs(float(masked_mean(out, mask))) < 1e-5
        assert abs(float(masked_var(out, mask)) - 1.0) < 1e-4
        shaping = torch.where(mask, raw - adv.unsqueeze(1), torch.zeros(()))
        if step == 1:  # old policy == reference (bitwise): k3 = 0, no shaping
            assert float(shaping.abs().max()) == 0.0
        else:  # a penalty, so the reward-to-go is <= 0 everywhere and < 0 somewhere
            assert float(shaping.max()) <= 0.0 and float(shaping.min()) < 0.0


def test_token_advantages_reach_the_gradient_token_by_token():
    """Trainer gradient with (B, T) advantages from kl_in=reward + whitening equals an independent
    -(1/S) sum_i sum_t A_it grad log pi(y_it) (plain log_softmax), under any micro-batch split."""
    from rlvr.models import build_tiny_model
    from rlvr.rollout import HFGenerator, SamplingSpec
    from rlvr.rollout.batch import rollouts_to_batch
    from rlvr.train.batching import ForwardSpec
    from rlvr.train.pg.objective import LossParts, Minibatch, accumulate_gradients, batch_logprobs

    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=3)
    rollouts = HFGenerator(model, tok).generate(["12+7=", "3+45="], SamplingSpec(n=4, temperature=1.0,
                                                                                    max_tokens=5, seed=11))
    batch = rollouts_to_batch(rollouts, tok.pad_token_id)
    model.train()
    old = batch_logprobs(model, batch, micro_batch_size=8)
    g = torch.Generator().manual_seed(0)
    ref = old - 0.3 * torch.rand(old.shape, generator=g)  # a reference that differs token by token
    adv = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.0]) - 0.5
    algo = AlgoConfig(advantage="group_mean", loss="reinforce_with_baseline", aggregation="seq_mean_token_sum",
                      kl_coef=0.5, kl_estimator="k1", kl_in="reward", whiten_advantages=True)
    tadv = token_advantages(adv, batch.response_mask, algo, old, ref)
    assert tadv.shape == batch.response_mask.shape
    # not constant along a response: the KL reward-to-go varies per token
    row = tadv[0][batch.response_mask[0]]
    assert row.numel() > 1 and float(row.max() - row.min()) > 1e-3

    def grads(micro):
        model.zero_grad(set_to_none=True)
        accumulate_gradients(model, Minibatch(batch, tadv, old, ref), LossParts.from_algo(algo),
                             ForwardSpec.of(algo, micro), norm_length=5)
        return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    ours, split = grads(8), grads(3)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1)  # (S, T)
    (-(tadv * logp * batch.response_mask).sum() / logp.shape[0]).backward()
    indep = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    assert ours.keys() == indep.keys() == split.keys() and len(ours) > 3
    for k in ours:
        assert torch.allclose(ours[k], indep[k], atol=1e-5, rtol=1e-4), k
        assert torch.allclose(ours[k], split[k], atol=1e-6, rtol=1e-5), k
    assert max(float(v.abs().max()) for v in ours.values()) > 1e-4
