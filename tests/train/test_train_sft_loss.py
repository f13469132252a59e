"""SFT loss (issue 5): loss on response tokens only, every aggregation selectable, and micro-batching
(gradient accumulation) gives the gradient of the whole batch. Checked against an independent
computation with plain log_softmax on a real tiny model."""

from __future__ import annotations

import pytest
import torch

from rlvr.algo import LOSS_AGGREGATIONS
from rlvr.config import load_config
from rlvr.models import build_tiny_model
from rlvr.train.config import SFTConfig
from rlvr.train.sft import sft_batch, sft_loss, train_sft

PAIRS = [("1+2=", "3"), ("40+5=", "45"), ("7+7=", "14"), ("9+90=", "99"), ("0+0=", "0")]
MAX_LEN = 16


@pytest.fixture(scope="module")
def setup():
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=5)
    batch = sft_batch(PAIRS, lambda e: e[0], lambda e: e[1], tok, MAX_LEN)
    return model, tok, batch


def _grads(model, batch, aggregation, micro):
    model.zero_grad(set_to_none=True)
    loss = sft_loss(model, batch, aggregation, micro, MAX_LEN)
    return loss, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _independent(model, batch, aggregation):
    """-log p of each response token (target + EOS), aggregated by hand; prompt tokens never enter."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    labels = batch.labels.clamp(min=0)
    logp = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (S, T)
    m = batch.response_mask.float()
    nll_rows = -(logp * m).sum(-1)  # (S,) summed response NLL per example
    n_rows = m.sum(-1)  # (S,) response tokens per example: len(target) + 1 for EOS
    s = float(len(PAIRS))
    return {
        "token_mean": nll_rows.sum() / n_rows.sum(),
        "seq_mean_token_mean": (nll_rows / n_rows).sum() / s,
        "seq_mean_token_sum": nll_rows.sum() / s,
        "seq_mean_token_sum_norm": nll_rows.sum() / (s * MAX_LEN),
    }[aggregation]


def test_response_mask_counts_target_and_eos_only(setup):
    _, _, batch = setup
    # targets "3", "45", "14", "99", "0" plus one EOS each: 2 + 3 + 3 + 3 + 2 = 13 response tokens
    assert batch.response_mask.sum(-1).tolist() == [2, 3, 3, 3, 2]


@pytest.mark.parametrize("aggregation", sorted(LOSS_AGGREGATIONS))
def test_sft_loss_equals_independent_formula_and_is_split_invariant(setup, aggregation):
    model, _, batch = setup
    full_loss, full = _grads(model, batch, aggregation, micro=len(PAIRS))
    model.zero_grad(set_to_none=True)
    ref = _independent(model, batch, aggregation)
    assert full_loss == pytest.approx(float(ref.detach()), rel=1e-5)
    ref.backward()
    for n, p in model.named_parameters():
        assert torch.allclose(full[n], p.grad, atol=1e-6, rtol=1e-4), (aggregation, n)
    # gradient accumulation over micro-batches of 1 and of 2 rows (5 = 2 + 2 + 1): the same gradient
    for micro in (1, 2):
        loss, g = _grads(model, batch, aggregation, micro)
        assert loss == pytest.approx(full_loss, rel=1e-5)
        for n in full:
            assert torch.allclose(g[n], full[n], atol=1e-6, rtol=1e-4), (aggregation, micro, n)
    assert max(float(x.abs().max()) for x in full.values()) > 1e-4  # a real gradient


def test_rlvr_sft_runs_with_the_constant_normalized_aggregation(tmp_path):
    # seq_mean_token_sum_norm needs a constant; SFT uses algo.max_length (it used to fail at step 1)
    cfg = load_config(SFTConfig, None, [
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.digits=1", "data.num_train=40", "data.num_eval=4", "algo.batch_size=4", "run.steps=2",
        "run.eval_every=0", "run.progress=false", "run.num_threads=1", f"run.out_dir={tmp_path / 'r'}",
        "algo.aggregation=seq_mean_token_sum_norm", "algo.max_length=32"])
    res = train_sft(cfg)
    assert res.steps == 2
