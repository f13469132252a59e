"""bf16 training with float32 master weights (rlvr.train.precision), the fp32 gradient norm of
clip_and_step, and the model-build switches (gradient checkpointing, attention kernel)."""

from types import SimpleNamespace

import pytest
import torch

from rlvr.models import build_tiny_model
from rlvr.train.config import ModelConfig, OptimConfig
from rlvr.train.optimizer import clip_and_step, optimizer_from_config
from rlvr.train.policy import build_policy, policy_from_config
from rlvr.train.precision import MasterWeightAdamW

SMALL = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def _batch(tok, texts=("12+345=357", "9+9=18", "100+1=101")):
    """(B, T) ids of a few arithmetic strings, right-padded with -100 labels on the padding."""
    rows = [tok(t)["input_ids"] for t in texts]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), tok.pad_token_id)
    labels = torch.full((len(rows), T), -100)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(r)] = torch.tensor(r)
    return ids, labels


def _loss(model, ids, labels):
    return model(input_ids=ids, labels=labels, use_cache=False).loss


def _train(model, opt, sched, ids, labels, steps, grad_clip=1.0):
    for _ in range(steps):
        _loss(model, ids, labels).backward()
        clip_and_step(model, opt, sched, grad_clip)


# ------------------------------------------------------------------- (a) float32: nothing changes


def test_fp32_model_gets_torch_adamw_with_unchanged_numbers():
    ocfg = OptimConfig(lr=1e-3, weight_decay=0.1, warmup_steps=2, schedule="cosine")
    runs = {}
    for mw in ("float32", "same"):
        model, tok = build_tiny_model(**SMALL, seed=3)
        model.train()
        opt, sched = optimizer_from_config(model, ocfg, total_steps=6, master_weights=mw)
        # float32 parameters: master weights would be the parameters themselves, so torch's AdamW.
        assert type(opt) is torch.optim.AdamW
        ids, labels = _batch(tok)
        _train(model, opt, sched, ids, labels, steps=4)
        runs[mw] = [p.detach().clone() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(runs["float32"], runs["same"], strict=True))


def test_master_adamw_on_float32_params_equals_torch_adamw_bitwise():
    # The update is written with torch's single-tensor AdamW operations in the same order, so on
    # float32 parameters (updated in place, no master) the numbers are identical.
    torch.manual_seed(0)
    init = [torch.randn(7, 5), torch.randn(11)]
    grads = [[torch.randn_like(t) for t in init] for _ in range(6)]
    ours = [torch.nn.Parameter(t.clone()) for t in init]
    ref = [torch.nn.Parameter(t.clone()) for t in init]
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05)
    o1 = MasterWeightAdamW(ours, **kw)
    o2 = torch.optim.AdamW(ref, foreach=False, **kw)
    for g in grads:
        for p, q, gi in zip(ours, ref, g, strict=True):
            p.grad, q.grad = gi.clone(), gi.clone()
        o1.step()
        o2.step()
    for p, q in zip(ours, ref, strict=True):
        assert torch.equal(p, q)
    assert "master" not in o1.state[ours[0]]  # a float32 parameter is its own master


def test_bf16_masters_follow_fp32_adamw_exactly_and_params_are_their_rounding():
    # bf16 parameters and bf16 gradients; the reference is torch's AdamW on float32 copies of the
    # same starting values fed the same gradients (bf16 -> fp32 is exact). The masters must be
    # that float32 trajectory, and every bf16 parameter its master rounded once.
    torch.manual_seed(1)
    init = [torch.randn(16, 8).to(torch.bfloat16), torch.randn(8).to(torch.bfloat16)]
    params = [torch.nn.Parameter(t.clone()) for t in init]
    ref = [torch.nn.Parameter(t.float()) for t in init]
    opt = MasterWeightAdamW(params, lr=1e-3, weight_decay=0.01)
    ref_opt = torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.01, foreach=False)
    for _ in range(5):
        for p, q in zip(params, ref, strict=True):
            g = torch.randn(p.shape).to(torch.bfloat16)
            p.grad, q.grad = g, g.float()
        opt.step()
        ref_opt.step()
    for p, q, m in zip(params, ref, opt.master_params(), strict=True):
        assert m.dtype == torch.float32 and p.dtype == torch.bfloat16
        assert torch.equal(m, q)
        assert torch.equal(p, q.to(torch.bfloat16))


# -------------------------------------------------------- (b) small updates are not lost to bf16


def test_tiny_lr_steps_vanish_in_pure_bf16_but_accumulate_in_masters():
    # One weight w = 1.0 (bf16), gradient 1.0 every step, lr 1e-3, no decay. With a constant
    # gradient Adam's bias-corrected moments are m = 1 and v = 1, so each step moves w by
    # lr * 1 / (1 + eps) = 1e-3.
    # bf16 below 1.0 is spaced 2**-8 = 0.00390625: 1 - 1e-3 = 0.999 is nearer 1.0 (0.001 away)
    # than 0.99609375 (0.0029 away), so pure-bf16 AdamW rounds every step back to 1.0.
    # With a float32 master: after 50 steps master = 1 - 50e-3 = 0.95, and the bf16 parameter is
    # its rounding, 243 * 2**-8 = 0.94921875 (0.95 / 2**-8 = 243.2).
    steps, lr = 50, 1e-3
    pure = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    mixed = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    opt_pure = torch.optim.AdamW([pure], lr=lr, weight_decay=0.0, foreach=False)
    opt_mixed = MasterWeightAdamW([mixed], lr=lr, weight_decay=0.0)
    for _ in range(steps):
        pure.grad = torch.ones(1, dtype=torch.bfloat16)
        mixed.grad = torch.ones(1, dtype=torch.bfloat16)
        opt_pure.step()
        opt_mixed.step()
    assert pure.item() == 1.0
    master = opt_mixed.state[mixed]["master"]
    assert master.item() == pytest.approx(0.95, abs=1e-5)
    assert mixed.item() == 0.94921875


def test_bf16_tiny_model_with_masters_tracks_fp32_training_where_pure_bf16_stalls():
    # The same fixed batch, 40 steps of lr 1e-4, three copies of one tiny Qwen2 model: float32,
    # bf16 with float32 masters, pure bf16. The RMSNorm weights start at exactly 1.0, where bf16
    # steps are 2**-8 = 0.0039 (below 1) and 2**-7 (above): a single update of ~1e-4 always rounds
    # back, so pure bf16 never moves them, while the masters accumulate 40 updates of ~1e-4 (up
    # to 4e-3, past the rounding midpoint 2**-9 = 0.00195) like float32 training does.
    steps = 40
    ocfg = OptimConfig(lr=1e-4, grad_clip=0.0)
    models = {}
    for name, dtype, mw in (("fp32", "float32", "same"), ("master", "bfloat16", "float32"), ("pure", "bfloat16", "same")):
        model, tok = build_tiny_model(**SMALL, seed=5, dtype=dtype)
        model.train()
        opt, sched = optimizer_from_config(model, ocfg, total_steps=steps, master_weights=mw)
        assert isinstance(opt, MasterWeightAdamW) == (name == "master")
        ids, labels = _batch(tok)
        _train(model, opt, sched, ids, labels, steps, grad_clip=0.0)
        models[name] = dict(model.named_parameters())
    norms = [n for n in models["fp32"] if "norm" in n]
    assert norms

    def norm_weights(name):  # all RMSNorm weights, as float32
        return torch.cat([models[name][n].detach().float().flatten() for n in norms])

    def dist_to_fp32(name):  # relative L2 distance of all weights from the float32-trained ones
        ref = models["fp32"]
        num = sum(float((models[name][n].detach().float() - p.detach()).pow(2).sum()) for n, p in ref.items())
        den = sum(float(p.detach().pow(2).sum()) for p in ref.values())
        return (num / den) ** 0.5

    # Where float32 training took a norm weight past the rounding midpoint, its bf16 rounding is no
    # longer 1.0; measured (seed 5): 58% of the 160 norm weights. The masters' bf16 parameters
    # are exactly those roundings (100% agree, 58% moved); pure bf16 moved 0%. Distance of all
    # weights from the float32-trained ones: masters 0.0029 (rounding of the same trajectory),
    # pure bf16 0.0153 (a different, partly stalled trajectory).
    fp32_rounded = norm_weights("fp32").to(torch.bfloat16).float()
    should_move = float((fp32_rounded != 1.0).float().mean())
    assert should_move > 0.3
    master = norm_weights("master")
    assert float((master == fp32_rounded).float().mean()) > 0.97
    assert float((master != 1.0).float().mean()) == pytest.approx(should_move, abs=0.03)
    assert float((norm_weights("pure") != 1.0).float().mean()) == 0.0
    assert dist_to_fp32("master") < 0.3 * dist_to_fp32("pure")


# ------------------------------------------------------------------------- (c) exact resume


def _bf16_run(seed=5):
    model, tok = build_tiny_model(**SMALL, seed=seed, dtype="bfloat16")
    model.train()
    ocfg = OptimConfig(lr=3e-4, weight_decay=0.01, warmup_steps=2, schedule="cosine", grad_clip=1.0)
    opt, sched = optimizer_from_config(model, ocfg, total_steps=8, master_weights="float32")
    return model, tok, opt, sched


def test_checkpoint_resume_of_bf16_with_masters_is_exact(tmp_path):
    from rlvr.runs.checkpoint import load_checkpoint, save_checkpoint

    model, tok, opt, sched = _bf16_run()
    ids, labels = _batch(tok)
    _train(model, opt, sched, ids, labels, steps=3)
    save_checkpoint(tmp_path, 3, model=model, tokenizer=tok, optimizer=opt, scheduler=sched)
    _train(model, opt, sched, ids, labels, steps=4)
    straight = [p.detach().clone() for p in model.parameters()]
    straight_masters = [m.clone() for m in opt.master_params()]

    # A fresh process's view: different init, then the checkpoint.
    model2, _, opt2, sched2 = _bf16_run(seed=99)
    load_checkpoint(tmp_path, model=model2, optimizer=opt2, scheduler=sched2)
    for m in opt2.master_params():
        assert m.dtype == torch.float32  # not rounded to the parameters' bf16 on load
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt2.state.values())
    _train(model2, opt2, sched2, ids, labels, steps=4)
    for a, b in zip(straight, model2.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(straight_masters, opt2.master_params(), strict=True):
        assert torch.equal(a, b)
    assert sched2.get_last_lr() == sched.get_last_lr()


def test_state_dict_masters_survive_where_bf16_weights_cannot():
    # The checkpoint's model weights are bf16; the masters carry the bits below bf16 precision.
    w = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    opt = MasterWeightAdamW([w], lr=1e-3)
    w.grad = torch.ones(1, dtype=torch.bfloat16)
    opt.step()
    # 1 - 1e-3 = 0.999 is above the midpoint 1 - 2**-9 = 0.99805 between 1.0 and 1 - 2**-8, so the
    # bf16 weight saved in a checkpoint reads 1.0; only the master knows it moved.
    assert w.item() == 1.0
    sd = opt.state_dict()
    assert sd["state"][0]["master"].item() == pytest.approx(0.999, abs=1e-6)

    w2 = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    opt2 = MasterWeightAdamW([w2], lr=1e-3)
    opt2.load_state_dict(sd)
    for o, p in ((opt, w), (opt2, w2)):
        p.grad = torch.ones(1, dtype=torch.bfloat16)
        o.step()
    assert torch.equal(opt.state[w]["master"], opt2.state[w2]["master"])
    assert opt2.state[w2]["step"] == 2
    assert w2.item() == 0.99609375  # 0.998 is past the midpoint


def test_state_of_a_pure_bf16_adamw_loads_and_masters_start_from_the_params():
    w = torch.nn.Parameter(torch.full((3,), 0.5, dtype=torch.bfloat16))
    plain = torch.optim.AdamW([w], lr=1e-2, foreach=False)
    w.grad = torch.ones(3, dtype=torch.bfloat16)
    plain.step()
    opt = MasterWeightAdamW([w], lr=1e-2)
    opt.load_state_dict(plain.state_dict())
    st = opt.state[w]
    assert st["step"] == 1 and st["exp_avg"].dtype == torch.float32 and "master" not in st
    w.grad = torch.ones(3, dtype=torch.bfloat16)
    opt.step()
    assert st["master"].dtype == torch.float32 and st["step"] == 2


# ------------------------------------------------------------------- clip_and_step on bf16 grads


class _Recorder:
    """Stands in for optimizer and scheduler: keeps the gradients step() saw."""

    def __init__(self, params):
        self.params, self.seen = params, None

    def step(self):
        if self.seen is None:
            self.seen = [p.grad.clone() for p in self.params]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


def test_clip_and_step_norm_and_coefficient_are_float32_on_bf16_grads():
    torch.manual_seed(0)
    model = torch.nn.Linear(300, 300).to(torch.bfloat16)
    for p in model.parameters():
        p.grad = (torch.randn(p.shape) * 0.37).to(torch.bfloat16)
    grads = [p.grad.clone() for p in model.parameters()]
    exact = torch.linalg.vector_norm(torch.cat([g.double().flatten() for g in grads]))
    rec = _Recorder(list(model.parameters()))
    norm = clip_and_step(model, rec, SimpleNamespace(step=lambda: None), grad_clip=1.0)
    # float32 accumulation of 90,300 squares: measured 1.7e-6 relative; a bf16 result would be
    # off by up to 2**-9 = 2e-3.
    assert norm == pytest.approx(float(exact), rel=1e-5)
    bf16_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert bf16_norm.dtype == torch.bfloat16 and abs(float(bf16_norm) - float(exact)) > 1e-5 * float(exact)
    coef = torch.clamp(1.0 / (torch.tensor(norm, dtype=torch.float32) + 1e-6), max=1.0)
    for g, seen in zip(grads, rec.seen, strict=True):
        assert seen.dtype == torch.bfloat16
        # one rounding of the float32 product g * coef to bf16
        assert torch.equal(seen, (g.float() * coef).to(torch.bfloat16))
    assert all(p.grad is None for p in model.parameters())


def test_clip_and_step_unclipped_bf16_norm_is_float32():
    model = torch.nn.Linear(64, 64).to(torch.bfloat16)
    for p in model.parameters():
        p.grad = torch.full(p.shape, 0.01, dtype=torch.bfloat16)
    n = 64 * 64 + 64
    expected = float(torch.tensor(0.01, dtype=torch.bfloat16).double()) * n**0.5
    norm = clip_and_step(model, _Recorder(list(model.parameters())), SimpleNamespace(step=lambda: None), 0.0)
    assert norm == pytest.approx(expected, rel=1e-6)


# ---------------------------------------------- model build: gradient checkpointing, attention


def test_gradient_checkpointing_recomputes_layers_and_keeps_gradients():
    base, tok = build_policy("tiny", **SMALL, seed=2)
    ckpt, _ = build_policy("tiny", **SMALL, seed=2, gradient_checkpointing=True)
    assert ckpt.training and ckpt.config.use_cache is False
    ids, labels = _batch(tok)
    calls = []
    # a pre-hook: the recompute stops as soon as the tensors backward needs are back, which is
    # before the MLP's forward returns
    ckpt.model.layers[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    l1, l2 = _loss(base, ids, labels), _loss(ckpt, ids, labels)
    assert len(calls) == 1
    l1.backward()
    l2.backward()
    assert len(calls) == 2  # the layer ran again in backward: activations were recomputed
    assert torch.equal(l1, l2)
    for (n, p), q in zip(base.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_generation_still_uses_the_kv_cache_with_gradient_checkpointing(shared_prefix):
    """Checkpointing turns the KV cache off in training mode; the sampler (eval mode) must still decode on
    one: every forward returns a cache, or (shared prefix, cascade attention) decodes one token per row
    on the prompt's cached keys/values."""
    from rlvr.rollout import HFGenerator, SamplingSpec

    base, tok = build_policy("tiny", **SMALL, seed=4)
    ckpt, _ = build_policy("tiny", **SMALL, seed=4, gradient_checkpointing=True)
    outs, calls = [], []
    for model in (base, ckpt):
        gen = HFGenerator(model, tok, batch_size=4, shared_prefix=shared_prefix)
        kw = gen._cache_kw

        def spy(_m, _a, kwargs, out, kw=kw):
            cached = getattr(out, kw, None) is not None
            cascade = kwargs.get("rlvr_prefix") is not None and kwargs["input_ids"].shape[1] == 1
            calls.append("cache" if cached else "cascade" if cascade else "none")

        h = model.register_forward_hook(spy, with_kwargs=True)
        try:
            outs.append([r.response_ids for r in gen.generate(["1+2=", "33+4="], SamplingSpec(n=2, max_tokens=6, seed=1))])
        finally:
            h.remove()
        assert model.training  # generate() restores train mode
    assert outs[0] == outs[1]
    assert calls and "none" not in calls
    assert ("cascade" in calls) == shared_prefix  # the two prompts' samples decode on their prompt's K/V


@pytest.mark.parametrize("attn", ["eager", "sdpa", "auto"])
def test_attn_implementation_reaches_tiny_models(attn):
    model, _ = build_policy("tiny", **SMALL, attn_implementation=attn)
    # auto = sdpa where the class supports it (Qwen2 does)
    assert model.config._attn_implementation == ("sdpa" if attn == "auto" else attn)


def test_policy_from_config_reads_the_model_keys():
    mcfg = ModelConfig(**SMALL, gradient_checkpointing=True, attn_implementation="eager")
    model, _ = policy_from_config(mcfg)
    assert model.config._attn_implementation == "eager" and model.config.use_cache is False
    model, _ = policy_from_config(ModelConfig(**SMALL))  # the defaults: sdpa, no gradient checkpointing
    assert model.config._attn_implementation == "sdpa"
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_unknown_attn_implementation_and_master_weights_are_refused():
    with pytest.raises(ValueError, match="attn_implementation='flash9'.*auto, sdpa, eager"):
        build_policy("tiny", **SMALL, attn_implementation="flash9")
    model, _ = build_tiny_model(**SMALL)
    with pytest.raises(ValueError, match="master_weights='fp64'"):
        optimizer_from_config(model, OptimConfig(), total_steps=1, master_weights="fp64")
