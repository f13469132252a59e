"""Padding-free packed learner forwards (rlvr.models.packed, algo.packing): the rows of a micro-batch in one
sequence with per-row position ids and a document-causal attention mask give the padded path's numbers."""

from __future__ import annotations

import pytest
import torch
from helpers.packing import assert_grads_close as _assert_grads_close
from helpers.packing import backward_scores
from helpers.packing import batch as _batch
from helpers.packing import grads as _grads
from helpers.packing import model as _model
from helpers.training import grpo_algo, shared_prefix_run
from torch.nn.attention.flex_attention import create_block_mask

import rlvr.models.packed as packed
from rlvr.models import score_tokens
from rlvr.models.packed import PackPlan, packed_causal, score_packed, segment_blocks, use_packing
from rlvr.models.tokenize import build_training_batch
from rlvr.train.batching import ForwardSpec, micro_batches
from rlvr.train.pg.objective import LossParts, Minibatch, StepStats, accumulate_gradients, batch_logprobs

# on CPU flex_attention runs eagerly, as intended there (rlvr.models.packed)
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.mark.parametrize(("lens", "block"), [([130, 5, 300, 1, 64, 200], 16), ([3, 4], 16), ([16, 16, 16], 16),
                                             ([17, 15, 40, 1, 1, 1, 33], 8), ([250], 128)])
def test_block_sparsity_built_from_lengths_equals_create_block_mask(lens, block):
    """The host-built BlockMask lists exactly the blocks torch's create_block_mask finds by evaluating the
    mask on the whole grid: partial and full, key side (forward) and query side (backward)."""
    n = sum(lens)
    doc = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    doc = torch.cat([doc, torch.full((-n % block,), -1)])
    ref = create_block_mask(lambda b, h, q, kv: (doc[q] == doc[kv]) & (kv <= q), 1, 1, n, n, device="cpu",
                            BLOCK_SIZE=block)  # rows packed one after the other, each causal
    am = (torch.arange(max(lens)).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)).long()
    got = PackPlan.build(am, am.bool(), "cpu", block=block).block_mask
    assert torch.equal(got.to_dense(), ref.to_dense())
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                     ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        a, b = getattr(got, num), getattr(ref, num)
        assert torch.equal(a, b), num
        for i, k in enumerate(a.reshape(-1).tolist()):  # the listed blocks (the rest is unused)
            assert torch.equal(getattr(got, idx)[0, 0, i, :k], getattr(ref, idx)[0, 0, i, :k]), (idx, i)
    assert segment_blocks([(x, r, True) for r, x in enumerate(lens)], block)[0].shape == (1, 1, -(-n // block))


@pytest.mark.parametrize(("seed", "block", "resp_len"), [(0, 8, (1, 20)), (1, 16, (1, 3)), (2, 8, (30, 40))])
def test_shared_prompt_block_sparsity_equals_create_block_mask(seed, block, resp_len):
    """The shared-prompt layout: each group's prompt once, its responses after it, seeing the prompt and
    themselves; the host-built blocks equal create_block_mask's from the mask itself."""
    batch = _batch(seed=seed, groups=3, per_group=3, resp_len=resp_len, truncated_row=True)
    plan = PackPlan.build(batch.attention_mask, batch.response_mask, "cpu", block=block, input_ids=batch.input_ids,
                          share=True)
    n = plan.tokens
    ref = create_block_mask(packed_causal(plan.grp, plan.own), 1, 1, n, n, device="cpu", BLOCK_SIZE=block)
    got = plan.block_mask
    assert torch.equal(got.to_dense(), ref.to_dense())
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                     ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        a, b = getattr(got, num), getattr(ref, num)
        assert torch.equal(a, b), num
        for i, k in enumerate(a.reshape(-1).tolist()):
            assert torch.equal(getattr(got, idx)[0, 0, i, :k], getattr(ref, idx)[0, 0, i, :k]), (idx, i)
    assert int(ref.full_kv_num_blocks.sum()) > 0 or resp_len[1] < block  # full blocks were compared too


@pytest.mark.parametrize(("arch", "kv_heads", "temperature", "share", "resp_len"),
                         [("qwen2", None, 1.0, False, (1, 20)), ("llama", 1, 0.7, False, (1, 20)),
                          ("qwen2", 2, 1.0, False, (1, 20)), ("qwen2", None, 1.0, True, (1, 20)),
                          ("llama", 1, 0.7, True, (1, 20)), ("qwen2", 2, 1.0, True, (1, 2))])
def test_packed_scores_and_gradients_equal_the_padded_forward(arch, kv_heads, temperature, share, resp_len):
    """Rows in random order, mixed lengths (one-token responses among them with resp_len (1, 2)), a row with
    no loss label; share: each group's prompt once, its responses attending to it."""
    model = _model(arch, kv_heads)
    batch = _batch(seed=1, resp_len=resp_len, truncated_row=True)
    m = batch.response_mask
    w = torch.randn(m.shape, generator=torch.Generator().manual_seed(0))

    def run(fn):
        return backward_scores(model, fn, w, m)

    ref, g_ref = run(lambda: score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask,
                                          with_entropy=True, temperature=temperature))
    plan = PackPlan.build(batch.attention_mask, m, "cpu", input_ids=batch.input_ids, share=share)
    lens = batch.attention_mask.sum(-1).tolist()
    if share:  # the prompts once (3 groups), each labelled row's response but its last token; no pad
        first = m.int().argmax(-1)
        prompts = {tuple(batch.input_ids[r, :int(first[r]) + 1].tolist()) for r in range(len(lens)) if m[r].any()}
        assert len(prompts) == 3
        assert plan.tokens == sum(len(p) for p in prompts) + sum(
            n - int(first[r]) - 1 for r, n in enumerate(lens) if m[r].any())
    else:
        assert plan.tokens == int(batch.attention_mask.sum()) < batch.input_ids.numel()  # no pad token packed
        # positions restart at 0 in every row (rotary attention within a row would not see a per-row shift,
        # but positions past the model's trained range would: checked here directly)
        assert plan.position_ids.tolist() == [[t for n in lens for t in range(n)]]
        assert plan.grp[:plan.tokens].tolist() == [r for r, n in enumerate(lens) for _ in range(n)]
    got, g_got = run(lambda: score_packed(model, batch.input_ids, batch.labels, plan, with_entropy=True,
                                          temperature=temperature))
    assert torch.allclose(got.logprobs, ref.logprobs * m, atol=1e-5)
    assert torch.allclose(got.entropy, ref.entropy * m, atol=1e-5)
    assert bool((got.logprobs[~m] == 0).all()) and bool((got.logprobs[m] < 0).all())
    _assert_grads_close(g_got, g_ref)


@pytest.mark.parametrize(("arch", "kv_heads", "share"), [("qwen2", None, False), ("llama", 1, False),
                                                          ("llama", 1, True)])
def test_the_flex_attention_path_gives_the_padded_logprobs(arch, kv_heads, share, monkeypatch):
    """No grad (old / reference logprobs): flex_attention itself runs (eagerly on CPU) with the BlockMask."""
    calls = []
    real = packed._eager_flex
    monkeypatch.setattr(packed, "_eager_flex", lambda: (calls.append(1), real())[1])
    model = _model(arch, kv_heads)
    batch = _batch(seed=2, groups=4, truncated_row=True)
    ref = batch_logprobs(model, batch, 0, temperature=0.8, micro_batch_tokens=60, packing=False)
    got = batch_logprobs(model, batch, 0, temperature=0.8, micro_batch_tokens=60, packing=True, shared_prefix=share)
    from rlvr.models.packed import row_prompts

    chunks = micro_batches(batch.attention_mask.sum(-1).tolist(), max_tokens=60, packed=True,
                           prompts=row_prompts(batch.input_ids, batch.response_mask) if share else None)
    assert len(chunks) > 1 and len(calls) == 2 * len(chunks)  # every layer of every micro-batch
    m = batch.response_mask
    assert torch.allclose(got, ref * m, atol=1e-5)
    assert bool((got[~m] == 0).all())


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_a_packed_minibatch_gives_the_padded_loss_gradient_and_statistics(shared_prefix):
    """accumulate_gradients with algo.packing=true vs false (the padded path with or without the shared
    prefix): several micro-batches by token budget, KL and entropy terms, sampler logprobs."""
    model = _model("llama", 1)
    batch = _batch(seed=3, groups=4, per_group=4, truncated_row=True)
    n = batch.input_ids.shape[0]
    adv = torch.randn(n, generator=torch.Generator().manual_seed(1))
    ref_logp = batch_logprobs(_model("llama", 1, seed=5), batch, 0, packing=False)
    out = {}
    for packing in (True, False):
        algo = grpo_algo(f"algo.packing={str(packing).lower()}", f"algo.shared_prefix={str(shared_prefix).lower()}")
        model.zero_grad()
        stats, ent = StepStats(), {}
        loss = accumulate_gradients(model, Minibatch(batch, adv, ref_logp=ref_logp), LossParts.from_algo(algo),
                                    ForwardSpec.of(algo, 0, micro_batch_tokens=70, temperature=0.9), norm_length=0,
                                    stats=stats, row_entropy=ent)
        out[packing] = loss, _grads(model), stats.means(), ent
    (l_p, g_p, s_p, e_p), (l_r, g_r, s_r, e_r) = out[True], out[False]
    assert l_p == pytest.approx(l_r, rel=1e-5, abs=1e-7) and l_r != 0
    _assert_grads_close(g_p, g_r)
    assert s_p.keys() == s_r.keys() and {"kl", "entropy", "logprob_diff"} <= s_p.keys()
    for k in s_r:
        assert s_p[k] == pytest.approx(s_r[k], rel=1e-5, abs=1e-6), k
    assert e_p.keys() == e_r.keys() and all(e_p[i] == pytest.approx(e_r[i], rel=1e-5, abs=1e-6) for i in e_r)


@pytest.mark.parametrize("share", [False, True])
def test_a_packed_step_does_no_pad_token_work(share):
    """FLOP count of a training micro-batch: the linear layers run on the real tokens only (share: each
    prompt once), the LM head on the response tokens only (the padded forward runs both on every padded
    position)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = _model("qwen2", None, layers=2)
    batch = _batch(seed=4, groups=2, per_group=4, resp_len=(1, 30))
    m = batch.response_mask
    b, T = batch.input_ids.shape
    real, resp = int(batch.attention_mask.sum()), int(m.sum())
    H, V = model.config.hidden_size, model.config.vocab_size
    head = model.get_output_embeddings().weight.numel()
    linear = sum(mod.weight.numel() for name, mod in model.named_modules()
                 if isinstance(mod, torch.nn.Linear) and name != "lm_head")

    def matmul_flops(fn):
        model.zero_grad()
        with FlopCounterMode(display=False) as fc:
            out = fn()
            ((out.logprobs + out.entropy) * m).sum().backward()
        counts = fc.get_flop_counts()["Global"]
        return sum(v for k, v in counts.items() if "mm" in str(k) and "attention" not in str(k))

    plan = PackPlan.build(batch.attention_mask, m, "cpu", input_ids=batch.input_ids, share=share)
    if share:  # the 2 prompts once, then every response but its last token
        first = m.int().argmax(-1).tolist()
        prompts = {tuple(batch.input_ids[r, :first[r] + 1].tolist()) for r in range(b)}
        real = sum(map(len, prompts)) + sum(int(batch.attention_mask[r].sum()) - first[r] - 1 for r in range(b))
        assert len(prompts) == 2 and plan.tokens == real
    got = matmul_flops(lambda: score_packed(model, batch.input_ids, batch.labels, plan, with_entropy=True))
    # forward 2 FLOPs per weight and token, backward twice that (input and weight gradients); the entropy's
    # row dot product E_p[x] (a bmm) 2 V per scored position, forward and backward
    assert got == 6 * (real * linear + resp * head) + 4 * resp * V
    pad = matmul_flops(lambda: score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask,
                                            with_entropy=True))
    assert pad == 6 * b * T * (linear + head) + 4 * b * T * V and real < b * T and H * V == head


def test_packing_resolves_by_device_and_refuses_what_it_cannot_pack():
    model = _model()
    assert use_packing(model, "auto") is False  # CPU: the padded (cascade) path
    assert use_packing(model, True) is True and use_packing(model, False) is False
    model.config.model_type = "gpt2"
    assert use_packing(model, "auto") is False
    with pytest.raises(ValueError, match="algo.packing=true cannot pack this model: model type 'gpt2'"):
        use_packing(model, True)


def test_a_flex_attention_that_does_not_compile_turns_packing_off_with_a_warning(monkeypatch):
    def broken():
        raise RuntimeError("inductor: no such backend\nmore lines")

    monkeypatch.setattr(packed, "_compiled_flex", broken)
    monkeypatch.setattr(packed, "_FLEX_STATE", {})
    with pytest.warns(RuntimeWarning, match=r"compiling flex_attention failed on cuda \(RuntimeError: inductor: "
                                            r"no such backend\); the learner runs padded rows"):
        assert packed.flex_ready("cuda", torch.bfloat16, 64, 14, 2) is False
    assert packed.flex_ready("cuda", torch.bfloat16, 64, 14, 2) is False  # probed once per process
    assert packed.flex_ready("cpu", torch.float32, 16, 2, 2) is True


def test_token_budget_counts_real_tokens_when_packed():
    lens = [10, 3, 3, 3, 9, 1]
    assert micro_batches(lens, max_tokens=20) == [range(0, 2), range(2, 4), range(4, 6)]  # padded: rows x longest
    assert micro_batches(lens, max_tokens=20, packed=True) == [range(0, 4), range(4, 6)]  # packed: the sum
    assert micro_batches([30, 2], max_tokens=20, packed=True) == [range(0, 1), range(1, 2)]
    # with the shared prompt a row whose prompt is in the range already costs its other tokens only
    lens = [10, 8, 7, 3, 9, 4]
    prompts = [("a", 6), ("a", 6), ("a", 6), ("b", 2), (None, 0), ("b", 2)]  # costs 10 2 1 3 | 9 4
    assert micro_batches(lens, max_tokens=20, packed=True, prompts=prompts) == [range(0, 4), range(4, 6)]
    assert micro_batches(lens, max_tokens=20, packed=True) == [range(0, 2), range(2, 5), range(5, 6)]


def test_the_shared_prompt_token_budget_is_the_packed_length():
    """Each micro-batch cut with the shared prompts' costs packs to at most the budget, the first ones to
    nearly all of it (a micro-batch's packed length is the cost micro_batches counted)."""
    from rlvr.models.packed import row_prompts

    batch = _batch(seed=5, groups=4, per_group=4, resp_len=(5, 30), truncated_row=True)
    lens = batch.attention_mask.sum(-1).tolist()
    prompts = row_prompts(batch.input_ids, batch.response_mask)
    chunks = micro_batches(lens, max_tokens=90, packed=True, prompts=prompts)
    sizes = [PackPlan.build(batch.attention_mask[c.start:c.stop], batch.response_mask[c.start:c.stop], "cpu",
                            input_ids=batch.input_ids[c.start:c.stop], share=True).tokens for c in chunks]
    assert len(chunks) > 2 and max(sizes) <= 90
    # the packed length is the counted cost (the row without a loss label, counted whole, is left out)
    for c, size in zip(chunks, sizes, strict=True):
        seen, cost = set(), 0
        for r in c:
            key, plen = prompts[r]
            cost += 0 if key is None else lens[r] - (plen if key in seen else 0)
            seen.add(key)
        assert size == cost


@pytest.mark.parametrize("shared", ["true", "false"])
def test_training_packed_equals_the_padded_path(tmp_path, shared, monkeypatch):
    """rlvr train, 3 steps, same seed: algo.packing=true gives the padded path's losses, gradient norms and
    entropies (with the shared prefix on or off there), and the sampler / learner logprobs agree."""
    import rlvr.train.pg.objective as obj

    calls = []
    real = obj.score_packed
    monkeypatch.setattr(obj, "score_packed", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    fast, fast_s = shared_prefix_run(tmp_path / "p", shared, "algo.packing=true", "algo.micro_batch_tokens=40",
                        monkeypatch=monkeypatch)
    assert calls  # the packed forward ran
    n = len(calls)
    slow, slow_s = shared_prefix_run(tmp_path / "r", shared, "algo.packing=false", "algo.micro_batch_tokens=40",
                        monkeypatch=monkeypatch)
    assert len(calls) == n  # and only with algo.packing=true
    assert [s["response"] for s in fast_s] == [s["response"] for s in slow_s]
    for f, s in zip(fast, slow, strict=True):
        assert f["tokens/generated"] == s["tokens/generated"] and f["reward/mean"] == s["reward/mean"]
        for k in ("loss", "grad_norm", "entropy"):
            assert f[k] == pytest.approx(s[k], rel=1e-4, abs=1e-6), k
        assert f["rollout/logprob_diff_max"] < 1e-4 and s["rollout/logprob_diff_max"] < 1e-4
        assert f["grad_norm"] > 1e-3


def test_the_shared_prompt_layout_groups_rows_by_their_whole_prompt():
    """Prompts 5 6 7 and 5 6 8 differ only in their last token (the input that predicts the first response
    token): two groups, and the plain forward's logprobs."""
    model = _model()
    batch = build_training_batch([[5, 6, 7], [5, 6, 7], [5, 6, 8], [5, 6, 8]], [[10, 11], [12, 13, 14], [15], [16, 17]],
                                 0)
    m = batch.response_mask
    plan = PackPlan.build(batch.attention_mask, m, "cpu", input_ids=batch.input_ids, share=True)
    lens = batch.attention_mask.sum(-1).tolist()
    assert plan.tokens == 2 * 3 + sum(n - 3 for n in lens)  # two prompts of 3 inputs once, then the rest of each row
    ref = score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask).logprobs.detach()
    got = score_packed(model, batch.input_ids, batch.labels, plan).logprobs.detach()
    assert torch.allclose(got, ref * m, atol=1e-5)
