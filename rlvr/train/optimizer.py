"""AdamW with warmup and a schedule (rlvr.train.schedules), fp32 master weights for low-precision policies
(rlvr.train.precision), gradient clipping on the fp32 norm and the step. Plain functions with plain
arguments; the trainers call them with their optim section."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlvr.train.precision import MasterWeightAdamW, needs_master_weights
from rlvr.train.schedules import lr_multiplier

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
