"""algo.packing=varlen (rlvr.models.packed.Varlen, varlen_attention, varlen_ready): the packed sequence as a
variable-length batch for FlashAttention's kernel, each response's key sequence its group's prompt (copied) then its
own tokens, causal with the diagonal at the bottom right. On the CPU the kernel is varlen_reference (SDPA one
sequence at a time); on CUDA torch's varlen_attn, whose glue is checked here with stand-ins of its two signatures,
and whose numbers the probe holds to the mask before the first packed forward (a top-left kernel is refused)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from helpers.packing import assert_grads_close as _assert_grads_close
from helpers.packing import backward_scores
from helpers.packing import batch as _batch
from helpers.packing import model as _model
from helpers.training import shared_prefix_run

import rlvr.models.packed as packed
from rlvr.models import score_tokens
from rlvr.models.packed import PackPlan, Varlen, score_packed, use_packing, use_varlen, varlen_reference

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture()
def kernel_calls(monkeypatch):
    """The CPU's kernel (varlen_reference) chosen afresh, its calls counted."""
    calls = []

    def counted(*a):
        calls.append(a[0].shape[0])
        return varlen_reference(*a)

    monkeypatch.setattr(packed, "_VARLEN_STATE", {})
    monkeypatch.setattr(packed, "varlen_reference", counted)
    return calls


def test_the_layout_as_sequences_by_hand():
    # group 0: prompt of 3, suffixes of 2 and 1; group 1: prompt of 2, suffix of 4 (positions 0..11 packed)
    segs = [(3, 0, True), (2, 0, False), (1, 0, False), (2, 1, True), (4, 1, False)]
    vl = Varlen.build(segs, "cpu")
    assert vl.cu_q.tolist() == [0, 3, 5, 6, 8, 12]  # the packed tokens as they are
    assert vl.cu_k.tolist() == [0, 3, 8, 12, 14, 20]  # 3 | 3+2 | 3+1 | 2 | 2+4
    assert vl.kv_gather.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 7, 6, 7, 8, 9, 10, 11]
    assert (vl.max_q, vl.max_k) == (4, 6) and vl.cu_q.dtype == torch.int32
    plain = Varlen.build([(5, 0, True), (3, 1, True)], "cpu")  # plain packing: every row its own keys
    assert plain.kv_gather is None and plain.cu_k.tolist() == plain.cu_q.tolist() == [0, 5, 8]


@pytest.mark.parametrize(("arch", "kv_heads", "share", "resp_len"),
                         [("qwen2", None, True, (1, 20)), ("llama", 1, True, (1, 20)), ("qwen2", 2, False, (1, 20)),
                          ("qwen2", 2, True, (1, 2))])
def test_varlen_scores_and_gradients_equal_the_padded_forward(arch, kv_heads, share, resp_len, kernel_calls):
    """Rows in random order, a row without a loss label, one-token responses (resp_len (1, 2)): logprobs,
    entropies and every parameter's gradient as the padded forward's, through the key copies' backward."""
    assert packed.varlen_ready("cpu", torch.float32, 16, 2, 2)
    kernel_calls.clear()  # (the probe's)
    model = _model(arch, kv_heads)
    batch = _batch(seed=3, resp_len=resp_len, truncated_row=True)
    m = batch.response_mask
    w = torch.randn(m.shape, generator=torch.Generator().manual_seed(1))

    def run(fn):
        return backward_scores(model, fn, w, m)

    ref, g_ref = run(lambda: score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask,
                                          with_entropy=True))
    plan = PackPlan.build(batch.attention_mask, m, "cpu", input_ids=batch.input_ids, share=share, varlen=True)
    assert (plan.varlen.kv_gather is not None) == share
    got, g_got = run(lambda: score_packed(model, batch.input_ids, batch.labels, plan, with_entropy=True))
    assert kernel_calls == [plan.tokens] * model.config.num_hidden_layers  # the varlen kernel ran, every layer
    assert torch.allclose(got.logprobs, ref.logprobs * m, atol=1e-5)
    assert torch.allclose(got.entropy, ref.entropy * m, atol=1e-5)
    _assert_grads_close(g_got, g_ref)


def _top_left(q, k, v, cu_q, cu_k, max_q, max_k, scale):
    """A kernel that reads the causal diagonal from the top left (query j sees keys 0..j): wrong for a response,
    whose queries come after its prompt's keys."""
    out = []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(cq[:-1], cq[1:], ck[:-1], ck[1:], strict=True):
        mask = torch.ones((q1 - q0, k1 - k0), dtype=torch.bool).tril_()
        out.append(torch.nn.functional.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1), attn_mask=mask,
            scale=scale, enable_gqa=q.shape[1] != k.shape[1]).transpose(0, 1))
    return torch.cat(out)


def test_the_probe_refuses_a_kernel_that_reads_the_diagonal_top_left(monkeypatch):
    monkeypatch.setattr(packed, "_VARLEN_STATE", {})
    with pytest.warns(RuntimeWarning, match=r"algo.packing=varlen: the variable-length attention kernel failed its "
                                            r"check on cpu \(ValueError: its shared-prompt layout differs from the "
                                            r"mask by [0-9.]+ .*; the packed forward uses flex_attention"):
        assert packed.varlen_ready("cpu", torch.float32, 16, 4, 2, kernel=_top_left) is False
    assert packed.varlen_ready("cpu", torch.float32, 16, 4, 2) is False  # probed once per process
    monkeypatch.setattr(packed, "_VARLEN_STATE", {})
    assert packed.varlen_ready("cpu", torch.float32, 16, 4, 2) is True  # the reference passes its own check


def test_a_kernel_that_fails_leaves_packing_to_flex_attention(monkeypatch):
    def no_fp32(*a):
        raise RuntimeError("FlashAttention only supports fp16 and bf16 data type")

    monkeypatch.setattr(packed, "_VARLEN_STATE", {})
    monkeypatch.setattr(packed, "varlen_reference", no_fp32)
    model = _model()
    with pytest.warns(RuntimeWarning, match="failed its check on cpu .*only supports fp16 and bf16"):
        assert use_varlen(model, "varlen") is False
    assert use_packing(model, "varlen") is True  # packed all the same, by flex_attention (the dense mask on CPU)
    assert use_varlen(model, True) is False and use_varlen(model, "auto") is False
    model.config.model_type = "gpt2"
    with pytest.raises(ValueError, match="algo.packing=varlen cannot pack this model: model type 'gpt2'"):
        use_packing(model, "varlen")


def _fake_varlen(monkeypatch, signature: str):
    """torch.nn.attention.varlen.varlen_attn replaced by a stand-in with torch 2.10's signature (is_causal) or
    2.11's (window_size, scale, enable_gqa), recording what it was given."""
    seen = {}
    if signature == "2.10":
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False, return_aux=None):
            seen.update(is_causal=is_causal)
            return varlen_reference(query, key.repeat_interleave(query.shape[1] // key.shape[1], 1),
                                    value.repeat_interleave(query.shape[1] // key.shape[1], 1), cu_seq_q, cu_seq_k,
                                    max_q, max_k, query.shape[-1] ** -0.5)
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1), enable_gqa=False):
            seen.update(window_size=window_size, scale=scale, enable_gqa=enable_gqa)
            assert window_size == (-1, 0)  # causal
            return varlen_reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale)
    mod = types.ModuleType("torch.nn.attention.varlen")
    mod.varlen_attn = varlen_attn
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", mod)
    return seen


@pytest.mark.parametrize("signature", ["2.10", "2.11"])
def test_torch_varlen_attn_is_called_causal_whatever_its_signature(monkeypatch, signature):
    seen = _fake_varlen(monkeypatch, signature)
    monkeypatch.setattr(packed, "_VARLEN_STATE", {})
    kernel = packed._torch_varlen()
    assert packed.varlen_ready("cpu", torch.float32, 16, 4, 2, kernel=kernel)  # grouped-query heads (4 over 2)
    if signature == "2.10":
        assert seen == {"is_causal": True}
        with pytest.raises(ValueError, match="takes no scale"):  # a model with another scale cannot use it
            q = torch.randn(4, 2, 16)
            kernel(q, q, q, torch.tensor([0, 4]), torch.tensor([0, 4]), 4, 4, 0.3)
    else:
        assert seen == {"window_size": (-1, 0), "scale": 16 ** -0.5, "enable_gqa": True}


def test_training_with_varlen_equals_the_padded_path(tmp_path, monkeypatch, kernel_calls):
    """rlvr train algo.packing=varlen, 3 steps: the padded path's losses, gradient norms and entropies, the
    varlen kernel running the learner's forwards."""
    fast, fast_s = shared_prefix_run(tmp_path / "v", "true", "algo.packing=varlen", "algo.micro_batch_tokens=40",
                                     monkeypatch=monkeypatch)
    assert len(kernel_calls) > 2  # the probe's 2 layouts, then the learner's forwards
    slow, slow_s = shared_prefix_run(tmp_path / "r", "true", "algo.packing=false", "algo.micro_batch_tokens=40",
                                     monkeypatch=monkeypatch)
    assert [s["response"] for s in fast_s] == [s["response"] for s in slow_s]
    for f, s in zip(fast, slow, strict=True):
        for k in ("loss", "grad_norm", "entropy"):
            assert f[k] == pytest.approx(s[k], rel=1e-4, abs=1e-6), k
        assert f["grad_norm"] > 1e-3
