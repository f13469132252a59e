"""rlvr.compat.cs336: the assignment's names and conventions, checked against hand values."""

import math

import pytest
import torch

from rlvr.compat import cs336


def _reward_fn(response, truth):
    ok = float(response == truth)
    return {"reward": ok, "format_reward": 1.0, "answer_reward": ok}


def test_group_normalized_rewards_uses_sample_std():
    responses = ["a", "b", "b", "b", "a", "a", "b", "b"]
    truths = ["a"] * 8
    # group 1 rewards [1,0,0,0]: mean 0.25, torch.std (sample) = sqrt(0.75/3) = 0.5
    #   -> [0.75/0.5, -0.25/0.5 x3] = [1.5, -0.5, -0.5, -0.5]
    # group 2 [1,1,0,0]: sample std sqrt(1/3) = 0.57735 -> +-0.5/0.57735 = +-0.866
    adv, raw, meta = cs336.compute_group_normalized_rewards(_reward_fn, responses, truths, 4, 1e-6, True)
    h = 0.5 * math.sqrt(3)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, h, h, -h, -h], rel=1e-5)
    assert raw.tolist() == [1, 0, 0, 0, 1, 1, 0, 0]
    # independent check against torch.std on the grouped rewards
    g = raw.reshape(2, 4)
    ref = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)
    assert torch.allclose(adv, ref.reshape(-1))
    assert meta["reward_mean"] == pytest.approx(3 / 8) and meta["format_reward_mean"] == 1.0
    adv, _, _ = cs336.compute_group_normalized_rewards(_reward_fn, responses, truths, 4, 1e-6, False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])


def test_policy_gradient_losses():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]])
    a = torch.tensor([[2.0], [-1.0]])
    # -A * logp: [[2, 4], [-0.5, -0.25]]
    assert cs336.compute_naive_policy_gradient_loss(a, logp).tolist() == [[2.0, 4.0], [-0.5, -0.25]]
    # ratio exp(0.5) = 1.6487 with A=+2, cliprange 0.2: -min(3.297, 2.4) = -2.4, clipped;
    # ratio 1 with A=-1: 1.0, not clipped
    old = torch.tensor([[-1.5, -2.0], [-0.5, -0.25]])
    loss, meta = cs336.compute_grpo_clip_loss(a, logp, old, 0.2)
    assert torch.allclose(loss, torch.tensor([[-2.4, -2.0], [1.0, 1.0]]))
    assert meta["clipped"].tolist() == [[True, False], [False, False]]
    l2, _ = cs336.compute_policy_gradient_loss(logp, "grpo_clip", None, a, old, 0.2)
    assert torch.equal(l2, loss)
    l3, _ = cs336.compute_policy_gradient_loss(logp, "no_baseline", raw_rewards=a)
    assert l3.tolist() == [[2.0, 4.0], [-0.5, -0.25]]
    with pytest.raises(ValueError, match="needs old_log_probs, cliprange"):
        cs336.compute_policy_gradient_loss(logp, "grpo_clip", advantages=a)
    with pytest.raises(KeyError, match="known: grpo_clip, no_baseline, reinforce_with_baseline"):
        cs336.compute_policy_gradient_loss(logp, "ppo", advantages=a)


def test_masked_helpers_and_entropy():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert cs336.masked_mean(x, m).item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert cs336.masked_mean(x, m, dim=1).tolist() == [1.5, 4.0]
    assert cs336.masked_normalize(x, m, 2.0, dim=1).tolist() == [1.5, 2.0]  # (1+2)/2, 4/2
    assert cs336.masked_normalize(x, m, 2.0).item() == 3.5
    # uniform over 4 -> ln 4
    assert cs336.compute_entropy(torch.zeros(1, 1, 4)).item() == pytest.approx(math.log(4))


def test_microbatch_train_steps_backward():
    # SFT: rows with response log-probs [-1, -2] (2 tokens) and [-4] (1 token), constant 2,
    # 2 accumulation steps: per-seq -sum/2 = [1.5, 2.0], mean 1.75, /2 = 0.875;
    # gradient per valid token = -1 / (2 const * 2 seqs * 2 steps) = -0.125
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-4.0, -9.0, -9.0]], requires_grad=True)
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, _ = cs336.sft_microbatch_train_step(logp, m, 2, normalize_constant=2.0)
    assert loss.item() == pytest.approx(0.875)
    assert logp.grad.tolist() == [[-0.125, -0.125, 0.0], [-0.125, 0.0, 0.0]]
    # GRPO reinforce_with_baseline: A = [1, -2]; per-token -A*logp = [[1, 2], [-8]]; per-seq means
    # [1.5, -8], mean -3.25, /2 steps = -1.625; grad = -A / (n_i * 2 seqs * 2 steps)
    logp.grad = None
    adv = torch.tensor([[1.0], [-2.0]])
    loss, _ = cs336.grpo_microbatch_train_step(logp, m, 2, "reinforce_with_baseline", advantages=adv)
    assert loss.item() == pytest.approx(-1.625)
    assert torch.allclose(logp.grad, torch.tensor([[-0.125, -0.125, 0.0], [0.5, 0.0, 0.0]]))


def test_response_log_probs_and_tokenize_delegate_to_models():
    models = pytest.importorskip("rlvr.models")
    model, tok = models.build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=0)
    batch = cs336.tokenize_prompt_and_output(["1+1="], ["2"], tok)
    assert set(batch) == {"input_ids", "labels", "response_mask"}
    # "1+1=" + "2" is 5 characters -> 4 positions; only the last label ("2") is response
    assert batch["input_ids"].shape == (1, 4) and batch["response_mask"].tolist() == [[False, False, False, True]]
    out = cs336.get_response_log_probs(model, batch["input_ids"], batch["labels"], return_token_entropy=True)
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=batch["input_ids"]).logits.float(), -1)
    ref_lp = ref.gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(out["log_probs"], ref_lp, atol=1e-5)
    assert torch.allclose(out["token_entropy"], -(ref.exp() * ref).sum(-1), atol=1e-5)
