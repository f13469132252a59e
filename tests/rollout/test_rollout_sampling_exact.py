"""The sampler's passes trimmed (issue 38, S4): process_logits skips the division at temperature 1 and takes the
float32 log-softmax straight from the logits' dtype when nothing is truncated; sample_rows finds a block of tokens
from float64 block sums, then the token inside it, instead of a float64 cumulative sum over the whole row. The
log-probabilities are bit-identical to the formulas they replace, and the chosen tokens equal the full cumulative
sum's, whatever the logits' dtype, truncation, removed tokens (whole blocks of them included) or uniforms."""

import pytest
import torch

from rlvr.algo.logprobs import kept_mask
from rlvr.rollout.sampling import SAMPLE_BLOCK, process_logits, sample_rows


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


@pytest.mark.parametrize("V", [151936, 3 * SAMPLE_BLOCK, SAMPLE_BLOCK - 1])
def test_real_vocabulary_blocks_and_removed_blocks_same_tokens_as_the_full_cumulative_sum(V):
    """A real vocabulary (151,936 = 148 whole blocks and a short last one), whole blocks removed (an EOS ban, top-k
    leaving a few tokens far apart), and uniforms at both ends: the same token as the float64 cumulative sum over
    the row, never a removed one."""
    g = torch.Generator().manual_seed(1)
    B = 48
    logits = (torch.randn(B, V, generator=g) * 4).to(torch.bfloat16)
    logits[1, : V - 5] = float("-inf")  # mass only in the last (short) block
    logits[2, SAMPLE_BLOCK:] = float("-inf")  # mass only in the first block
    logits[3, :] = float("-inf")
    logits[3, [0, V // 2, V - 1]] = 0.0  # three tokens in three blocks
    logits[4, 5] = 40.0  # nearly all mass on one token
    u = torch.rand(B, generator=g, dtype=torch.float64)
    u[:8] = torch.tensor([0.0, 1.0 - 1e-17, 1.0 - 2**-53, 0.5, 1 / 3, 2 / 3, 1e-300, 0.999999], dtype=torch.float64)
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.8, 3, 1.0), (1.0, 0, 0.7)]:
        logp = process_logits(logits, temperature, top_k, top_p)
        assert torch.equal(logp, process_before(logits, temperature, top_k, top_p))
        ends = [torch.full((B,), x, dtype=torch.float64) for x in (0.0, 1.0 - 2**-53, 1.0 - 1e-17)]  # every row
        for uu in [u, *((u + k * 0.2357) % 1.0 for k in (1, 2, 3)), *ends]:  # the same rows with other uniforms
            tok = sample_rows(logp, uu)
            assert torch.equal(tok, sample_before(logp, uu)), (temperature, top_k, top_p, uu[:3])
            assert bool((logp.gather(-1, tok.unsqueeze(-1)) > float("-inf")).all())
    # the three-token row: u in thirds picks each of them
    logp = process_logits(logits[3:4].expand(3, V), 1.0, 0, 1.0)
    assert sample_rows(logp, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist() == [0, V // 2, V - 1]


def test_any_layout_of_the_log_probabilities():
    """A column-major (B, V) tensor (exp keeps its layout) and strided rows (the logits' last position of a
    (B, L, V) output): the same tokens as the contiguous rows."""
    g = torch.Generator().manual_seed(2)
    B, V = 6, 3 * SAMPLE_BLOCK + 5
    logp = torch.log_softmax(torch.randn(B, V, generator=g) * 3, -1)
    u = torch.rand(B, generator=g, dtype=torch.float64)
    want = sample_before(logp, u)
    assert torch.equal(sample_rows(logp.t().contiguous().t(), u), want)
    assert torch.equal(sample_rows(torch.stack([logp, logp], 1)[:, 1], u), want)


@pytest.mark.parametrize("V", [100, 3 * SAMPLE_BLOCK + 5])
def test_rows_of_nan_take_a_token_of_the_vocabulary(V):
    """A diverged model's NaN logits: a token id inside the vocabulary (the last one, as the full cumulative sum
    gave), so the run reaches its own NaN check instead of failing on an index; the other rows are untouched."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, V, generator=g)
    logits[1] = float("nan")
    logits[2, 7] = float("nan")
    logp = process_logits(logits, 1.0, 0, 1.0)
    u = torch.tensor([0.3, 0.3, 0.3], dtype=torch.float64)
    tok = sample_rows(logp, u)
    assert tok.tolist()[1:] == [V - 1, V - 1] == sample_before(logp, u).tolist()[1:]
    assert tok[0] == sample_before(logp, u)[0]
