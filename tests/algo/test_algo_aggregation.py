"""Loss aggregation: any split into micro-batches with global normalizers = the single batch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algo import LOSS_AGGREGATIONS, POLICY_LOSSES, LossNormalizers, aggregate_loss, loss_normalizers


def test_hand_values():
    # row 0: losses [1, 2, 3] with mask [1, 1, 0]; row 1: [4, 5, 6] mask [1, 1, 1]; row 2 empty
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    norm = loss_normalizers(mask, constant=4.0)
    assert norm == LossNormalizers(num_seqs=3.0, num_tokens=5.0, constant=4.0)
    # seq_mean_token_mean: (1.5 + 5 + 0) / 3 = 2.1667
    assert LOSS_AGGREGATIONS["seq_mean_token_mean"](loss, mask, norm).item() == pytest.approx(6.5 / 3)
    # token_mean: (1 + 2 + 4 + 5 + 6) / 5 = 3.6
    assert LOSS_AGGREGATIONS["token_mean"](loss, mask, norm).item() == pytest.approx(3.6)
    # seq_mean_token_sum: (3 + 15) / 3 = 6
    assert LOSS_AGGREGATIONS["seq_mean_token_sum"](loss, mask, norm).item() == pytest.approx(6.0)
    # seq_mean_token_sum_norm: 18 / (3 * 4) = 1.5
    assert LOSS_AGGREGATIONS["seq_mean_token_sum_norm"](loss, mask, norm).item() == pytest.approx(1.5)
    # not counting the empty row: S = 2 -> seq_mean_token_mean = 6.5 / 2
    norm2 = loss_normalizers(mask, count_empty_rows=False)
    assert LOSS_AGGREGATIONS["seq_mean_token_mean"](loss, mask, norm2).item() == pytest.approx(3.25)
    # all-empty batch: 0, never nan
    z = torch.zeros(2, 3)
    for name in ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum"):
        assert aggregate_loss(name, loss[:2], z).item() == 0.0
    with pytest.raises(ValueError, match="needs LossNormalizers.constant"):
        aggregate_loss("seq_mean_token_sum_norm", loss, mask)
    with pytest.raises(KeyError, match="known: seq_mean_token_mean, seq_mean_token_sum"):
        aggregate_loss("seq-mean-token-mean", loss, mask)


def test_local_normalizers_would_be_wrong():
    # The failure mode the global normalizers fix: token_mean with each micro-batch divided by its
    # own token count and the micro-batches averaged. Rows with 1 and 3 valid tokens, losses 1
    # and 3: true token mean (1 + 3*3) / 4 = 2.5; naive ((1/1) + (9/3)) / 2 = 2.0.
    loss = torch.tensor([[1.0, 0.0, 0.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    norm = loss_normalizers(mask)
    fn = LOSS_AGGREGATIONS["token_mean"]
    assert fn(loss, mask, norm).item() == pytest.approx(2.5)
    assert (fn(loss[:1], mask[:1], norm) + fn(loss[1:], mask[1:], norm)).item() == pytest.approx(2.5)
    naive = (aggregate_loss("token_mean", loss[:1], mask[:1]) + aggregate_loss("token_mean", loss[1:], mask[1:])) / 2
    assert naive.item() == pytest.approx(2.0)


@st.composite
def batches(draw):
    b = draw(st.integers(1, 7))
    t = draw(st.integers(1, 6))
    bits = draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))
    mask = torch.tensor(bits, dtype=torch.int64).reshape(b, t)
    if draw(st.booleans()):
        mask[draw(st.integers(0, b - 1))] = 0  # make sure empty rows appear
    perm = draw(st.permutations(list(range(b))))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, b - 1)), max_size=3)))) if b > 1 else []
    seed = draw(st.integers(0, 2**16))
    return mask, perm, cuts, seed


@settings(max_examples=30, deadline=None)
@given(batches(), st.sampled_from(sorted(LOSS_AGGREGATIONS)), st.sampled_from(["grpo_clip", "gspo", "kimi"]))
def test_split_invariance(batch, agg, loss_name):
    mask, perm, cuts, seed = batch
    b, t = mask.shape
    g = torch.Generator().manual_seed(seed)
    logp0 = torch.randn(b, t, generator=g, dtype=torch.float64) - 1
    old = logp0 + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    fn = LOSS_AGGREGATIONS[agg]
    kw = {"clip_low": 0.2, "clip_high": 0.28, "tau": 0.5}

    # single batch
    logp = logp0.clone().requires_grad_()
    norm = loss_normalizers(mask, constant=float(t + 2))
    per_tok, _ = POLICY_LOSSES[loss_name](logp, old, adv, mask, **kw)
    full = fn(per_tok, mask, norm)
    full.backward()

    # micro-batches: a random permutation of rows cut into pieces; normalizers from the full batch
    # (computed here from the list of micro-batch masks, which must give the same numbers)
    idx = torch.tensor(perm)
    parts = [p for p in torch.tensor_split(idx, cuts) if p.numel() > 0]
    norm_parts = loss_normalizers([mask[p] for p in parts], constant=float(t + 2))
    assert norm_parts == norm
    logp_m = logp0.clone().requires_grad_()
    total = torch.zeros((), dtype=torch.float64)
    for p in parts:
        pt, _ = POLICY_LOSSES[loss_name](logp_m[p], old[p], adv[p], mask[p], **kw)
        part = fn(pt, mask[p], norm)
        part.backward()  # accumulate, as gradient accumulation does
        total = total + part.detach()
    assert torch.isfinite(full)
    assert torch.allclose(total, full.detach(), atol=1e-12)
    assert torch.allclose(logp_m.grad, logp.grad, atol=1e-12)


def test_normalizers_add_for_workers():
    m1 = torch.tensor([[1, 1, 0]])
    m2 = torch.tensor([[1, 0, 0], [0, 0, 0]])
    assert loss_normalizers(m1, 5.0) + loss_normalizers(m2, 5.0) == LossNormalizers(3.0, 3.0, 5.0)
    with pytest.raises(ValueError, match="constants"):
        loss_normalizers(m1, 5.0) + loss_normalizers(m2, 4.0)
