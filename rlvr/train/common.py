"""Pieces shared by the trainers: building the policy, AdamW with warmup and a schedule, the
deterministic data order, per-step sampling seeds, and gradient-norm bookkeeping.

Plain functions with plain arguments; the trainers call them with fields of their config sections.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlvr.config import ConfigError
from rlvr.models import build_tiny_model, load_policy, lora
from rlvr.models.loading import ATTN_IMPLEMENTATIONS, enable_gradient_checkpointing
from rlvr.models.loading import disable_dropout as _disable_dropout
from rlvr.runs import plots
from rlvr.runs.checkpoint import latest_checkpoint
from rlvr.train.precision import MasterWeightAdamW, needs_master_weights

# --------------------------------------------------------------------------------------- policy


def quiet_transformers() -> None:
    """transformers prints a progress bar per checkpoint shard: noise in a training log."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def policy_from_config(mcfg, seed: int = 0):
    """build_policy with the fields of a ModelConfig (fields added later are read with their
    defaults, so older config objects still work)."""
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
        gradient_checkpointing=getattr(mcfg, "gradient_checkpointing", False),
        attn_implementation=getattr(mcfg, "attn_implementation", "auto"),
        disable_dropout=getattr(mcfg, "disable_dropout", True),
        lora_rank=getattr(mcfg, "lora_rank", 0),
        lora_alpha=getattr(mcfg, "lora_alpha", 16.0),
        lora_dropout=getattr(mcfg, "lora_dropout", 0.0),
        lora_target_modules=getattr(mcfg, "lora_target_modules", "all-linear"),
    )


def no_new_adapter(mcfg):
    """The model section of a command that only samples (rlvr eval, filter): a run's model.lora_rank must not
    wrap the policy it loads in a new (zero) adapter; a LoRA checkpoint is merged on load either way."""
    if getattr(mcfg, "lora_rank", 0) <= 0:
        return mcfg
    return dataclasses.replace(mcfg, lora_rank=0)


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


def eval_prefixed(metrics: dict[str, float], name: str = "eval") -> dict[str, float]:
    """Evaluation metrics as logged during training: under eval/ (finish_run drops the prefix again);
    name="val" for a check on a validation slice of the training split (the demo's SFT stopping check),
    so that it cannot be read as the held-out figure."""
    return {f"{name}/{k}": v for k, v in metrics.items()}


def finish_run(run_path: Path, last_metrics: dict[str, Any]) -> dict[str, float]:
    """End of a trainer: write the run's plots and return the final evaluation (the eval/* metrics
    of the last step, prefix dropped). A plot failure must not lose a finished run: it only warns."""
    try:
        plots.plot_run(run_path)
    except Exception as exc:  # noqa: BLE001 - see docstring
        print(f"warning: plotting failed: {exc}")
    return {k[len("eval/") :]: v for k, v in last_metrics.items() if k.startswith("eval/")}


# ------------------------------------------------------------------------------------ optimizer


# The schedules live in a torch-free module so config validation can name them in a second.
from rlvr.train.schedules import LR_SCHEDULES, lr_multiplier  # noqa: E402,F401 - re-exported

MASTER_WEIGHTS = ("float32", "same")


def build_optimizer(
    model,
    *,
    lr: float,
    weight_decay: float = 0.0,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    warmup_steps: int = 0,
    schedule: str = "constant",
    min_lr_ratio: float = 0.0,
    total_steps: int = 1,
    master_weights: str = "same",
):
    """AdamW over trainable parameters + a LambdaLR scheduler stepped once per optimizer step.

    master_weights: "float32" = when some trainable parameter is stored below float32 (a
    bfloat16 model), rlvr.train.precision.MasterWeightAdamW updates float32 master copies and
    copies their rounding back (small updates are not lost to bf16 rounding); float32 models get
    torch's AdamW either way. "same" = torch's AdamW in the parameters' own dtype.
    """
    if master_weights not in MASTER_WEIGHTS:
        raise ValueError(f"model.master_weights={master_weights!r}; known: {', '.join(MASTER_WEIGHTS)}")
    params = [p for p in model.parameters() if p.requires_grad]
    if master_weights == "float32" and needs_master_weights(params):
        opt = MasterWeightAdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    else:
        # foreach=False: identical numerics whatever the parameter grouping; negligible cost at our sizes.
        opt = torch.optim.AdamW(
            params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay, foreach=False
        )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_multiplier(
            s, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule, min_lr_ratio=min_lr_ratio
        ),
    )
    return opt, sched


def optimizer_from_config(model, ocfg, total_steps: int, master_weights: str = "same"):
    """build_optimizer with the fields of an OptimConfig; total_steps = optimizer steps of the run;
    master_weights = ModelConfig.master_weights (float32 | same)."""
    return build_optimizer(
        model,
        lr=ocfg.lr,
        weight_decay=ocfg.weight_decay,
        beta1=ocfg.beta1,
        beta2=ocfg.beta2,
        eps=ocfg.eps,
        warmup_steps=ocfg.warmup_steps,
        schedule=ocfg.schedule,
        min_lr_ratio=ocfg.min_lr_ratio,
        total_steps=total_steps,
        master_weights=master_weights,
    )


def grad_norm_fp32(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of the gradients, accumulated in float32 whatever the gradients' dtype
    (a bf16 norm has 3 significant digits, and the clip coefficient would inherit that)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))


def clip_and_step(model, optimizer, scheduler, grad_clip: float) -> float:
    """Clip the global grad norm (0 = no clip), step optimizer and scheduler, zero grads.
    Returns the gradient norm before clipping, computed in float32.

    float32 gradients take torch's clip_grad_norm_ (unchanged numerics); lower-precision ones get
    a float32 norm and a float32 clip coefficient, applied to each gradient with one rounding. An
    optimizer that holds the gradients itself (rlvr.train.precision.MasterWeightAdamW: a bf16 model's
    gradients summed in float32 over the micro-batches) is asked for them (`float32_grads`): their
    float32 norm, and the clip applied to them in float32."""
    held = getattr(optimizer, "float32_grads", None)
    if held is not None:
        grads = held()
        norm = (torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32)
                                                      for g in grads])) if grads else torch.zeros(()))
        if grad_clip > 0 and grads:
            coef = torch.clamp(grad_clip / (norm + 1e-6), max=1.0)
            with torch.no_grad():
                for g in grads:
                    g.copy_(g.to(torch.float32).mul_(coef.to(g.device)))  # float32: in place; else one rounding
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)
    params = [p for p in model.parameters() if p.grad is not None]
    if params and all(p.grad.dtype == torch.float32 for p in params):
        if grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
    else:
        norm = grad_norm_fp32(params)
        if grad_clip > 0 and params:
            # Same formula as clip_grad_norm_: coefficient max_norm / (norm + 1e-6), capped at 1.
            coef = torch.clamp(grad_clip / (norm + 1e-6), max=1.0)
            with torch.no_grad():
                for p in params:
                    # multiply in float32 and round once (an in-place bf16 mul would first round
                    # the coefficient to bf16); the temporary is one parameter's size.
                    p.grad.copy_(p.grad.to(torch.float32).mul_(coef.to(p.grad.device)))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


# ----------------------------------------------------------------------------- data and seeds


def data_order(n: int, seed: int, epoch: int) -> list[int]:
    """Permutation of range(n) for one pass over the data; a pure function of (seed, epoch)."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


@functools.lru_cache(maxsize=4)
def _data_order_cached(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    # every step of a run reads the same epoch's order: shuffle it once, not once per step
    return tuple(data_order(n, seed, epoch))


def take(items: Sequence[Any], position: int, count: int, seed: int) -> list[Any]:
    """`count` items starting at global position `position` of the endless shuffled stream
    (epoch e uses data_order(n, seed, e)). The data position saved in checkpoints is `position`."""
    n = len(items)
    if n == 0:
        raise ValueError("no training examples")
    out = []
    cache: dict[int, list[int]] = {}
    for k in range(position, position + count):
        epoch, i = divmod(k, n)
        if epoch not in cache:
            cache[epoch] = _data_order_cached(n, seed, epoch)
        out.append(items[cache[epoch][i]])
    return out


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of RL step `step`: a pure function of (run seed, step), so a resumed run
    samples exactly what an uninterrupted one would."""
    return (seed * 1_000_003 + step * 7919 + 17) % (2**31 - 1)
