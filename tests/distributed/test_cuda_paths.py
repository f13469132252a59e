"""The CUDA-only paths a CPU suite cannot take, checked on the CPU (issue 38, "Why" items 1-5): each test fails on
the code before the fix.

1. distributed.learner=fsdp2's collectives on the device its backend serves (NCCL: CUDA only), on a process group
   whose backend serves one device that is not the CPU (tests/helpers/lonely_group.py); the same for the data-parallel
   learners (rlvr.distributed.dp).
2. A LoRA (peft) policy takes the fast paths: the packed learner (equal to its padded path, through peft's forward)
   and the sampler's logits of the last position only (logits_to_keep).
3. A merged LoRA push rounds W + scaling * B @ A once.
4. The vLLM backend asks one request per prompt (n = the group, one seed per group).
5. (a) bf16 gradients summed in float32 over the micro-batches; (b) out of memory is never swallowed by a compile or
   fast-path fallback; (c) flex_attention probed for the dtype attention computes in; (d) the sharded learner
   syncs gradients once per minibatch and cuts its micro-batches on real tokens when packed.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO, TESTS

import rlvr.models.packed as packed
from rlvr.algo import logprobs as logprobs_mod
from rlvr.models.tiny import build_tiny_model
from rlvr.rollout import HFGenerator, SamplingSpec
from rlvr.rollout.batch import rollouts_to_batch
from rlvr.train.batching import ForwardSpec, micro_batches
from rlvr.train.optimizer import build_optimizer, clip_and_step
from rlvr.train.pg.objective import LossParts, Minibatch, accumulate_gradients, batch_logprobs
from rlvr.train.policy import build_policy

ROOT = REPO
SHAPE = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PROMPTS = ["12+7=", "3+45=", "60+1=", "8+8=?"]  # all five characters long

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(got: dict, ref: dict, rel: float = 1e-5) -> None:
    assert got.keys() == ref.keys() and got
    for n in ref:  # float32 rounding, relative to the tensor's largest entry
        assert float((got[n] - ref[n]).abs().max()) <= rel * float(ref[n].abs().max()) + 1e-12, n


def _algo(*extra):
    from helpers.training import grpo_algo as algo

    return algo(*extra)


def _rollout_batch(model, tok, n=2, seed=11, max_tokens=6):
    rollouts = HFGenerator(model, tok).generate(PROMPTS, SamplingSpec(n=n, max_tokens=max_tokens, seed=seed))
    return rollouts_to_batch(rollouts, tok.pad_token_id)


# ------------------------------------------------------------------ 1. collectives on the backend's device


def _lonely(what: str, tmp_path: Path) -> dict:
    pytest.importorskip("torch._lazy.ts_backend")  # the group's device (PyTorch's lazy tensors, on the CPU)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLVR_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(TESTS / "helpers" / "lonely_group.py"), what, str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_sharded_collectives_run_on_a_backend_that_does_not_serve_the_cpu(tmp_path):
    """ShardedGradients (GRPO-style loss with PPO's shared critic, 4 micro-batches) in a group whose backend takes
    tensors of one device only, not the CPU, as NCCL does: before the fix Shards.max and the loss sum handed it CPU
    tensors ("No backend type associated with device type cpu" on the first minibatch of any GPU run)."""
    out = _lonely("sharded", tmp_path)
    assert out["loss"] == pytest.approx(out["ref_loss"], rel=1e-6) and out["loss"] != 0
    assert out["same_names"] and out["grad_gap"] <= 1e-6 and out["head_gap"] <= 1e-6
    assert out["head_on"] == ["cpu"]  # the critic head's summed gradient is back on its own device
    assert out["rows"] == [0, 1, 2, 3]
    # the micro-batch count (max), the head's weight and bias, the loss; the statistics (objects); the barrier
    assert out["seen"].count("allreduce") == 4 and "allgather" in out["seen"] and out["seen"][-1] == "barrier"


def test_data_parallel_gradients_collect_on_the_policy_device(tmp_path):
    """GradientWorker's flat gradient + loss tensor is made on the policy's device (before: the loss was a CPU
    tensor concatenated to the device's gradients) and leaves as a CPU tensor."""
    out = _lonely("dp", tmp_path)
    assert out["loss"] == pytest.approx(out["ref_loss"], rel=1e-6)
    assert out["grad_gap"] <= 1e-6 and out["flat_on"] == "cpu" and out["seen"] == ["allreduce"]


# ------------------------------------------------------------------------- 2. LoRA takes the fast paths


def _lora(seed=3, dtype="float32"):
    model, tok = build_policy("tiny", seed=seed, lora_rank=4, dtype=dtype, **SHAPE)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # B != 0: the adapter changes the outputs, and both A and B get gradients
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model, tok


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_lora_packs_and_gives_the_padded_logprobs_and_adapter_gradients(shared_prefix, monkeypatch):
    """algo.packing=true with a peft policy: before the fix it raised ("its forward takes no logits_to_keep or
    **kwargs": peft's forward names neither). Packed, the logprobs and the adapters' gradients equal the padded
    path's, and the packed attention function ran (transformers' AttentionInterface reached through peft)."""
    model, tok = _lora()
    batch = _rollout_batch(model, tok)
    assert packed.supported(model) is None and packed.use_packing(model, True) is True
    calls = []
    real = packed.packed_attention
    monkeypatch.setattr(packed, "packed_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    lp = {p: batch_logprobs(model, batch, 3, shared_prefix=shared_prefix, packing=p) for p in (True, False)}
    assert calls and torch.allclose(lp[True], lp[False] * batch.response_mask, atol=1e-5)
    n = batch.input_ids.shape[0]
    adv = torch.randn(n, generator=torch.Generator().manual_seed(1))
    out = {}
    for p in (True, False):
        algo = _algo(f"algo.packing={str(p).lower()}", f"algo.shared_prefix={str(shared_prefix).lower()}")
        model.zero_grad(set_to_none=True)
        loss = accumulate_gradients(model, Minibatch(batch, adv, ref_logp=lp[False]), LossParts.from_algo(algo),
                                    ForwardSpec.of(algo, 3, temperature=0.9))
        out[p] = loss, _grads(model)
    assert out[True][0] == pytest.approx(out[False][0], rel=1e-5) and out[False][0] != 0
    assert out[True][1] and all(".lora_" in k for k in out[True][1])  # only the adapters train
    _close(out[True][1], out[False][1])


@pytest.mark.parametrize("n, static", [(1, False), (3, False), (3, True)])
def test_the_sampler_computes_last_position_logits_only_for_a_lora_policy(n, static):
    """HFGenerator on a peft model: every LM-head call sees one position per row (before the fix, peft's forward
    hid logits_to_keep and every prefill computed logits at every prompt position: (B, L, V)); n = 3 takes the
    shared-prompt (cascade) prefill, static the static-cache decode. The samples equal the plain model's (the
    adapter starts at B = 0)."""
    model, tok = build_policy("tiny", seed=3, lora_rank=4, **SHAPE)
    plain = build_tiny_model(**SHAPE, seed=3)[0]
    seen = []
    head = model.get_base_model().lm_head
    handle = head.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape[:2])))
    spec = SamplingSpec(n=n, max_tokens=5, seed=7)
    kw = dict(static_cache=True, cuda_graphs=False) if static else {}
    gen = HFGenerator(model, tok, **kw)
    assert gen._keep_kw == {"logits_to_keep": 1} and gen._cache_kw == "cache"
    got = gen.generate(PROMPTS, spec)
    handle.remove()
    assert seen and all(length == 1 for _, length in seen), seen
    assert seen[0][0] == len(PROMPTS)  # the prefill: each distinct prompt once (both paths, issue 38 S5)
    ref = HFGenerator(plain, tok, **kw).generate(PROMPTS, spec)
    assert [r.response_ids for r in got] == [r.response_ids for r in ref]


def test_the_shared_prompt_prefill_keeps_each_prompt_last_position_only():
    """Prompts of different lengths, prefilled once each right-padded: the LM head runs on the distinct last
    positions only (here 2 of 6), not the whole padded width, and the samples are unchanged."""
    model, tok = build_tiny_model(**SHAPE, seed=4)
    prompts = ["1+2=", "30+4=", "5+6=", "70+8="]  # 4, 5, 4, 5 characters (+ BOS)
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape[:2])))
    got = HFGenerator(model, tok).generate(prompts, SamplingSpec(n=2, max_tokens=4, seed=3))
    handle.remove()
    assert seen[0] == (4, 2) and all(length == 1 for _, length in seen[1:])
    ref = HFGenerator(model, tok, shared_prefix=False).generate(prompts, SamplingSpec(n=2, max_tokens=4, seed=3))
    assert [r.response_ids for r in got] == [r.response_ids for r in ref]
    for a, b in zip(got, ref, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


# ----------------------------------------------------------------------- 3. one rounding in merged pushes


def test_a_merged_lora_push_rounds_once():
    """W = 1.0 in bf16 (a step of 2**-7 above 1), delta = scaling * B @ A = 2**-8 (1 + 2**-12): rounding the delta
    to bf16 first gives exactly half a step (2**-8), and 1 + 2**-8 rounds to even: 1.0, the update lost. Rounded
    once, W + delta is past the half step: 1 + 2**-7."""
    from rlvr.models.export import push_tensors

    model, _ = build_policy("tiny", seed=3, lora_rank=1, lora_alpha=1.0, dtype="bfloat16", **SHAPE)
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    delta = 2.0 ** -8 * (1 + 2.0 ** -12)
    assert float(torch.tensor(delta).to(torch.bfloat16)) == 2.0 ** -8  # the two-rounding path's delta
    assert float(torch.tensor(1.0, dtype=torch.bfloat16) + torch.tensor(2.0 ** -8, dtype=torch.bfloat16)) == 1.0
    with torch.no_grad():
        layer.base_layer.weight[0, 0] = 1.0
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        a.zero_()
        b.zero_()
        a[0, 0] = 1.0
        b[0, 0] = delta / layer.scaling["default"]
    base = layer.base_layer.weight.detach().clone()
    merged = dict(push_tensors(model))["model.layers.0.self_attn.q_proj.weight"]
    assert merged.dtype == torch.bfloat16
    assert float(merged[0, 0]) == 1.0 + 2.0 ** -7
    rest = torch.ones_like(merged, dtype=torch.bool)
    rest[0, 0] = False
    assert torch.equal(merged[rest], base[rest])  # a zero delta changes nothing


# ---------------------------------------------------------------------- 4. vLLM: one request per prompt


def test_vllm_asks_one_request_per_prompt_with_one_seed_per_group(monkeypatch):
    """Before: one n=1 request per sample, each with its own seed (G requests a prompt). Now one request per prompt
    with n = the group size and one seed (vLLM seeds the children seed + j); the results stay prompt-major with
    sample_index 0..G-1, in the order vLLM returned them by child index."""
    from helpers.fake_vllm import EOS, completion, ids, make_generator

    from rlvr.rollout.types import sequence_seed

    prompts = ["1+1=", "9*9=", "2+2="]
    G = 4
    seeds = [sequence_seed(5, i, 0) >> 1 for i in range(len(prompts))]  # one per group, in 62 bits
    assert len(set(seeds)) == len(prompts)
    script = {}
    for i, (p, s) in enumerate(zip(prompts, seeds, strict=True)):
        cs = [completion(ids(f"{i}{j}") + [EOS], [-0.5, -0.25, -0.125], "stop") for j in range(G)]
        for j, c in enumerate(cs):
            c.index = j
        script[(tuple(ids(p)), s)] = cs[::-1]  # handed back out of order: mapped by child index
    gen, rec = make_generator(monkeypatch, script)
    out = gen.generate(prompts, SamplingSpec(n=G, max_tokens=4, seed=5))
    assert [r["prompt_token_ids"] for r in rec.requests] == [ids(p) for p in prompts]
    assert [(p.n, p.seed) for p in rec.params] == [(G, s) for s in seeds]
    assert [(r.group, r.sample_index, r.text) for r in out] == [(i, j, f"{i}{j}") for i in range(3) for j in range(G)]
    assert all(s + G < 2 ** 63 for s in seeds)  # vLLM's child seeds stay int64
    from rlvr.rollout.vllm_generator import group_seed

    assert [group_seed(5, i) for i in range(len(prompts))] == seeds


# --------------------------------------------------------------- 5a. bf16 gradients summed in float32


def test_bf16_micro_batch_gradients_are_summed_in_float32():
    """A bf16 policy with float32 masters, 12 micro-batches, one optimizer step. Each micro-batch's gradient is
    what its own bf16 backward gives; their float32 sum (the sharded learner's reduction dtype) is the reference.
    The step must update the masters as torch's AdamW does with that float32 sum (betas 0, eps 1: the update is
    g / (|g| + 1), so the gradient shows in every element). Before the fix the sum was accumulated in .grad in
    bf16: off by about 2**-9 relative per addition (measured here: over 100x the float32 sum's error)."""
    model, tok = build_policy("tiny", seed=3, dtype="bfloat16", **SHAPE)
    texts = [f"{a}+{b}={a + b}" for a, b in [(12, 7), (3, 45), (60, 1), (8, 8), (9, 90), (4, 4), (70, 7), (1, 23),
                                              (5, 55), (31, 3), (2, 2), (66, 6)]]

    def loss_of(text):
        row = torch.tensor([tok(text)["input_ids"]])
        return model(input_ids=row, labels=row, use_cache=False).loss

    parts = []  # each micro-batch's bf16 gradient alone
    for t in texts:
        model.zero_grad(set_to_none=True)
        loss_of(t).backward()
        parts.append({n: p.grad.clone() for n, p in model.named_parameters()})
    model.zero_grad(set_to_none=True)
    exact = {n: torch.stack([g[n].double() for g in parts]).sum(0) for n in parts[0]}
    f32 = {n: torch.zeros_like(v, dtype=torch.float32) for n, v in exact.items()}
    b16 = {n: torch.zeros_like(parts[0][n]) for n in exact}
    for g in parts:
        for n in exact:
            f32[n] += g[n]
            b16[n] += g[n]

    def err(x):
        return max(float((x[n].double() - exact[n]).abs().max() / exact[n].abs().max().clamp_min(1e-30)) for n in exact)

    assert err(b16) > 100 * err(f32)  # what bf16 accumulation costs, at these shapes

    names = [n for n, _ in model.named_parameters()]
    ref = [torch.nn.Parameter(p.detach().float()) for p in model.parameters()]
    opt, sched = build_optimizer(model, lr=1.0, beta1=0.0, beta2=0.0, eps=1.0, master_weights="float32")
    ref_opt = torch.optim.AdamW(ref, lr=1.0, betas=(0.0, 0.0), eps=1.0, weight_decay=0.0, foreach=False)
    for t in texts:  # the learner's loop: one backward per micro-batch into the same gradients
        loss_of(t).backward()
    for q, n in zip(ref, names, strict=True):
        q.grad = f32[n].clone()
    norm = clip_and_step(model, opt, sched, grad_clip=0.0)
    ref_opt.step()
    masters = opt.state_dict()["state"]
    for k, (q, n) in enumerate(zip(ref, names, strict=True)):
        m = masters[k]["master"]
        assert torch.equal(m, q.detach()), (n, float((m - q).abs().max()))
    want = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(f32[n]) for n in names])))
    assert norm == pytest.approx(want, rel=1e-6)


def test_a_bf16_gradient_assigned_by_hand_still_steps():
    """Gradients set on .grad directly (not through backward) are used as they are, each step anew."""
    from rlvr.train.precision import MasterWeightAdamW

    p = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    q = torch.nn.Parameter(torch.ones(3))
    opt = MasterWeightAdamW([p], lr=0.1)
    ref = torch.optim.AdamW([q], lr=0.1, weight_decay=0.0, foreach=False)
    for k in range(3):
        g = torch.tensor([1.0, -2.0, 0.5]) * (k + 1)
        p.grad, q.grad = g.to(torch.bfloat16), g
        opt.step()
        ref.step()
    assert torch.equal(opt.master_params()[0], q.detach())


# ------------------------------------------------------------------------- 5b. out of memory propagates


def test_out_of_memory_in_the_compiled_logprobs_propagates(monkeypatch):
    """_Fused.call: a torch.OutOfMemoryError of the compiled function (or wrapped in a compiler error) is raised,
    not turned into the eager fallback; any other error still falls back with a warning."""
    F = logprobs_mod._Fused
    eager = logprobs_mod._fused_forward
    monkeypatch.setattr(F, "broken", False)
    what = {}

    def compiled(*args):
        raise what["exc"]

    monkeypatch.setattr(F, "get", classmethod(lambda cls, name, device: eager if cls.broken else compiled))
    logits, labels = torch.randn(6, 11), torch.randint(0, 11, (6,))
    args = (logits, labels, 1.0, torch.float32)
    what["exc"] = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(torch.OutOfMemoryError):
        F.call("forward", torch.device("cpu"), *args)
    assert F.broken is False
    wrapped = RuntimeError("backend compiler failed")
    wrapped.__cause__ = torch.OutOfMemoryError("CUDA out of memory")
    what["exc"] = wrapped
    with pytest.raises(RuntimeError, match="backend compiler failed"):
        F.call("forward", torch.device("cpu"), *args)
    assert F.broken is False
    what["exc"] = RuntimeError("inductor: no such backend")
    with pytest.warns(UserWarning, match="using the eager path"):
        got = F.call("forward", torch.device("cpu"), *args)
    assert F.broken is True
    want = eager(*args)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_out_of_memory_in_the_flex_probe_and_the_static_decode_propagates(monkeypatch):
    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(packed, "_compiled_flex", oom)
    monkeypatch.setattr(packed, "_FLEX_STATE", {})
    with pytest.raises(torch.OutOfMemoryError):
        packed.flex_ready("cuda", torch.bfloat16, 64, 14, 2)
    assert "cuda" not in packed._FLEX_STATE  # not recorded as "cannot pack"

    import rlvr.rollout.hf_generator as hf_mod

    model, tok = build_tiny_model(**SHAPE, seed=3)
    gen = HFGenerator(model, tok, static_cache=True, cuda_graphs=False)
    assert gen._static
    monkeypatch.setattr(hf_mod, "generate_chunk_static", lambda *a, **k: oom())
    with pytest.raises(torch.OutOfMemoryError):
        gen.generate(["1+1="], SamplingSpec(max_tokens=3, seed=1))
    assert gen._static  # the fast path is not given up for an out-of-memory
    monkeypatch.setattr(hf_mod, "generate_chunk_static", lambda *a, **k: (_ for _ in ()).throw(ValueError("x")))
    with pytest.warns(UserWarning, match="static-cache decode failed"):
        assert len(gen.generate(["1+1="], SamplingSpec(max_tokens=3, seed=1))) == 1
    assert not gen._static


# ------------------------------------------------ 5c, 5d. the sharded learner (FSDP2, a group of one, gloo)


@pytest.fixture
def group_of_one(tmp_path):
    import torch.distributed as dist

    from rlvr.train.pg.sharded import Shards

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield Shards(0, 1, torch.device("cpu"), owns_group=True)
    finally:
        dist.destroy_process_group()


def _sharded_policy(dtype="float32", master="same", lora_rank=0):
    from rlvr.train.pg.sharded import shard

    model, tok = build_policy("tiny", seed=3, dtype=dtype, lora_rank=lora_rank, **SHAPE)
    twin = copy.deepcopy(model)
    shard(model, SimpleNamespace(dtype=dtype, master_weights=master))
    return model, twin, tok


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_the_flex_probe_compiles_for_the_compute_dtype(group_of_one, lora_rank, monkeypatch):
    """bf16 + float32 masters under FSDP2: the parameters are float32, attention computes in bf16 (the mixed
    precision policy). flex_ready must be asked for bf16 (before the fix: float32, and the real forward then
    compiled a second time for bf16)."""
    model, _, _ = _sharded_policy("bfloat16", "float32", lora_rank)
    trained = next(p for p in model.parameters() if p.requires_grad)
    assert trained.dtype == torch.float32  # the masters (LoRA: its adapters; the frozen base stays bf16)
    asked = []
    monkeypatch.setattr(packed, "flex_ready", lambda device, dtype, *shape: asked.append(dtype) or True)
    assert packed.use_packing(model, True) is True
    assert asked == [torch.bfloat16]
    assert packed.compute_dtype(build_tiny_model(**SHAPE, dtype="bfloat16")[0]) == torch.bfloat16
    assert packed.compute_dtype(build_tiny_model(**SHAPE)[0]) == torch.float32


def _sharded_minibatch(tok, model_for_rollouts):
    batch = _rollout_batch(model_for_rollouts, tok, n=2, max_tokens=8)
    adv = torch.randn(batch.input_ids.shape[0], generator=torch.Generator().manual_seed(2))
    return Minibatch(batch, adv)


def _count_reductions(monkeypatch) -> list:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    calls = []
    real = _fsdp_param_group.foreach_reduce
    monkeypatch.setattr(_fsdp_param_group, "foreach_reduce", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_the_sharded_learner_syncs_gradients_once_per_minibatch(group_of_one, monkeypatch):
    """8 rows in micro-batches of 1: FSDP2 reduce-scattered every unit's gradient after each micro-batch's
    backward (8 x 3 units); now once per minibatch (3), the earlier backwards accumulating unsharded. The
    gradient equals the one-process learner's."""
    from rlvr.models.loading import decoder_layers
    from rlvr.train.pg.sharded import ShardedGradients

    model, twin, tok = _sharded_policy()
    mb = _sharded_minibatch(tok, twin)
    parts = LossParts.from_algo(_algo("algo.kl_coef=0"))
    fwd = ForwardSpec(micro_batch=1, packing=False)
    units = len(decoder_layers(twin)) + 1
    calls = _count_reductions(monkeypatch)
    loss = ShardedGradients(group_of_one)(model, mb, parts, fwd)
    assert len(calls) == units  # once per unit, at the last micro-batch
    ref = accumulate_gradients(twin, mb, parts, fwd)
    assert loss == pytest.approx(ref, rel=1e-6)
    got = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
    _close(got, _grads(twin), rel=1e-6)
    calls.clear()  # a second minibatch: the sync is on again at its last micro-batch
    model.zero_grad(set_to_none=True)
    ShardedGradients(group_of_one)(model, mb, parts, fwd)
    assert len(calls) == units


def test_packed_sharded_micro_batches_are_cut_on_real_tokens(group_of_one, monkeypatch):
    """algo.packing=true: the sharded learner cuts its micro-batches as accumulate_gradients does when packed
    (real tokens, each shared prompt once), not on rows x the longest row."""
    import rlvr.train.pg.sharded as sharded_mod
    from rlvr.models.packed import row_prompts

    model, twin, tok = _sharded_policy()
    mb = _sharded_minibatch(tok, twin)
    parts = LossParts.from_algo(_algo("algo.kl_coef=0"))
    lens = mb.batch.attention_mask.sum(-1).tolist()
    prompts = row_prompts(mb.batch.input_ids, mb.batch.response_mask)
    cut = {b: (micro_batches(lens, max_tokens=b, packed=True, prompts=prompts), micro_batches(lens, max_tokens=b))
           for b in range(max(lens), sum(lens))}
    budget = next(b for b, (packed_cut, padded_cut) in cut.items() if 1 < len(packed_cut) < len(padded_cut))
    want = cut[budget][0]
    fwd = ForwardSpec(micro_batch=0, micro_batch_tokens=budget, packing=True, shared_prefix=True)
    pieces = []
    real = sharded_mod.accumulate_gradients
    monkeypatch.setattr(sharded_mod, "accumulate_gradients",
                        lambda m, part, *a, **k: pieces.append(part.batch.input_ids.shape[0]) or real(m, part, *a, **k))
    loss = sharded_mod.ShardedGradients(group_of_one)(model, mb, parts, fwd)
    assert pieces == [len(c) for c in want]
    ref = accumulate_gradients(twin, mb, parts, fwd)
    assert loss == pytest.approx(ref, rel=1e-5)
    got = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
    _close(got, _grads(twin), rel=1e-5)
