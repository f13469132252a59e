"""Chunked token logprobs / entropy against naive log_softmax and cross_entropy references."""

import math

import pytest
import torch
import torch.nn.functional as F

from rlvr.algo import entropy_from_logits, logprobs_and_entropy, token_logprobs_from_logits
from rlvr.algo.logprobs import IGNORE_INDEX


def _naive(logits, labels, temperature=1.0):
    ls = torch.log_softmax(logits.double() / temperature, dim=-1)
    lp = ls.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * (labels != -100)
    ent = -(ls.exp() * ls).sum(-1)
    return lp, ent


def test_hand_values():
    # logits [0, ln 3] -> p = [1/4, 3/4]; log p(label 1) = ln(3/4) = -0.28768...
    # entropy = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.34657 + 0.21576 = 0.56233
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    lp, ent = logprobs_and_entropy(logits, torch.tensor([[1]]), with_entropy=True)
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    assert lp.dtype == torch.float32


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_naive_values_and_gradients(chunk, temperature):
    g = torch.Generator().manual_seed(chunk)
    logits = (torch.randn(3, 5, 17, generator=g, dtype=torch.float64) * 4).requires_grad_()
    labels = torch.randint(0, 17, (3, 5), generator=g)
    labels[0, :2] = -100
    labels[2, 4] = -100
    lp, ent = logprobs_and_entropy(logits, labels, chunk_size=chunk, with_entropy=True, temperature=temperature)
    rlp, rent = _naive(logits, labels, temperature)
    assert torch.allclose(lp, rlp, atol=1e-10)
    assert torch.allclose(ent, rent, atol=1e-10)
    assert (lp[labels == -100] == 0).all()
    w1 = torch.randn(3, 5, generator=g, dtype=torch.float64)
    w2 = torch.randn(3, 5, generator=g, dtype=torch.float64)
    (gc,) = torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), logits)
    (gr,) = torch.autograd.grad((rlp * w1).sum() + (rent * w2).sum(), logits)
    assert torch.allclose(gc, gr, atol=1e-10)
    # -100 rows get no gradient from the logprob term
    (gl,) = torch.autograd.grad(logprobs_and_entropy(logits, labels, chunk)[0].sum(), logits)
    assert (gl[0, :2] == 0).all() and (gl[2, 4] == 0).all()


def test_gradcheck_float64():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, -100, 5], [0, 2, 3]])
    assert torch.autograd.gradcheck(lambda a: logprobs_and_entropy(a, labels, 2, True, 0.7), (x,))


def test_against_cross_entropy_float32_and_bf16():
    # Independent implementation: log p(label) = -cross_entropy(logits, label).
    torch.manual_seed(1)
    logits = torch.randn(4, 9, 50) * 3
    labels = torch.randint(0, 50, (4, 9))
    ref = -F.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1), reduction="none").reshape(4, 9)
    assert torch.allclose(token_logprobs_from_logits(logits, labels, chunk_size=5), ref, atol=1e-5)
    lp16 = token_logprobs_from_logits(logits.bfloat16(), labels, chunk_size=5)
    assert lp16.dtype == torch.float32
    ref16 = -F.cross_entropy(logits.bfloat16().float().reshape(-1, 50), labels.reshape(-1), reduction="none")
    assert torch.allclose(lp16, ref16.reshape(4, 9), atol=1e-5)  # same bf16 inputs, fp32 math
    # gradient has the logits' dtype
    x = logits.bfloat16().requires_grad_()
    token_logprobs_from_logits(x, labels, chunk_size=5).sum().backward()
    assert x.grad.dtype == torch.bfloat16


def test_no_grad_and_large_logits_are_stable():
    # logits of +-1e4 overflow a naive exp; logsumexp does not
    logits = torch.tensor([[[1e4, 0.0, -1e4]]])
    with torch.no_grad():
        lp, ent = logprobs_and_entropy(logits, torch.tensor([[0]]), with_entropy=True)
    assert lp.item() == 0.0 and torch.isfinite(ent).all() and ent.item() == pytest.approx(0.0, abs=1e-6)
    # -inf (masked vocabulary) entries give finite entropy: uniform over 2 finite ones = ln 2
    logits = torch.tensor([[[0.0, 0.0, float("-inf")]]], requires_grad=True)
    ent = entropy_from_logits(logits)
    assert ent.item() == pytest.approx(math.log(2), abs=1e-6)
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_all_ignored_and_empty():
    logits = torch.randn(2, 3, 4, requires_grad=True)
    labels = torch.full((2, 3), -100)
    lp = token_logprobs_from_logits(logits, labels)
    assert (lp == 0).all()
    lp.sum().backward()
    assert (logits.grad == 0).all()
    assert token_logprobs_from_logits(torch.randn(0, 3, 4), torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="labels shape"):
        token_logprobs_from_logits(torch.randn(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs_from_logits(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), chunk_size=0)


def test_autograd_saves_only_logits_and_labels():
    # The bounded-memory claim, checked without timing: under autograd, the only tensors kept for
    # backward are the (bf16) logits and the labels -- no fp32 copy, no log_softmax output.
    # The naive version saves a full fp32 (B, T, V) tensor (4 bytes/elt vs 2 for bf16 logits).
    logits = torch.randn(2, 8, 300).bfloat16().requires_grad_()
    labels = torch.randint(0, 300, (2, 8))
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logprobs_and_entropy(logits, labels, chunk_size=4, with_entropy=True)
    logit_bytes = logits.numel() * logits.element_size()
    assert logit_bytes <= sum(saved) <= logit_bytes + labels.numel() * 8  # hooks did fire
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _naive(logits.float(), labels)
    assert sum(saved) >= 2 * logit_bytes  # the reference keeps at least one fp32 copy


# --------------------------------------------------------------------- truncated (top-k / top-p) scoring


def _ref_keep(x, top_k, top_p):
    """Independent kept-set rule in plain Python (float64): the top_k largest, then walk them in
    descending order keeping a token while the mass before it (renormalized over the top-k) is < top_p."""
    keep = torch.zeros(x.shape, dtype=torch.bool)
    for i, row in enumerate(x.tolist()):
        order = sorted(range(len(row)), key=lambda j: -row[j])[: top_k if top_k > 0 else None]
        m = max(row[j] for j in order)
        z = sum(math.exp(row[j] - m) for j in order)
        before = 0.0
        for j in order:
            keep[i, j] = before < top_p
            before += math.exp(row[j] - m) / z
    return keep


def _naive_truncated(logits, labels, temperature, top_k, top_p):
    """float64 reference: explicit masked log_softmax over the kept set; a removed label gets the floor
    as a constant (no gradient); entropy of the renormalized kept distribution. Autograd does the rest."""
    from rlvr.algo import TRUNCATED_LOGPROB

    x = logits.double() / temperature
    keep = _ref_keep(x.detach().reshape(-1, x.shape[-1]), top_k, top_p).reshape(x.shape)
    ls = x - torch.logsumexp(x.masked_fill(~keep, float("-inf")), -1, keepdim=True)  # finite everywhere
    lab = labels.clamp_min(0).unsqueeze(-1)
    inside = keep.gather(-1, lab).squeeze(-1)
    lp = torch.where(inside, ls.gather(-1, lab).squeeze(-1), torch.full(labels.shape, TRUNCATED_LOGPROB,
                                                                         dtype=torch.float64))
    lp = torch.where(labels != -100, lp, torch.zeros_like(lp))
    p = torch.where(keep, ls.exp(), torch.zeros_like(ls))
    ent = -torch.where(keep, p * ls, torch.zeros_like(ls)).sum(-1)
    return lp, ent, keep


@pytest.mark.parametrize("chunk", [1, 4, 64])  # 15 rows: chunks of 4 split them 4/4/4/3
@pytest.mark.parametrize("top_k,top_p", [(0, 0.7), (4, 1.0), (6, 0.8)])
def test_truncated_matches_float64_reference(chunk, top_k, top_p):
    from rlvr.algo import TRUNCATED_LOGPROB, Truncation

    g = torch.Generator().manual_seed(10 * chunk + top_k)
    logits = (torch.randn(3, 5, 17, generator=g, dtype=torch.float64) * 2).requires_grad_()
    labels = torch.randint(0, 17, (3, 5), generator=g)
    labels[0, 0] = -100
    tr = Truncation(top_k, top_p)
    lp, ent = logprobs_and_entropy(logits, labels, chunk_size=chunk, with_entropy=True, temperature=0.7,
                                   truncation=tr)
    rlp, rent, keep = _naive_truncated(logits, labels, 0.7, top_k, top_p)
    assert 0 < int(keep.sum(-1).min()) and int(keep.sum(-1).max()) < 17  # really truncated, never empty
    assert torch.allclose(lp, rlp, atol=1e-12) and torch.allclose(ent, rent, atol=1e-12)
    removed = (labels != -100) & ~keep.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    assert removed.any() and (lp[removed] == TRUNCATED_LOGPROB).all()
    w1 = torch.randn(3, 5, generator=g, dtype=torch.float64)
    w2 = torch.randn(3, 5, generator=g, dtype=torch.float64)
    (gc,) = torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), logits)
    (gr,) = torch.autograd.grad((rlp * w1).sum() + (rent * w2).sum(), logits)
    assert torch.allclose(gc, gr, atol=1e-12)
    # removed tokens get no gradient at all; a removed label's row gets none from its logprob
    assert (gc[~keep] == 0).all()
    (gl,) = torch.autograd.grad(logprobs_and_entropy(logits, labels, chunk, temperature=0.7, truncation=tr)[0].sum(),
                                logits)
    live = ~removed & (labels != -100) & (keep.sum(-1) > 1)  # a kept set of one token has p_K = 1: no gradient
    assert (gl[removed] == 0).all() and (gl[live].abs().sum(-1) > 0).all()


def test_truncated_hand_values_and_gradient():
    from rlvr.algo import TRUNCATED_LOGPROB, Truncation

    # p = [0.5, 0.3, 0.2], top_p = 0.6: mass before 0.3 is 0.5 < 0.6 (kept), before 0.2 is 0.8 (removed):
    # p_K = [0.625, 0.375, 0]; log p_K(1) = ln 0.375 = -0.98083; H_K = -(.625 ln .625 + .375 ln .375) = 0.66166
    # d log p_K(1) / dx = e_1 - p_K = [-0.625, 0.625, 0]
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]])).requires_grad_()
    lp, ent = logprobs_and_entropy(logits, torch.tensor([[1, 2]]), with_entropy=True, truncation=Truncation(top_p=0.6))
    assert lp[0, 0].item() == pytest.approx(math.log(0.375), abs=1e-6)
    assert lp[0, 1].item() == TRUNCATED_LOGPROB  # label 2 is outside the kept set: the floor
    assert ent[0, 0].item() == pytest.approx(-(0.625 * math.log(0.625) + 0.375 * math.log(0.375)), abs=1e-6)
    (g,) = torch.autograd.grad(lp.sum(), logits)
    assert torch.allclose(g[0, 0], torch.tensor([-0.625, 0.625, 0.0]), atol=1e-6)
    assert (g[0, 1] == 0).all()  # the floor is a constant


def test_truncated_bf16_input():
    from rlvr.algo import Truncation

    torch.manual_seed(3)
    logits = (torch.randn(4, 6, 40) * 3).bfloat16().requires_grad_()
    labels = torch.randint(0, 40, (4, 6))
    lp, ent = logprobs_and_entropy(logits, labels, chunk_size=5, with_entropy=True, temperature=0.9,
                                   truncation=Truncation(10, 0.9))
    assert lp.dtype == torch.float32
    ref = logits.detach().double().requires_grad_()
    rlp, rent, _ = _naive_truncated(ref, labels, 0.9, 10, 0.9)  # same bf16 inputs, float64 math
    assert torch.allclose(lp.double(), rlp, atol=1e-5) and torch.allclose(ent.double(), rent, atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    (rlp.sum() + rent.sum()).backward()
    assert logits.grad.dtype == torch.bfloat16
    assert torch.allclose(logits.grad.double(), ref.grad, atol=1e-2)


def test_untruncated_settings_are_bit_identical_to_no_truncation():
    from rlvr.algo import Truncation

    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(2, 7, 33, generator=g) * 3).requires_grad_()
    labels = torch.randint(0, 33, (2, 7), generator=g)
    outs = []
    for tr in (None, Truncation(0, 1.0), Truncation(-1, 1.0), Truncation(33, 1.0)):  # top_k >= V keeps all
        lp, ent = logprobs_and_entropy(logits, labels, chunk_size=3, with_entropy=True, temperature=0.8, truncation=tr)
        (gr,) = torch.autograd.grad(lp.sum() + 0.5 * ent.sum(), logits)
        outs.append((lp, ent, gr))
    for lp, ent, gr in outs[1:]:
        assert torch.equal(lp, outs[0][0]) and torch.equal(ent, outs[0][1]) and torch.equal(gr, outs[0][2])
    assert Truncation.of(0, 1.0) is None and Truncation.of(5, 1.0) == Truncation(5, 1.0)


def test_sampler_and_trainer_use_one_kept_set_rule():
    # the HF sampler's process_logits and the trainer's truncated scoring are the same distribution
    from rlvr.algo import Truncation
    from rlvr.rollout.hf_generator import process_logits

    g = torch.Generator().manual_seed(7)
    logits = torch.randn(64, 50, generator=g) * 3
    for k, p, t in [(0, 0.8, 1.0), (7, 1.0, 0.7), (12, 0.6, 1.3)]:
        sampler = process_logits(logits, t, k, p)  # (64, 50) with -inf on removed tokens
        ids = torch.multinomial(sampler.exp(), 1, generator=g)  # labels the sampler really draws
        lp, _ = logprobs_and_entropy(logits.unsqueeze(1), ids, chunk_size=9, temperature=t, truncation=Truncation(k, p))
        assert torch.allclose(lp, sampler.gather(1, ids), atol=1e-6)


def _kept_by_full_sort(x, top_k, top_p):
    """kept_mask as it was: the top-p threshold from every row's full sort."""
    V = x.shape[-1]
    k = top_k if 0 < top_k < V else 0
    keep = None
    if k:
        vals = torch.topk(x, k, dim=-1).values
        keep = x >= vals[:, -1:]
    if top_p < 1.0:
        if not k:
            vals = torch.sort(x, dim=-1, descending=True).values
        lse = torch.logsumexp(x if keep is None else x.masked_fill(~keep, float("-inf")), dim=-1, keepdim=True)
        p = (vals - lse).exp()
        m = ((p.cumsum(-1) - p) < top_p).sum(-1, keepdim=True).clamp_min(1)
        keep = x >= vals.gather(-1, m - 1)
    return keep


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95, 0.999])
def test_top_p_from_the_largest_values_equals_the_full_sort(top_p, monkeypatch):
    """kept_mask's top-p threshold from each row's TOP_P_PREFIX largest values (a top-k), with a full sort only for
    rows whose kept set reaches past them: the same kept set as sorting every row, for peaked rows (an LM's: a few
    hundred tokens hold the mass), flat rows (the fallback), rows tied at the threshold far down the vocabulary, a
    row with removed tokens, and a mix in one call."""
    from rlvr.algo.logprobs import TOP_P_PREFIX, kept_mask

    g = torch.Generator().manual_seed(11)
    V = 151936
    x = torch.randn(12, V, generator=g)  # flat rows: the kept set is most of the vocabulary
    x[:6, :300] += 16.0  # peaked rows: 1e-4 of the mass outside 300 tokens
    x[6, :] = -20.0
    x[6, [3, 77_000, 150_000]] = 5.0  # three tied tokens far apart hold nearly all the mass
    x[7, :] = -20.0
    x[7, :10] = 9.0  # ten tied tokens at the top, the rest tied, far below
    x[8, 1000:] = float("-inf")  # removed tokens (an EOS-ban-like tail)
    x[9, TOP_P_PREFIX - 2 : TOP_P_PREFIX + 2] = 30.0  # the threshold at the prefix's edge, ties across it
    x = x.to(torch.bfloat16).float()  # bf16 values: many ties
    want = _kept_by_full_sort(x, 0, top_p)
    got = kept_mask(x, 0, top_p)
    assert torch.equal(got, want)
    counts = got.sum(-1)
    assert int(counts[:6].max()) <= TOP_P_PREFIX < int(counts[10:].min())  # both ways exercised
    assert int(counts[6]) == 3 and got[6, [3, 77_000, 150_000]].all() and int(counts[7]) == 10
    for k in (5, 2000):  # top-k first: the top-p threshold among its k values, as before
        assert torch.equal(kept_mask(x, k, top_p), _kept_by_full_sort(x, k, top_p))
    sorted_rows = []  # only the rows past the prefix are sorted whole
    real_sort = torch.sort
    monkeypatch.setattr(torch, "sort", lambda t, *a, **kw: sorted_rows.append(t.shape[0]) or real_sort(t, *a, **kw))
    assert torch.equal(kept_mask(x, 0, top_p), want) and sorted_rows == [int((counts > TOP_P_PREFIX - 1).sum())]
    assert torch.equal(kept_mask(x[:6], 0, top_p), want[:6]) and sorted_rows[1:] == []


# ---- the fused chunk functions (compiled on CUDA) equal the chunk loop ---------------------------------

def _fused_vs_loop(monkeypatch, logits, labels, temperature, g_logp, g_ent, chunk_size):
    import rlvr.algo.logprobs as lp

    out = {}
    for mode in ("never", "always"):
        monkeypatch.setattr(lp, "FUSED_ON", mode)
        x = logits.clone().requires_grad_(True)
        logp, ent = lp.logprobs_and_entropy(x, labels, chunk_size, True, temperature)
        loss = (logp * g_logp).sum() + ((ent * g_ent).sum() if g_ent is not None else 0.0)
        loss.backward()
        out[mode] = (logp.detach(), ent.detach(), x.grad)
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_ent_grad", [False, True])
def test_fused_chunk_functions_equal_the_chunk_loop(monkeypatch, temperature, with_ent_grad):
    g = torch.Generator().manual_seed(3)
    B, T, V = 3, 5, 37
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3
    logits[0, 1, 4] = float("-inf")  # a masked vocabulary entry
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[1, :2] = IGNORE_INDEX
    labels[0, 1] = (4 + 1 + int(labels[0, 1])) % V if int(labels[0, 1]) == 4 else labels[0, 1]  # not the masked one
    g_logp = torch.randn(B, T, generator=g, dtype=torch.float64)
    g_ent = torch.randn(B, T, generator=g, dtype=torch.float64) if with_ent_grad else None
    out = _fused_vs_loop(monkeypatch, logits, labels, temperature, g_logp, g_ent, chunk_size=4)
    for a, b in zip(out["never"], out["always"], strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), (a - b).abs().max()
    # against autograd through log_softmax (independent of both)
    x = logits.clone().requires_grad_(True)
    logq = torch.log_softmax(x / temperature, dim=-1)
    ref_lp = logq.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * (labels != IGNORE_INDEX)
    ref_ent = -(logq.exp() * logq.nan_to_num(neginf=0.0)).sum(-1)
    ((ref_lp * g_logp).sum() + ((ref_ent * g_ent).sum() if g_ent is not None else 0.0)).backward()
    assert torch.allclose(out["always"][0], ref_lp, atol=1e-10)
    assert torch.allclose(out["always"][1], ref_ent, atol=1e-10)
    assert torch.allclose(out["always"][2], x.grad, atol=1e-10)


def test_fused_chunk_functions_bf16_logits_give_bf16_gradients_close_to_fp32(monkeypatch):
    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(2, 6, 50, generator=g) * 2).to(torch.bfloat16)
    labels = torch.randint(0, 50, (2, 6), generator=g)
    out = _fused_vs_loop(monkeypatch, logits, labels, 1.0, torch.ones(2, 6), None, chunk_size=5)
    assert out["always"][2].dtype == torch.bfloat16 and out["always"][0].dtype == torch.float32
    assert torch.allclose(out["always"][0], out["never"][0], atol=1e-6)
    assert torch.allclose(out["always"][2].float(), out["never"][2].float(), atol=1e-2)


@pytest.mark.slow
def test_fused_chunk_functions_compiled_equal_eager():
    # what runs on CUDA, compiled here by inductor's CPU backend (needs a C compiler)
    import rlvr.algo.logprobs as lp

    g = torch.Generator().manual_seed(5)
    rows = torch.randn(7, 64, generator=g) * 3
    labels = torch.randint(0, 64, (7,), generator=g)
    labels[2] = IGNORE_INDEX
    fwd = torch.compile(lp._fused_forward, dynamic=True)
    bwd = torch.compile(lp._fused_backward, dynamic=True)
    a = lp._fused_forward(rows, labels, 0.8, torch.float32)
    b = fwd(rows, labels, 0.8, torch.float32)
    for u, v in zip(a, b, strict=True):
        assert torch.allclose(u, v, atol=1e-5)
    gl, ge = torch.randn(7, generator=g), torch.randn(7, generator=g)
    ga = lp._fused_backward(rows, labels, a[2], a[3], gl, ge, 0.8, torch.float32)
    gb = bwd(rows, labels, a[2], a[3], gl, ge, 0.8, torch.float32)
    assert torch.allclose(ga, gb, atol=1e-5)
