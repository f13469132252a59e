"""Dropout is off in every RL forward (model.disable_dropout, default true for rlvr train / ei / eval).

A policy whose config has dropout (a tiny Qwen2 with attention_dropout=0.1) used to train in train()
mode with dropout on while the old-logprob and reference forwards ran in eval(): the first on-policy
step had ratios 0.93-1.09 instead of 1 and a nonzero KL against an identical reference, and
algo.reuse_logprobs_on_policy true/false gave different runs.
"""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.config import load_config
from rlvr.models import build_tiny_model, save_policy
from rlvr.train.config import SFTConfig, TrainConfig
from rlvr.train.pg.loop import train
from rlvr.train.pg.recipes import get_recipe

TINY = ["data.num_train=40", "data.num_eval=4", "data.digits=1", "sampling.n_prompts=2",
        "sampling.group_size=4", "sampling.max_tokens=4", "run.steps=1", "run.progress=false", "run.num_threads=1",
        "run.eval_every=0", "optim.lr=1e-2", "data.reward=helpers.dense_reward:letter_share", "run.seed=1",
        "algo.kl_coef=0.1"]  # grpo: k3 in the loss against a reference identical to the start policy


@pytest.fixture(scope="module")
def dropout_model(tmp_path_factory):
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=3)
    model.config.attention_dropout = 0.1
    path = tmp_path_factory.mktemp("dropout_model")
    save_policy(model, tok, path)
    return path


def _run(path, out, *extra):
    cfg = load_config(TrainConfig, None, TINY + [f"model.init_from={path}", f"run.out_dir={out}", *extra],
                      base=get_recipe("grpo"))
    res = train(cfg)
    return json.loads((res.run_dir / "metrics.jsonl").read_text().splitlines()[0])


def test_first_on_policy_step_has_ratio_one_and_zero_kl_with_dropout_in_the_config(dropout_model, tmp_path):
    reuse = _run(dropout_model, tmp_path / "reuse", "algo.reuse_logprobs_on_policy=true")
    fresh = _run(dropout_model, tmp_path / "fresh", "algo.reuse_logprobs_on_policy=false")
    for m in (reuse, fresh):
        assert m["ratio/min"] == 1.0 and m["ratio/max"] == 1.0, m
        assert m["kl"] == 0.0, m  # the reference is the start policy, bit for bit
        assert m["grad_norm"] > 0
    for k in ("loss", "grad_norm", "entropy", "kl", "ratio/mean", "reward/mean"):
        assert reuse[k] == fresh[k], k


def test_disable_dropout_false_keeps_it(dropout_model, tmp_path):
    # who asks for dropout gets it (and therefore ratios away from 1 from the separate old forward)
    m = _run(dropout_model, tmp_path / "on", "algo.reuse_logprobs_on_policy=false", "model.disable_dropout=false")
    assert m["ratio/min"] < 1.0 < m["ratio/max"]


def test_disable_dropout_zeroes_every_kind_of_dropout():
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlvr.models.loading import disable_dropout

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                                      resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1))
    qwen, _ = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=3)
    for m in qwen.modules():
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = 0.1
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    for model in (gpt2, qwen):
        model.train()
        assert not torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)  # dropout acts
        assert disable_dropout(model) > 0
        model.train()
        assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)
        model.eval()
        with torch.no_grad():
            assert torch.allclose(model(input_ids=ids).logits, model.train()(input_ids=ids).logits, atol=1e-6)


def test_sft_keeps_the_models_dropout_by_default():
    assert load_config(SFTConfig, None, []).model.disable_dropout is False
    assert load_config(TrainConfig, None, []).model.disable_dropout is True
