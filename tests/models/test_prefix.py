"""Shared-prefix forward (rlvr.models.prefix, algo.shared_prefix, rollout.shared_prefix): each group's
prompt is run once, and the numbers equal the plain forward's up to float rounding."""

from __future__ import annotations

import random

import pytest
import torch
from helpers.training import shared_prefix_run

from rlvr.config import load_config
from rlvr.models import score_tokens
from rlvr.models.prefix import prefix_groups, score_shared_prefix
from rlvr.models.tiny import build_tiny_model
from rlvr.models.tokenize import build_training_batch
from rlvr.train.config import TrainConfig


def _grouped_batch(seed=0, groups=3, per_group=4, shuffle=True, resp_len=(1, 4)):
    """Prompts of 2..6 tokens, each with per_group responses of resp_len tokens, rows in random order."""
    rng = random.Random(seed)
    P, R = [], []
    for _ in range(groups):
        p = [rng.randrange(4, 90) for _ in range(rng.randrange(2, 7))]
        for _ in range(per_group):
            P.append(p)
            R.append([rng.randrange(4, 90) for _ in range(rng.randint(*resp_len))])
    order = list(range(len(P)))
    if shuffle:
        rng.shuffle(order)
    return build_training_batch([P[i] for i in order], [R[i] for i in order], 0), [P[i] for i in order]


def test_prefix_groups_finds_each_prompt_and_its_length():
    batch, prompts = _grouped_batch()
    g = prefix_groups(batch.input_ids, batch.response_mask, batch.attention_mask)
    assert g is not None and g.n_groups == 3
    for row, grp in enumerate(g.group_of_row.tolist()):
        assert prompts[int(g.rep[grp])] == prompts[row]  # rows of a group have the same prompt
        assert int(g.prefix_len[grp]) == len(prompts[row]) - 1  # inputs whose labels are prompt tokens
    assert sorted(g.group_of_row.tolist()) == [0] * 4 + [1] * 4 + [2] * 4
    # nothing shared: every prompt different -> None (score the rows whole)
    single, _ = _grouped_batch(groups=5, per_group=1)
    assert prefix_groups(single.input_ids, single.response_mask, single.attention_mask) is None


# (temperature, arch, KV heads, rows shuffled, cascade attention, response lengths, path): the cascade's
# branches, as chosen by default ("auto") or forced: contiguous equal groups with few own keys (G x T <=
# _STACK_OWN) take the stacked attention (one masked SDPA per group over the prefix and all G rows' own
# keys); suffixes of _ROWS_SDPA_FROM new tokens or more one fused SDPA per row over [gathered prefix, own
# keys] ("rows"); otherwise ("split") the grouped prefix matmul (contiguous groups) or the per-row gather
# (shuffled), with a broadcast own part up to 8 own keys and a matmul one beyond. GQA (1 KV head for 4
# query heads) groups query heads as repeat_kv does; use_cascade=False is the KV-cache copy path.
CASES = [(1.0, "qwen2", None, True, True, (1, 4), "auto"), (0.7, "qwen2", None, False, True, (1, 4), "auto"),
         (1.0, "llama", 1, False, True, (1, 4), "auto"), (1.0, "qwen2", 2, True, True, (1, 4), "auto"),
         (1.0, "qwen2", None, True, False, (1, 4), "auto"), (0.7, "llama", 1, False, False, (1, 4), "auto"),
         (1.0, "llama", 1, False, True, (9, 14), "auto"), (1.0, "qwen2", None, True, True, (9, 14), "auto"),
         (0.7, "llama", 1, False, True, (1, 4), "split"), (1.0, "qwen2", 2, False, True, (9, 14), "split"),
         (1.0, "llama", 1, False, True, (33, 40), "auto"), (0.7, "qwen2", 2, True, True, (33, 40), "auto"),
         (1.0, "llama", 1, True, True, (1, 14), "rows"), (1.0, "qwen2", None, False, True, (1, 4), "rows")]


@pytest.mark.parametrize(("temperature", "arch", "kv_heads", "shuffle", "cascade", "resp_len", "path"), CASES)
def test_shared_prefix_scores_and_gradients_equal_the_plain_forward(temperature, arch, kv_heads, shuffle, cascade,
                                                                    resp_len, path, monkeypatch):
    import rlvr.models.cascade as cas

    calls, ran = [], []
    real, real_stacked, real_rows = cas.cascade_attention, cas._stacked, cas._rows_sdpa
    monkeypatch.setattr(cas, "cascade_attention", lambda *a, **k: (calls.append(k["rlvr_prefix"].group_size), real(*a, **k))[1])
    monkeypatch.setattr(cas, "_stacked", lambda *a, **k: (ran.append("stacked"), real_stacked(*a, **k))[1])
    monkeypatch.setattr(cas, "_rows_sdpa", lambda *a, **k: (ran.append("rows"), real_rows(*a, **k))[1])
    if path != "auto":
        monkeypatch.setattr(cas, "_STACK_OWN", 0)
        monkeypatch.setattr(cas, "_ROWS_SDPA_FROM", 1 if path == "rows" else 10**9)
    heads = 4 if kv_heads else 2
    model, _ = build_tiny_model(hidden_size=32, num_layers=2, num_heads=heads, num_kv_heads=kv_heads, arch=arch, seed=0)
    batch, _ = _grouped_batch(seed=1, shuffle=shuffle, resp_len=resp_len)
    g = prefix_groups(batch.input_ids, batch.response_mask, batch.attention_mask)
    w = torch.randn(batch.labels.shape, generator=torch.Generator().manual_seed(0))

    def run(fn):
        model.zero_grad()
        out = fn()
        (out.logprobs * w + 0.3 * w * out.entropy).sum().backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters()}

    ref, g_ref = run(lambda: score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask,
                                          with_entropy=True, temperature=temperature))
    got, g_got = run(lambda: score_shared_prefix(model, batch.input_ids, batch.labels, batch.attention_mask, g,
                                                 with_entropy=True, temperature=temperature, use_cascade=cascade))
    # the cascade ran once per layer, grouped (G=4) for contiguous groups, gathered per row otherwise
    assert calls == ([0 if shuffle else 4] * 2 if cascade else [])
    if path == "auto":  # which branch the defaults chose, per layer
        want = ("rows" if resp_len[0] >= cas._ROWS_SDPA_FROM else
                "stacked" if not shuffle and 4 * resp_len[1] <= cas._STACK_OWN else None)
        assert ran == ([want] * 2 if cascade and want else [])
    else:
        assert ran == (["rows"] * 2 if path == "rows" else [])
    assert torch.allclose(got.logprobs, ref.logprobs, atol=1e-5)
    assert torch.allclose(got.entropy, ref.entropy, atol=1e-5)
    assert bool((got.logprobs[batch.attention_mask == 0] == 0).all())
    for n in g_ref:  # every parameter, the prompt's through the shared K/V included; float32 rounding
        # measured at <= 8e-7 of the tensor's largest entry over 4 seeds
        assert float((g_got[n] - g_ref[n]).abs().max()) <= 1e-5 * float(g_ref[n].abs().max()), n
    assert g_ref["model.embed_tokens.weight"].abs().sum() > 0


@pytest.mark.parametrize("model_type", ["qwen3", "mistral"])
def test_cascade_on_other_decoders_equals_the_plain_forward(model_type):
    """Qwen3 (q/k norms) and Mistral from transformers' own configs: the cascade runs them (supported) and
    the shared-prefix scores and gradients equal the plain forward; with an active sliding window the
    model is not supported (the copy path runs it)."""
    import transformers

    from rlvr.models.cascade import supported

    name = {"qwen3": "Qwen3", "mistral": "Mistral"}[model_type]
    cfg = getattr(transformers, f"{name}Config")(vocab_size=100, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 head_dim=8, max_position_embeddings=64, sliding_window=None)
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForCausalLM")(cfg)
    assert supported(model)
    batch, _ = _grouped_batch(seed=2, shuffle=False)
    g = prefix_groups(batch.input_ids, batch.response_mask, batch.attention_mask)

    def run(shared):
        model.zero_grad()
        args = (model, batch.input_ids, batch.labels, batch.attention_mask)
        out = score_shared_prefix(*args, g) if shared else score_tokens(*args)
        out.logprobs.sum().backward()
        return out.logprobs.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}

    (ref, g_ref), (got, g_got) = run(False), run(True)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for k in g_ref:
        assert float((g_got[k] - g_ref[k]).abs().max()) <= 1e-5 * float(g_ref[k].abs().max()) + 1e-8, k
    cfg.sliding_window, cfg.use_sliding_window = 4, True
    assert not supported(model)


@pytest.mark.parametrize("cascade", [True, False])
def test_shared_prefix_with_one_token_responses(cascade):
    """Every response one token: the whole score comes from the prefix forward (no suffix forward);
    mixed with longer ones: rows whose suffix is empty sit beside rows that have one."""
    model, _ = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=4)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    for resp_len in ((1, 1, 1), (1, 3, 2)):
        P = [p for p in prompts for _ in range(3)]
        R = [[20 + k] * resp_len[k % 3] for k in range(9)]
        batch = build_training_batch(P, R, 0)
        g = prefix_groups(batch.input_ids, batch.response_mask, batch.attention_mask)
        assert g is not None and g.n_groups == 3

        def run(shared, batch=batch, g=g):
            model.zero_grad()
            args = (model, batch.input_ids, batch.labels, batch.attention_mask)
            out = score_shared_prefix(*args, g, use_cascade=cascade) if shared else score_tokens(*args)
            out.logprobs.sum().backward()
            return out.logprobs.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}

        (ref, g_ref), (got, g_got) = run(False), run(True)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        for k in g_ref:
            torch.testing.assert_close(g_got[k], g_ref[k], atol=1e-5, rtol=0)
        assert bool((got[batch.response_mask] < 0).all())  # every response token scored


@pytest.mark.parametrize("cascade", [True, False])
@pytest.mark.parametrize(("top_k", "top_p"), [(20, 0.6), (0, 0.3)])
def test_shared_prefix_scores_the_truncated_distribution_like_the_plain_forward(cascade, top_k, top_p):
    """sampling.top_k / top_p: the shared-prefix forward (its three parts: prompt positions, first response
    token, suffix) scores the truncated pi_K exactly as the plain forward does, values and gradients."""
    from rlvr.algo import TRUNCATED_LOGPROB, Truncation

    model, _ = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=0)
    batch, _ = _grouped_batch(seed=3, shuffle=True)
    g = prefix_groups(batch.input_ids, batch.response_mask, batch.attention_mask)
    tr = Truncation(top_k, top_p)
    w = torch.randn(batch.labels.shape, generator=torch.Generator().manual_seed(1))

    def run(shared):
        model.zero_grad()
        args = (model, batch.input_ids, batch.labels, batch.attention_mask)
        kw = {"with_entropy": True, "temperature": 0.7, "truncation": tr}
        out = score_shared_prefix(*args, g, use_cascade=cascade, **kw) if shared else score_tokens(*args, **kw)
        (out.logprobs * w + 0.3 * w * out.entropy).sum().backward()
        return out, {k: p.grad.clone() for k, p in model.named_parameters()}

    (ref, g_ref), (got, g_got) = run(False), run(True)
    torch.testing.assert_close(got.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropy, ref.entropy, atol=1e-5, rtol=0)
    for k in g_ref:
        assert float((g_got[k] - g_ref[k]).abs().max()) <= 1e-5 * float(g_ref[k].abs().max()) + 1e-8, k
    # the truncation was real: some labels fell outside the kept set (the floor), the others score higher
    # than under the full softmax (renormalized over less mass)
    full = score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask, temperature=0.7).logprobs.detach()
    real = batch.attention_mask.bool()
    floor = real & (ref.logprobs == TRUNCATED_LOGPROB)
    assert floor.any() and bool((ref.logprobs[real & ~floor] > full[real & ~floor]).all())


def test_shared_prefix_falls_back_to_whole_rows_under_activation_checkpointing():
    from rlvr.models.loading import enable_gradient_checkpointing
    from rlvr.models.prefix import score_rows

    model, _ = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=0)
    batch, _ = _grouped_batch(seed=2)
    plain = score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask).logprobs
    enable_gradient_checkpointing(model)  # its training forward builds no KV cache
    model.train()
    out = score_rows(model, batch.input_ids, batch.labels, batch.attention_mask, batch.response_mask,
                     shared_prefix=True)
    out.logprobs.sum().backward()
    assert torch.allclose(out.logprobs, plain, atol=1e-5)


@pytest.mark.parametrize("extra", [(), ("algo.num_minibatches=2", "algo.epochs_per_rollout_batch=2")])
def test_training_with_shared_prefix_equals_the_plain_path(tmp_path, extra, monkeypatch):
    """Same seed, 3 steps: the same sampled responses, and losses, gradient norms, entropies and
    sampler-vs-learner logprob gaps within float tolerance. The second case has shuffled minibatches
    (groups split across micro-batches) and the separate old-logprob forward."""
    fast, fast_s = shared_prefix_run(tmp_path, "true", *extra, monkeypatch=monkeypatch)
    slow, slow_s = shared_prefix_run(tmp_path, "false", *extra, monkeypatch=monkeypatch)
    assert [s["response"] for s in fast_s] == [s["response"] for s in slow_s]
    for f, s in zip(fast, slow, strict=True):
        assert f["tokens/generated"] == s["tokens/generated"] and f["reward/mean"] == s["reward/mean"]
        for k in ("loss", "grad_norm", "entropy"):
            assert f[k] == pytest.approx(s[k], rel=1e-4, abs=1e-6), k
        assert f["rollout/logprob_diff_max"] < 1e-4 and s["rollout/logprob_diff_max"] < 1e-4
        assert f["grad_norm"] > 1e-3  # a real gradient was compared


@pytest.mark.parametrize(("arch", "kv_heads"), [("qwen2", None), ("llama", 1)])
def test_sampler_prefills_each_prompt_once_and_samples_the_same_tokens(arch, kv_heads):
    from rlvr.rollout import SamplingSpec
    from rlvr.rollout.hf_generator import HFGenerator

    model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=4 if kv_heads else 2, num_kv_heads=kv_heads,
                                  arch=arch, seed=3)
    prompts = ["12+3=", "7+8+9=", "1="]
    spec = SamplingSpec(n=4, max_tokens=6, seed=5, temperature=1.0)
    out = {}
    for shared in (True, False):
        shapes: list[tuple] = []
        h = model.register_forward_pre_hook(lambda _m, a, k, shapes=shapes: shapes.append(tuple(k["input_ids"].shape)),
                                            with_kwargs=True)
        try:
            out[shared] = HFGenerator(model, tok, batch_size=12, shared_prefix=shared).generate(prompts, spec)
        finally:
            h.remove()
        assert shapes[0] == ((3, 6) if shared else (12, 6))  # the prompt forward: 3 prompts (or 12 rows) x 6
    assert [r.response_ids for r in out[True]] == [r.response_ids for r in out[False]]
    for a, b in zip(out[True], out[False], strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert len({tuple(r.response_ids) for r in out[True]}) > 3  # samples of a prompt differ


def test_a_minibatch_split_in_two_with_global_normalizers_gives_the_same_gradient_with_shared_prefix():
    """What data-parallel learners (rlvr.distributed.dp) do: each half of a minibatch, shuffled so
    groups are cut across halves, backpropagated with the whole minibatch's normalizers; the sum
    equals one backward over the whole minibatch, with the shared-prefix forward too."""
    from rlvr.algo import loss_normalizers
    from rlvr.rollout import HFGenerator, SamplingSpec, rollouts_to_batch
    from rlvr.train.batching import ForwardSpec
    from rlvr.train.pg.objective import LossParts, Minibatch, accumulate_gradients
    from rlvr.train.pg.recipes import get_recipe

    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=0)
    ros = HFGenerator(model, tok, batch_size=16).generate(["1+2=", "3+4=", "5+6=", "7+8="],
                                                          SamplingSpec(n=4, max_tokens=4, seed=1))
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(3))[:8]
    batch = rollouts_to_batch(ros, tok.pad_token_id).rows(perm)
    adv = torch.randn(16, generator=torch.Generator().manual_seed(4))[perm]
    norm = loss_normalizers(batch.response_mask)
    algo = load_config(TrainConfig, None, ["algo.kl_coef=0"], base=get_recipe("grpo")).algo
    assert algo.shared_prefix  # the default

    def grads(parts):
        model.zero_grad()
        for idx in parts:
            accumulate_gradients(model, Minibatch(batch.rows(idx), adv[idx]), LossParts.from_algo(algo),
                                 ForwardSpec.of(algo, 8), norm_length=0, normalizers=norm)
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    whole, halves = grads([torch.arange(8)]), grads([torch.arange(4), torch.arange(4, 8)])
    scale = max(float(g.abs().max()) for g in whole.values())
    assert scale > 1e-3  # a real gradient
    for k in whole:
        torch.testing.assert_close(halves[k], whole[k], rtol=0, atol=1e-6 * scale)
    one_half = grads([torch.arange(4)])  # a mutant that forgets the other half is far off
    assert max(float((one_half[k] - whole[k]).abs().max()) for k in whole) > 1e-3 * scale


def test_cascade_in_bfloat16_is_as_close_to_float32_as_the_plain_forward():
    """bf16 (the GPU dtype): the shared-prefix scores are no further from the float32 scores than the plain
    bf16 forward's (its own part is summed in float32, as a matmul accumulates)."""
    model, _ = build_tiny_model(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
    batch, _ = _grouped_batch(seed=1, shuffle=False)
    g = prefix_groups(batch.input_ids, batch.response_mask, batch.attention_mask)
    args = (batch.input_ids, batch.labels, batch.attention_mask)
    with torch.no_grad():
        ref = score_tokens(model, *args).logprobs
        model = model.to(torch.bfloat16)
        plain = score_tokens(model, *args).logprobs
        shared = score_shared_prefix(model, *args, g).logprobs
    real = batch.attention_mask.bool()
    err_plain = float((plain - ref)[real].abs().max())
    err_shared = float((shared - ref)[real].abs().max())
    assert 0 < err_plain < 0.05  # bf16 really rounds, and not absurdly
    assert err_shared <= 1.5 * err_plain, (err_shared, err_plain)


def test_prompts_that_differ_only_in_their_last_token_are_not_shared():
    """A group is the rows whose whole prompt agrees, its last token (input S, which predicts the first
    response token) included: prompts 5 6 7 and 5 6 8 are two groups, and their scores are the plain ones."""
    model, _ = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=0)
    batch = build_training_batch([[5, 6, 7], [5, 6, 7], [5, 6, 8], [5, 6, 8]], [[10, 11], [12, 13, 14], [15], [16, 17]],
                                 0)
    g = prefix_groups(batch.input_ids, batch.response_mask, batch.attention_mask)
    assert g is not None and g.group_of_row.tolist() == [0, 0, 1, 1]
    m = batch.response_mask
    ref = score_tokens(model, batch.input_ids, batch.labels, batch.attention_mask).logprobs.detach()
    for cascade in (True, False):
        got = score_shared_prefix(model, batch.input_ids, batch.labels, batch.attention_mask, g,
                                  use_cascade=cascade).logprobs.detach()
        assert torch.allclose(got * m, ref * m, atol=1e-5), cascade
