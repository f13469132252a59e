"""AdamW with float32 master weights for bfloat16 models.

Why: bfloat16 keeps 8 bits of mantissa, so a weight near 1.0 can only move in steps of 2**-8
(below 1) or 2**-7 (above). An AdamW update is about lr per element; with lr = 1e-6 .. 1e-5 (the
usual RL fine-tuning range) almost every update is smaller than half a bf16 step and rounds away:
a pure-bf16 AdamW leaves most weights exactly where they were. The fix used by mixed-precision
training everywhere: keep a float32 copy (the "master") of each low-precision weight, apply the
update to the master, and copy the master's rounding back into the bf16 parameter that the
forward and backward passes use. Small updates then accumulate in the master until they cross a
bf16 step.

The gradient is accumulated in float32 too. A minibatch's backward runs in micro-batches, and autograd
adds each one's gradient into .grad in the parameter's dtype: in bf16, every micro-batch after the first
rounds the running sum to 8 bits again, so the error grows with the number of micro-batches (the sharded
learner reduces in float32; this one did not). Here a hook on each low-precision parameter
(register_post_accumulate_grad_hook) moves the micro-batch's gradient, rounded once by its own backward,
into a float32 sum the optimizer holds (`grads32`) and clears .grad, so the next backward starts from
nothing. The optimizer step and rlvr.train.optimizer.clip_and_step read that sum (`float32_grads`).

Memory per low-precision parameter element: gradient 4 bytes (the float32 sum; the bf16 .grad of one
parameter exists only between its accumulation and the hook) + master 4 + exp_avg 4 + exp_avg_sq 4, all
float32 (a pure-bf16 AdamW keeps 2 + 2 + 2).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

# State entries that are float32 tensors shaped like their parameter.
_FP32_STATE = ("master", "exp_avg", "exp_avg_sq")

# The most elements one multi-tensor update handles at once: its temporary (the denominators, float32) is at most
# 4 x this many bytes (256 MiB), a parameter larger than it gets a bucket of its own.
FOREACH_BUCKET_ELEMENTS = 1 << 26


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, Loshchilov & Hutter) whose update runs in float32 master copies.

    params: the model's own parameters (any floating dtype). For a parameter that is not
    float32, `state[p]["master"]` holds a float32 copy; backward's gradients are summed in float32
    (`grads32`, see the module docstring; a gradient assigned to p.grad by hand is added to it at the
    step), step() updates the moments and the master in float32 and copies the master into p (rounded
    once to p's dtype). A float32 parameter is updated in place from its own .grad, so the optimizer is
    plain AdamW on float32 models. accumulate_fp32=False: the gradients stay in p.grad (p's dtype).

    The arithmetic is torch.optim.AdamW's single-tensor path (foreach=False) operation for
    operation, so on float32 numbers both give the same results. foreach=True (the default) runs
    those operations as multi-tensor kernels over buckets of parameters (see step()); foreach=False
    loops over the parameters.

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
        accumulate_fp32: bool = True,
        foreach: bool = True,
    ):
        self.accumulate_fp32 = accumulate_fp32
        self.foreach = foreach
        self.grads32: dict[torch.Tensor, torch.Tensor] = {}  # low-precision parameter -> its float32 gradient sum
        self._hooked: set[int] = set()
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, plus the float32 accumulation hook on each new low-precision parameter."""
        super().add_param_group(param_group)
        if not self.accumulate_fp32:
            return
        me = weakref.ref(self)  # the hook must not keep an optimizer nobody uses alive (nor act for it)

        def hook(p: torch.Tensor) -> None:
            opt = me()
            if opt is not None:
                opt._accumulate(p)

        for p in self.param_groups[-1]["params"]:
            if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32 and id(p) not in self._hooked:
                p.register_post_accumulate_grad_hook(hook)
                self._hooked.add(id(p))

    @torch.no_grad()
    def _accumulate(self, p: torch.Tensor) -> None:
        """After backward added a gradient into p.grad (which the previous call left empty, so it is this
        backward's alone): add it to the float32 sum exactly, and empty p.grad again."""
        g = p.grad
        if g is None:
            return
        acc = self.grads32.get(p)
        if acc is None:
            self.grads32[p] = g.to(torch.float32, copy=True)
        else:
            acc.add_(g)  # bf16 -> float32 is exact; one float32 rounding per addition
        p.grad = None

    def _grad32(self, p: torch.Tensor) -> torch.Tensor | None:
        """The float32 gradient of `p` for the step: the accumulated sum plus whatever is in p.grad (a
        gradient assigned by hand), without changing either; p.grad itself for a float32 parameter."""
        acc = self.grads32.get(p)
        if p.grad is None:
            return acc
        if p.grad.is_sparse:
            raise RuntimeError("MasterWeightAdamW does not support sparse gradients")
        g = p.grad.to(torch.float32)
        return g if acc is None else acc + g

    @torch.no_grad()
    def float32_grads(self) -> list[torch.Tensor]:
        """The float32 gradient of every parameter that has one, in param_groups order, as tensors the step
        reads (scaling them in place scales the update's gradient: rlvr.train.optimizer.clip_and_step clips
        them so). A low-precision parameter's p.grad (assigned by hand) is first moved into its sum; a
        float32 parameter's is its own .grad."""
        out = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype == torch.float32 or not self.accumulate_fp32:
                    if p.grad is not None:
                        out.append(p.grad)
                    continue
                if p.grad is not None:
                    self._accumulate(p)
                if p in self.grads32:
                    out.append(self.grads32[p])
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's, and the float32 sums too."""
        super().zero_grad(set_to_none=set_to_none)
        if set_to_none:
            self.grads32.clear()
        else:
            for acc in self.grads32.values():
                acc.zero_()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One AdamW step for every parameter with a gradient; returns closure() if given.

        foreach (the default): the update runs as torch's multi-tensor (`torch._foreach_*`) operations over
        the float32 masters, moments and gradients, a few kernels per bucket of parameters (at most
        FOREACH_BUCKET_ELEMENTS elements each, so the one temporary, the denominators, stays bounded)
        instead of ~8 per parameter; each is the single-tensor operation applied tensor by tensor, in the
        same order with the same scalars, so the numbers are those of the loop (foreach=False: the loop
        itself). Tests: tests/train/test_precision.py (bitwise on the CPU; within 1 ulp on CUDA, checked by
        benchmarks/gpu.py's correctness stage)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            beta1, beta2 = (float(b) for b in group["betas"])
            eps, wd = float(group["eps"]), float(group["weight_decay"])
            todo: list[tuple[torch.Tensor, torch.Tensor, dict]] = []  # (p, its master or p itself, state)
            for p in group["params"]:
                low = p.dtype != torch.float32
                if low and self.accumulate_fp32:
                    if p not in self.grads32 and p.grad is None:
                        continue
                elif p.grad is None:
                    continue
                if p.grad is not None and p.grad.is_sparse:
                    raise RuntimeError("MasterWeightAdamW does not support sparse gradients")
                state = self.state[p]
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
                state["step"] += 1
                todo.append((p, state["master"] if low else p, state))
            # the float32 gradients are made a bucket at a time (a gradient assigned by hand to a bf16 p.grad is
            # converted then), so no more than a bucket's copies exist at once
            for bucket in (_buckets(todo) if self.foreach else [[item] for item in todo]):
                items = [(p, w, self._grad32(p) if w is not p else p.grad, state) for p, w, state in bucket]
                if self.foreach:
                    _adamw_foreach(items, lr, beta1, beta2, eps, wd)
                else:
                    _adamw_single(items[0], lr, beta1, beta2, eps, wd)
                del items
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


def _buckets(todo: list[tuple]) -> list[list[tuple]]:
    """MasterWeightAdamW.step's (p, w, g, state) items in order, cut into buckets of one device each and at most
    FOREACH_BUCKET_ELEMENTS elements (a larger tensor: a bucket of its own)."""
    out: list[list[tuple]] = []
    cur: list[tuple] = []
    size, device = 0, None
    for item in todo:
        w = item[1]
        n = w.numel()
        if cur and (w.device != device or size + n > FOREACH_BUCKET_ELEMENTS):
            out.append(cur)
            cur, size = [], 0
        cur.append(item)
        size += n
        device = w.device
    if cur:
        out.append(cur)
    return out


def _adamw_single(item: tuple, lr: float, beta1: float, beta2: float, eps: float, wd: float) -> None:
    """One parameter's update: torch.optim.AdamW(foreach=False)'s operations, in its order."""
    p, w, g, state = item
    exp_avg, exp_avg_sq, step = state["exp_avg"], state["exp_avg_sq"], state["step"]
    if wd != 0:
        w.mul_(1 - lr * wd)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
    w.addcdiv_(exp_avg, denom, value=-step_size)
    if w is not p:
        p.copy_(w)  # round to nearest (even) once; the master keeps the rest


def _adamw_foreach(bucket: list[tuple], lr: float, beta1: float, beta2: float, eps: float, wd: float) -> None:
    """_adamw_single over a bucket as multi-tensor operations: the same operations with the same scalars (a
    parameter's own step count in its bias corrections), tensor by tensor."""
    ws = [w for _, w, _, _ in bucket]
    gs = [g for _, _, g, _ in bucket]
    m1 = [s["exp_avg"] for _, _, _, s in bucket]
    m2 = [s["exp_avg_sq"] for _, _, _, s in bucket]
    steps = [s["step"] for _, _, _, s in bucket]
    if wd != 0:
        torch._foreach_mul_(ws, 1 - lr * wd)
    torch._foreach_lerp_(m1, gs, 1 - beta1)
    torch._foreach_mul_(m2, beta2)
    torch._foreach_addcmul_(m2, gs, gs, value=1 - beta2)
    denom = torch._foreach_sqrt(m2)
    torch._foreach_div_(denom, [(1 - beta2**t) ** 0.5 for t in steps])
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(ws, m1, denom, [-(lr / (1 - beta1**t)) for t in steps])
    del denom
    low = [(p, w) for p, w, _, _ in bucket if w is not p]
    if low:  # each bf16 parameter: its master rounded once
        torch._foreach_copy_([p for p, _ in low], [w for _, w in low])


def needs_master_weights(params: Iterable[torch.Tensor]) -> bool:
    """True when any trainable parameter is stored below float32 (bf16/fp16)."""
    return any(p.is_floating_point() and p.dtype != torch.float32 for p in params)
