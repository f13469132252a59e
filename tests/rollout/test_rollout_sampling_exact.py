"""The sampler's passes trimmed without changing a bit (issue 38, S4): process_logits skips the division at
temperature 1, sample_rows finds the last kept token from the mask's bytes (no int32 copy). The chosen
tokens and the log-probabilities are bit-identical to the formulas they replace, whatever the logits' dtype,
truncation, removed tokens or uniforms."""

import pytest
import torch

from rlvr.algo.logprobs import kept_mask
from rlvr.rollout.sampling import process_logits, sample_rows


def process_before(logits, temperature, top_k, top_p):
    x = logits.float() / temperature
    keep = kept_mask(x, top_k, top_p)
    if keep is not None:
        x = x.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(x, dim=-1)


def sample_before(logp, u):
    cdf = logp.double().exp().cumsum(-1)
    target = (u.double().to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    ids = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    positive = logp > float("-inf")
    last = logp.shape[-1] - 1 - positive.flip(-1).int().argmax(-1)
    return torch.minimum(ids, last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.0, 5, 1.0), (1.3, 7, 0.8),
                                                       (1.0, 0, 0.5)])
def test_same_bits_as_before(dtype, temperature, top_k, top_p):
    g = torch.Generator().manual_seed(0)
    B, V = 64, 301
    logits = (torch.randn(B, V, generator=g) * 3).to(dtype)
    logits[3, :] = 0.0  # all tied
    logits[5, 200:] = float("-inf")  # removed tail (EOS-ban-like)
    logits[7, :-1] = float("-inf")  # one token left, at the very end
    u = torch.rand(B, generator=g, dtype=torch.float64)
    u[:4] = torch.tensor([0.0, 1.0 - 1e-17, 0.5, 1.0 - 2**-53], dtype=torch.float64)
    before = process_before(logits, temperature, top_k, top_p)
    after = process_logits(logits, temperature, top_k, top_p)
    assert after.dtype == torch.float32 and torch.equal(after, before)
    assert torch.equal(sample_rows(after, u), sample_before(before, u))
    keep = logits.clone()
    sample_rows(after, u)
    assert torch.equal(logits, keep)  # the inputs are left alone
    lp64 = after.double()
    copy = lp64.clone()
    assert torch.equal(sample_rows(lp64, u), sample_before(copy, u)) and torch.equal(lp64, copy)


def test_u_rounding_up_to_the_total_falls_back_to_the_last_kept_token():
    logp = torch.log(torch.tensor([[0.25, 0.75, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]))
    u = torch.tensor([1.0 - 1e-17, 1.0 - 1e-17], dtype=torch.float64)
    assert sample_rows(logp, u).tolist() == [1, 3] == sample_before(logp, u).tolist()
