"""Data-parallel learners: N Ray actors share each minibatch's backward, gradients all-reduced (gloo).

distributed.num_learners = N > 1 (with distributed.placement=ray). For every optimizer step the
trainer's learn() hands the minibatch to DataParallelGradients instead of accumulate_gradients:

The gradient function itself (rlvr.train.pg.objective.accumulate_gradients) is given to the workers by
the trainer (RayPlacement.learners(model, grad_fn)), and the step's statistics are merged with the
trainer's accumulator's own `merge`, so this module does not reach up into the trainer.

1. the minibatch's LossNormalizers are computed once from its whole mask (rlvr.algo.aggregation:
   every aggregation mode is a sum over rows divided by a global constant, so the shares' losses
   and gradients add up to the whole minibatch's);
2. the learner's current weights go to the N GradientWorker actors through the object store (one
   ray.put, N readers), each its contiguous share of the rows;
3. each actor runs accumulate_gradients on its share with the global normalizers, then the flat
   gradient is summed over the actors with torch.distributed.all_reduce (gloo on CPU; the backend
   is a parameter, NCCL on GPUs);
4. the summed gradient lands in the driver's .grad; the driver's optimizer steps as with one
   learner (clip_and_step), so optimizer state, scheduler and checkpoints are the one-process ones.

The result equals one learner on the whole minibatch up to float summation order
(tests/distributed/test_distributed_ray.py: 2 learners == 1 learner). PPO's critic is not split (refused).
"""

from __future__ import annotations

import dataclasses
import socket

import torch
import torch.distributed as dist

from rlvr.algo import loss_normalizers
from rlvr.distributed.weights import cpu_state


class GradientWorker:
    """One data-parallel rank: a policy copy in a torch.distributed group of `world` ranks."""

    def __init__(self, rank: int, world: int, init_method: str, model, grad_fn, num_threads: int = 1,
                 backend: str = "gloo"):
        torch.set_num_threads(max(1, num_threads))
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
        self.rank, self.world = rank, world
        self.model = model
        self.model.train()
        self.grad_fn = grad_fn

    def grads(self, state: dict, mb, parts, fwd, normalizers, norm_length: int, stats):
        """(summed loss, the all-reduced flat gradient (rank 0 only, else None), stats, row entropy) of this
        rank's share `mb` (a Minibatch) under the whole minibatch's normalizers. stats: an empty accumulator
        of the trainer's (StepStats), filled here; None = no statistics."""
        self.model.load_state_dict(state)
        self.model.zero_grad(set_to_none=True)
        ent = {}
        loss = 0.0
        if mb.batch.input_ids.shape[0]:
            loss = self.grad_fn(self.model, mb, parts, fwd, norm_length=norm_length, normalizers=normalizers,
                                stats=stats, row_entropy=ent)
        params = list(self.model.parameters())
        # one flat float32 tensor on the policy's device (the one the group's backend serves: a CPU tensor given
        # to NCCL raises), the loss in its last slot; it leaves as a CPU tensor (through Ray's object store)
        device = params[0].device
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                          for p in params] + [torch.tensor([loss], dtype=torch.float32, device=device)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        if self.rank != 0:
            return None, None, stats, ent
        flat = flat.cpu()
        return float(flat[-1]), flat[:-1], stats, ent

    def close(self) -> None:
        dist.destroy_process_group()


class DataParallelGradients:
    """accumulate_gradients' signature, computed by N GradientWorker actors; see the module docstring.

    actors are created by RayPlacement.learners (their placement-group bundles)."""

    def __init__(self, actors: list):
        self.actors = actors

    def __call__(self, model, mb, parts, fwd, *, norm_length: int = 0, critic=None, stats=None,
                 row_entropy=None) -> float:
        import ray  # only under distributed.placement=ray, where ray is installed

        if critic is not None:
            raise ValueError("distributed.num_learners > 1 does not split PPO's critic (algo.critic); use 1 learner")
        n = mb.batch.input_ids.shape[0]
        norm = loss_normalizers(mb.batch.response_mask, constant=float(norm_length) if norm_length else None)
        state = ray.put(cpu_state(model.state_dict().items()))
        if mb.row_ids is None:
            mb = dataclasses.replace(mb, row_ids=list(range(n)))
        shards = shard_bounds(n, len(self.actors)) + [(n, n)] * max(0, len(self.actors) - n)
        # each share's batch rows copied out (index_select), so that a share pickles only its own rows
        calls = [actor.grads.remote(state, dataclasses.replace(mb.part(lo, hi), batch=mb.batch.rows(torch.arange(lo, hi))),
                                    parts, fwd, norm, norm_length,
                                    type(stats)() if stats is not None else None)
                 for actor, (lo, hi) in zip(self.actors, shards, strict=True)]
        results = ray.get(calls)
        loss, flat = results[0][0], results[0][1]
        offset = 0
        for p in model.parameters():
            g = flat[offset:offset + p.numel()].view_as(p).to(p.device, p.dtype)
            offset += p.numel()
            p.grad = g.clone() if p.grad is None else p.grad + g
        for _, _, st, ent in results:
            if stats is not None:
                stats.merge(st)
            if row_entropy is not None:
                row_entropy.update(ent)
        return loss

    def close(self) -> None:
        import ray  # only under distributed.placement=ray

        ray.get([a.close.remote() for a in self.actors])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shard_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """[lo, hi) bounds of k contiguous, near-equal shards of n rows (fewer when n < k)."""
    k = max(1, min(k, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k)]
