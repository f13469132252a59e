"""Every recipe runs through the real loop (in-process, 2 steps, 2 epochs x 2 minibatches, so the
ratio departs from 1 and clipping is live), and on-policy reuse of logp.detach() as old logprobs
gives exactly the run that a separate no-grad forward gives."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlvr.config import load_config
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import train
from rlvr.train.pg.recipes import RECIPES, get_recipe

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=80", "data.num_eval=8", "data.digits=1", "sampling.n_prompts=4", "sampling.group_size=4",
        "sampling.max_tokens=4", "run.steps=2", "run.progress=false", "run.num_threads=1", "optim.lr=1e-2",
        # dense reward (tests/helpers/dense_reward.py, share of letters): a random tiny model's samples differ in
        # reward, hence gradients, whatever the sampler's random stream
        "data.reward=helpers.dense_reward:letter_share"]


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_runs_through_the_loop(name, tmp_path):
    cfg = load_config(TrainConfig, None, TINY + [f"run.out_dir={tmp_path}", "algo.epochs_per_rollout_batch=2",
                                                 "algo.num_minibatches=2", "algo.micro_batch_size=4"],
                      base=get_recipe(name))
    res = train(cfg, data=None)
    rows = _rows(res.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    learned = [r for r in rows if r.get("grad_norm", 0.0) > 0]
    assert learned, name  # at least one step had reward variance, hence a gradient
    for r in learned:
        for k in ("loss", "grad_norm", "entropy", "ratio/mean"):
            assert math.isfinite(r[k]), (name, k)
        assert 0.0 <= r["clip_frac/low"] <= 1.0 and 0.0 <= r["clip_frac/high"] <= 1.0
        # 2 epochs x 2 minibatches = 4 optimizer steps on one batch: later passes are off-policy
        assert r["ratio/min"] <= 1.0 <= r["ratio/max"] and r["ratio/max"] - r["ratio/min"] > 1e-4
    if name == "grpo":
        assert rows[-1]["kl"] > 0
    if name == "kimi":  # no KL term: the squared-error surrogate regularizes through tau instead
        assert all(r.get("kl") is None for r in rows)
    if name == "dapo":  # zero-variance groups are dropped from the loss, refills top the batch up
        for r in rows:
            sampled, dropped, kept = (r[f"dynamic/groups_{k}"] for k in ("sampled", "dropped", "kept"))
            assert kept == min(4, sampled - dropped) and r["kept_frac"] == pytest.approx(kept / sampled)


def test_on_policy_reuse_of_detached_logp_gives_the_same_run(tmp_path):
    def run(reuse: bool, out):
        cfg = load_config(TrainConfig, None, TINY + [f"run.out_dir={out}", f"algo.reuse_logprobs_on_policy={str(reuse).lower()}"],
                          base=get_recipe("grpo"))
        res = train(cfg)
        rows = [{k: v for k, v in r.items() if not k.startswith(("time", "tokens_per_s", "mem/", "perf/"))} for r in _rows(res.run_dir)]
        return rows, res.run_dir

    a, da = run(True, tmp_path / "a")
    b, db = run(False, tmp_path / "b")
    assert len(a) == 2
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            if ra[k] is None:  # e.g. eval/format_rate of a task without a format part: not applicable
                assert rb[k] is None, k
            else:
                assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-6), k
    from safetensors.torch import load_file

    wa = load_file(str(next((da / "checkpoints" / "step_000002" / "model").glob("*.safetensors"))))
    wb = load_file(str(next((db / "checkpoints" / "step_000002" / "model").glob("*.safetensors"))))
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k


def _flaky_reward(response, example):
    # module-level (picklable); raises on about a quarter of responses (by their characters: most are cut at
    # the same length): a minority of errors is counted and the run goes on (a majority stops it,
    # tests/cli/test_cli_reward_errors.py)
    from rlvr.rewards.types import Reward, Status

    if sum(map(ord, response)) % 4 == 0:
        raise RuntimeError("checker bug")
    return Reward(float(len(response) % 2), {"answer": float(len(response) % 2)}, Status.INCORRECT)


def test_reward_errors_are_counted_not_fatal(tmp_path):
    from rlvr.data import get_task
    from rlvr.train.tasks import TaskData

    t = get_task("arithmetic")
    task = TaskData("flaky", t.generate(40, "train", 0, digits=1), t.generate(4, "test", 0, digits=1),
                    lambda e: e.question, _flaky_reward, lambda e: e.reference)
    cfg = load_config(TrainConfig, None, TINY + [f"run.out_dir={tmp_path}", "sampling.max_tokens=6"], base=get_recipe("grpo"))
    train(cfg, data=task)
    rows = _rows(tmp_path)
    assert sum(r["verifier/errors"] for r in rows) > 0
    assert all(r["verifier/timeouts"] == 0 for r in rows)


def _algo(name: str):
    # kimi_tau pinned so the hand values below hold whatever tau the recipe may choose later
    return load_config(TrainConfig, None, ["algo.kimi_tau=1.0"], base=get_recipe(name)).algo


def test_kimi_and_grpo_differ_where_kimi_is_defined():
    """What makes kimi kimi, at the objective level, with hand-computed numbers: the group-mean
    advantage of the reward plus 0.1 x Kimi's length reward (grpo: std-normalized reward, no
    length term), the squared-error surrogate (grpo: the clipped ratio), and no KL term (grpo:
    k3 with beta 0.04)."""
    from rlvr.algo.aggregation import loss_normalizers
    from rlvr.rewards.types import Reward, Status
    from rlvr.train.pg.objective import LossParts, shape_and_advantage

    grpo, kimi = _algo("grpo"), _algo("kimi")
    assert (grpo.advantage, grpo.loss, grpo.length_reward, grpo.kl_coef) == ("grpo", "grpo_clip", "", 0.04)
    assert (kimi.advantage, kimi.loss, kimi.length_reward, kimi.length_reward_coef, kimi.kl_coef) == (
        "group_mean", "kimi", "kimi", 0.1, 0.0)
    assert LossParts.from_algo(grpo).kl == ("k3", 0.04, True) and LossParts.from_algo(kimi).kl is None

    # one group of 4: rewards 1, 1, 0, 0 (the first two correct), response lengths 2, 4, 3, 5 tokens
    rewards = [Reward(1.0, status=Status.CORRECT), Reward(1.0, status=Status.CORRECT),
               Reward(0.0, status=Status.INCORRECT), Reward(0.0, status=Status.INCORRECT)]
    lengths = torch.tensor([2, 4, 3, 5])
    shaped, adv, keep, _ = shape_and_advantage(rewards, lengths, grpo, group_size=4, max_tokens=8)
    # grpo: (r - 0.5) / (population std 0.5 + 1e-6), no length term
    assert shaped.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert adv.tolist() == pytest.approx([1.0, 1.0, -1.0, -1.0], abs=1e-5)
    shaped, adv, keep, _ = shape_and_advantage(rewards, lengths, kimi, group_size=4, max_tokens=8)
    # Kimi's length reward: lambda = 0.5 - (len - 2) / (5 - 2) = [1/2, -1/6, 1/6, -1/2]; a wrong
    # answer keeps only min(0, lambda) -> [1/2, -1/6, 0, -1/2]; shaped = r + 0.1 * that
    # = [21/20, 59/60, 0, -1/20], group mean 119/240, advantage = shaped - mean
    assert shaped.tolist() == pytest.approx([21 / 20, 59 / 60, 0.0, -1 / 20], abs=1e-6)
    assert adv.tolist() == pytest.approx([133 / 240, 117 / 240, -119 / 240, -131 / 240], abs=1e-6)
    assert keep.all()

    # the same advantages A = [1, -1] and log-ratios on a fixed batch: row 0 has two response tokens
    # with log(pi/pi_old) = 0.1, 0.2; row 1 has one with -0.5; both aggregate by seq_mean_token_mean
    old = torch.tensor([[-1.0, -2.0, 0.0], [-1.5, 0.0, 0.0]])
    logp = (old + torch.tensor([[0.1, 0.2, 0.0], [-0.5, 0.0, 0.0]])).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    a = torch.tensor([1.0, -1.0])
    norm = loss_normalizers(mask)

    def loss_and_grad(algo):
        parts = LossParts.from_algo(algo)
        logp.grad = None
        per_token, _ = parts.policy(logp, old, a, mask)
        loss = parts.aggregate(per_token, mask, norm)
        loss.backward()
        return loss.item(), logp.grad.clone()

    # kimi (tau 1): L_i = (A_i - sum_t log ratio)^2 / 2 = [(1 - 0.3)^2 / 2, (-1 + 0.5)^2 / 2]
    # = [0.245, 0.125], mean 0.185; dL/dlogp_t = -(A_i - log ratio_i) / 2 rows = -0.35 (row 0), 0.25
    loss, grad = loss_and_grad(kimi)
    assert loss == pytest.approx(0.185, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[-0.35, -0.35, 0.0], [0.25, 0.0, 0.0]]), atol=1e-6)
    # grpo (clip 0.2): row 0 tokens -e^0.1 (inside the clip) and -1.2 (ratio e^0.2 clipped), row 1
    # 0.8 (ratio e^-0.5 clipped at 0.8 with A < 0); per-row token means [-(e^0.1 + 1.2)/2, 0.8],
    # mean over rows; only the unclipped token has a gradient: -e^0.1 / (2 tokens * 2 rows)
    loss, grad = loss_and_grad(grpo)
    assert loss == pytest.approx((-(math.exp(0.1) + 1.2) / 2 + 0.8) / 2, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[-math.exp(0.1) / 4, 0.0, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6)
