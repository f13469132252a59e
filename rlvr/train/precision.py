"""AdamW with float32 master weights for bfloat16 models.

Why: bfloat16 keeps 8 bits of mantissa, so a weight near 1.0 can only move in steps of 2**-8
(below 1) or 2**-7 (above). An AdamW update is about lr per element; with lr = 1e-6 .. 1e-5 (the
usual RL fine-tuning range) almost every update is smaller than half a bf16 step and rounds away:
a pure-bf16 AdamW leaves most weights exactly where they were. The fix used by mixed-precision
training everywhere: keep a float32 copy (the "master") of each low-precision weight, apply the
update to the master, and copy the master's rounding back into the bf16 parameter that the
forward and backward passes use. Small updates then accumulate in the master until they cross a
bf16 step.

Memory per low-precision parameter element: master 4 bytes + exp_avg 4 + exp_avg_sq 4, all
float32 (a pure-bf16 AdamW keeps 2 + 2). The gradient is cast to float32 one parameter at a
time, so the transient cost of the cast is one parameter's worth, not the model's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

# State entries that are float32 tensors shaped like their parameter.
_FP32_STATE = ("master", "exp_avg", "exp_avg_sq")


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, Loshchilov & Hutter) whose update runs in float32 master copies.

    params: the model's own parameters (any floating dtype). For a parameter that is not
    float32, `state[p]["master"]` holds a float32 copy; step() casts p.grad (accumulated by
    backward in p's dtype) to float32, updates the moments and the master in float32, and copies
    the master into p (rounded once to p's dtype). A float32 parameter is updated in place, so
    the optimizer is plain AdamW on float32 models.

    The arithmetic is torch.optim.AdamW's single-tensor path (foreach=False) operation for
    operation, so on float32 numbers both give the same results.

    `param_groups` hold the model's parameters (so LambdaLR and anything that walks the
    optimizer's parameters see the real ones), and zero_grad clears the model's gradients.
    state_dict() contains the masters and the float32 moments; load_state_dict() restores them
    without casting them to the parameters' dtype (torch's Optimizer would round them to bf16)
    and sets each parameter to its master's rounding, so a resumed run continues exactly.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One AdamW step for every parameter with a gradient; returns closure() if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            beta1, beta2 = (float(b) for b in group["betas"])
            eps, wd = float(group["eps"]), float(group["weight_decay"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("MasterWeightAdamW does not support sparse gradients")
                state = self.state[p]
                low = p.dtype != torch.float32
                if not state:
                    state["step"] = 0
                    if low:
                        state["master"] = p.detach().to(torch.float32, copy=True)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                elif low and "master" not in state:
                    # state loaded from an optimizer without masters (e.g. a pure-bf16 run):
                    # the parameter is the best float32 value there is.
                    state["master"] = p.detach().to(torch.float32, copy=True)
                w = state["master"] if low else p
                # One parameter's float32 gradient at a time: the transient memory is bounded by
                # the largest parameter (the embedding), not the whole model.
                g = p.grad.to(torch.float32)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                step = state["step"]
                # Same operations, in the same order, as torch.optim.AdamW(foreach=False).
                if wd != 0:
                    w.mul_(1 - lr * wd)
                exp_avg.lerp_(g, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                step_size = lr / bias_correction1
                denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
                w.addcdiv_(exp_avg, denom, value=-step_size)
                del g, denom
                if low:
                    p.copy_(w)  # round to nearest (even) once; the master keeps the rest
        return loss

    def master_params(self) -> list[torch.Tensor]:
        """The float32 tensor each parameter is updated through (its master, or itself when float32
        or before its first step), in param_groups order."""
        out = []
        for group in self.param_groups:
            for p in group["params"]:
                out.append(self.state[p]["master"] if "master" in self.state.get(p, {}) else p)
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state_dict() of this class exactly (float32 stays float32), then set each
        low-precision parameter to its master's rounding so the pair is consistent whatever order
        model and optimizer are loaded in (the next step would overwrite the parameter from the
        master anyway). A state without masters (e.g. saved by torch's AdamW) is accepted: the
        moments are converted to float32 and masters start from the parameters at the next step."""
        saved_state = state_dict["state"]
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)  # checks group sizes; casts tensors to the param dtype
        params = [p for g in self.param_groups for p in g["params"]]
        with torch.no_grad():
            for saved_id, p in zip(saved_ids, params, strict=True):
                if saved_id not in saved_state:
                    continue
                state = self.state[p]
                for key in _FP32_STATE:
                    if key in saved_state[saved_id]:
                        value = saved_state[saved_id][key]
                        state[key] = value.to(device=p.device, dtype=torch.float32, copy=True)
                if "step" in state:
                    state["step"] = int(state["step"])  # torch's AdamW stores a tensor
                if "master" in state:
                    p.copy_(state["master"])
                    if p.dtype == torch.float32:
                        del state["master"]  # a float32 parameter is its own master


def needs_master_weights(params: Iterable[torch.Tensor]) -> bool:
    """True when any trainable parameter is stored below float32 (bf16/fp16)."""
    return any(p.is_floating_point() and p.dtype != torch.float32 for p in params)
