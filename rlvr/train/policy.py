"""The policy a stage trains or samples: built in memory (the tiny model), loaded from a folder, a hub id or a
run directory / checkpoint (a LoRA one merged), wrapped in a LoRA adapter, with gradient checkpointing and
dropout as the model section says. Plain functions with plain arguments; the stages call them with their
model section."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlvr.config import ConfigError
from rlvr.models import build_tiny_model, load_policy, lora
from rlvr.models.loading import ATTN_IMPLEMENTATIONS, enable_gradient_checkpointing
from rlvr.models.loading import compile_layers as compile_decoder_layers
from rlvr.models.loading import disable_dropout as _disable_dropout
from rlvr.runs.checkpoint import latest_checkpoint


def quiet_transformers() -> None:
    """transformers prints a progress bar per checkpoint shard: noise in a training log."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def policy_from_config(mcfg, seed: int = 0):
    """build_policy with the fields of a ModelConfig (rlvr.train.config.ModelConfig)."""
    return build_policy(
        mcfg.name,
        init_from=mcfg.init_from,
        hidden_size=mcfg.hidden_size,
        num_layers=mcfg.num_layers,
        num_heads=mcfg.num_heads,
        intermediate_size=mcfg.intermediate_size,
        tie_embeddings=mcfg.tie_embeddings,
        dtype=mcfg.dtype,
        device=mcfg.device,
        seed=seed,
        gradient_checkpointing=mcfg.gradient_checkpointing,
        compile_layers=mcfg.compile_layers,
        attn_implementation=mcfg.attn_implementation,
        disable_dropout=mcfg.disable_dropout,
        lora_rank=mcfg.lora_rank,
        lora_alpha=mcfg.lora_alpha,
        lora_dropout=mcfg.lora_dropout,
        lora_target_modules=mcfg.lora_target_modules,
    )


def no_new_adapter(mcfg):
    """The model section of a command that only samples (rlvr eval, filter): a run's model.lora_rank must not
    wrap the policy it loads in a new (zero) adapter (a LoRA checkpoint is merged on load either way), and its
    model.compile_layers compiles nothing that sampling runs (the samplers keep the layers eager)."""
    if mcfg.lora_rank <= 0 and not mcfg.compile_layers:
        return mcfg
    return dataclasses.replace(mcfg, lora_rank=0, compile_layers=False)


def build_policy(
    name: str = "tiny",
    *,
    init_from: str = "",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 256,
    tie_embeddings: bool = False,
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
    gradient_checkpointing: bool = False,
    compile_layers: bool = False,
    attn_implementation: str = "auto",
    disable_dropout: bool = True,
    lora_rank: int = 0,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    lora_target_modules: str = "all-linear",
):
    """(model, tokenizer) in train mode.

    init_from: a run directory (its latest checkpoint's model), a checkpoint folder, or a model
    folder; it wins over `name`. name 'tiny' builds a fresh char-level Qwen2-style model whose
    init is seeded by `seed`; anything else is a local transformers folder or a hub id.
    gradient_checkpointing: recompute activations in backward (rlvr.models.loading.
    enable_gradient_checkpointing; the config's use_cache is turned off, generation still
    caches). attn_implementation: auto (sdpa where the model class supports it, else eager),
    sdpa, eager, flash_attention_2. The same two settings apply to tiny and real models.
    disable_dropout: every dropout of the model off, in train() mode too (rlvr.models.loading.
    disable_dropout; ModelConfig.disable_dropout says who needs it). Copies made later (reference,
    critic) inherit it.
    compile_layers: each decoder layer compiled (rlvr.models.loading.compile_layers), after the adapter.
    lora_rank > 0: the model wrapped with peft LoRA adapters (rlvr.models.lora.wrap_lora: rank, alpha,
    dropout, target modules); only the adapters train. init_from of a LoRA run or checkpoint loads its base
    and merges its adapter (rlvr.models.lora.load_merged) before any new adapter is added.
    """
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"model.attn_implementation={attn_implementation!r}; known: {', '.join(ATTN_IMPLEMENTATIONS)}"
        )
    if init_from:
        model_dir = resolve_model_dir(init_from)
        if lora.is_adapter_dir(model_dir):
            model, tok = lora.load_merged(model_dir, dtype=dtype, device=device,
                                          attn_implementation=attn_implementation)
        else:
            model, tok = load_policy(model_dir, dtype=dtype, device=device, attn_implementation=attn_implementation)
    elif name == "tiny":
        model, tok = build_tiny_model(
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            intermediate_size=intermediate_size,
            tie_word_embeddings=tie_embeddings,
            seed=seed,
            dtype=dtype,
            attn_implementation=attn_implementation,
        )
        model.to(device)
    else:
        model, tok = load_policy(name, dtype=dtype, device=device, attn_implementation=attn_implementation)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if lora_rank > 0:
        model = lora.wrap_lora(model, rank=lora_rank, alpha=lora_alpha, dropout=lora_dropout,
                               target=lora_target_modules)
    if disable_dropout:
        _disable_dropout(model)
    if compile_layers:
        compile_decoder_layers(model)
    model.train()
    return model, tok


def resolve_model_dir(path: str | Path) -> Path:
    """A loadable model folder from a run directory, a checkpoint folder or a model folder (a LoRA
    checkpoint's model folder holds an adapter: rlvr.models.lora.is_adapter_dir, loaded by load_merged)."""
    p = Path(path)

    def loadable(d: Path) -> bool:
        return (d / "config.json").exists() or lora.is_adapter_dir(d)

    if loadable(p):
        return p
    if loadable(p / "model"):
        return p / "model"
    ckpt = latest_checkpoint(p) if p.is_dir() else None
    if ckpt is not None and loadable(ckpt / "model"):
        return ckpt / "model"
    raise FileNotFoundError(
        f"model.init_from={str(path)!r}: not a model folder, checkpoint folder or run directory with a checkpoint"
    )


def load_model_at(spec: str, *, dtype: str, device: str, key: str):
    """(model, tokenizer, what was loaded) of a model given by a config key other than model.* (teacher.model,
    judge.model): a model folder, a run directory or checkpoint (a LoRA one merged), or a hub id. What cannot be
    loaded raises ConfigError naming `key`."""
    where: str | Path = spec
    try:
        where = resolve_model_dir(spec)
    except FileNotFoundError:
        if Path(spec).exists():  # a local path that holds no model: say so, not a hub lookup's error
            raise ConfigError(f"{key}={spec!r}: not a model folder, checkpoint or run directory with a "
                              "checkpoint") from None
    try:
        if lora.is_adapter_dir(where):
            model, tok = lora.load_merged(where, dtype=dtype, device=device)
        else:
            model, tok = load_policy(where, dtype=dtype, device=device)
    except (OSError, ValueError) as exc:  # no such hub id (offline), a folder without weights, ...
        raise ConfigError(f"{key}={spec!r}: cannot load it: {exc}") from None
    return model, tok, str(where)
