"""Asynchronous rollouts with bounded staleness (distributed.max_staleness, distributed.queue_size).

AheadSampler: at the start of step t the trainer calls begin_step(t, data_pos); the generator
actors are then given the batches of steps t, t+1, ..., t+q (q = queue_size, default
max_staleness) that are not yet queued, each sampled with the weights the actors hold when they
reach it (actor calls run in order; weight pushes do not wait). The batch of step t was thus
sampled by version >= t-1-q while the learner is at version t-1. When the trainer asks for step
t's prompts, the queued batch is used if every rollout's version is within max_staleness of the
learner's; otherwise it is dropped (counted: async/dropped_rollouts) and resampled now, under the
current weights. A request that was not planned (refill rounds, evaluation, a curriculum's other
problems) is sampled synchronously (async/unplanned).

BehaviourPolicy: with stale rollouts the learner's current weights are not the policy that
sampled them, so the PPO ratio's denominator (old logprobs) is recomputed with the weights of each
rollout's own version, kept as CPU snapshots of the last max_staleness + 1 versions. When every
rollout is on-policy (synchronous) it is the learner's usual forward, so the numbers are the
single-process ones. The forward itself is the learner's, given to the constructor (`logprobs`), so
this module does not reach up into the trainer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from rlvr.distributed.weights import cpu_state
from rlvr.rollout.types import Rollout, SamplingSpec, WrappedGenerator

Plan = Callable[[int, int], tuple[list[str], SamplingSpec]]  # (step, data_pos) -> (prompts, spec)


class AheadSampler(WrappedGenerator):
    """A Generator around a RayGenerator that samples ahead; see the module docstring.

    plan(step, data_pos): the prompts and spec the trainer will ask for at `step` if the stream
    is at data_pos; prompts_per_step: how far data_pos moves per step."""

    def __init__(self, generator, plan: Plan, *, max_staleness: int, queue_size: int = 0, prompts_per_step: int):
        super().__init__(generator)
        self.plan = plan
        self.max_staleness = max_staleness
        self.queue_size = queue_size or max_staleness
        self.per_step = prompts_per_step
        self.queue: dict[int, tuple[tuple, object]] = {}  # step -> (key, Pending)
        self.step = 0
        self.dropped = 0  # rollouts dropped for staleness, whole run
        self._step_dropped = 0
        self._unplanned = 0

    def begin_step(self, step: int, data_pos: int) -> None:
        self.step = step
        self._step_dropped = self._unplanned = 0
        for k in range(self.queue_size + 1):
            st = step + k
            if st not in self.queue:
                prompts, spec = self.plan(st, data_pos + k * self.per_step)
                self.queue[st] = (_key(prompts, spec), self.gen.submit(prompts, spec))
        for st in [s for s in self.queue if s < step]:  # planned but never asked for
            del self.queue[st]

    def generate(self, prompts: list[str], spec: SamplingSpec, *, prompt_ids=None) -> list[Rollout]:
        entry = self.queue.get(self.step)
        if prompt_ids is None and entry is not None and entry[0] == _key(prompts, spec):
            del self.queue[self.step]
            ros = self.gen.result(entry[1])
            if (self.step - 1) - min(ro.weight_version for ro in ros) <= self.max_staleness:
                return ros
            self.dropped += len(ros)
            self._step_dropped += len(ros)
        else:
            self._unplanned += 1
        return self.gen.generate(prompts, spec)

    def metrics(self) -> dict[str, float]:
        return {"async/dropped_rollouts": self._step_dropped, "async/dropped_total": self.dropped,
                "async/unplanned": self._unplanned, "async/queued": len(self.queue)}


def _key(prompts: list[str], spec: SamplingSpec) -> tuple:
    return tuple(prompts), spec


class BehaviourPolicy:
    """Old logprobs under the policy version that sampled each row; see the module docstring.

    logprobs(model, batch, *args, **kw) -> (B, T) float32: the learner's no-grad forward of a batch
    (rlvr.train.pg.objective.batch_logprobs or forward_logprobs); the function old_logprobs_fn returns
    passes its extra arguments on to it."""

    def __init__(self, model, keep: int, logprobs: Callable[..., torch.Tensor]):
        self.keep = keep
        self.logprobs = logprobs
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self.scratch = None
        self._model = model

    def record(self, version: int, model) -> None:
        """Snapshot the learner's weights as `version`; forget versions older than version - keep."""
        self.snapshots[int(version)] = cpu_state(model.state_dict().items())
        for v in [v for v in self.snapshots if v < version - self.keep]:
            del self.snapshots[v]

    def old_logprobs_fn(self, rollouts: list[Rollout], current: int):
        """None when every token of `rollouts` was sampled by version `current` (the learner's
        usual forward), else a function (model, batch, *args, **kw) -> (B, T) logprobs (the arguments
        of `self.logprobs`) where each response token is scored under the version that sampled it
        (Rollout.segments for partial rollouts, else Rollout.weight_version). Row i of the batch
        is rollouts[i]."""
        segs = [ro.segments or [(0, ro.weight_version)] for ro in rollouts]
        needed = {v for s in segs for _, v in s} - {current}
        if not needed:
            return None
        missing = sorted(v for v in needed if v not in self.snapshots)
        if missing:
            raise RuntimeError(f"behaviour policy versions {missing} are not kept (have {sorted(self.snapshots)})")
        plens = [len(ro.prompt_ids) for ro in rollouts]

        def fn(model, batch, *args: Any, **kw: Any) -> torch.Tensor:
            out = self.logprobs(model, batch, *args, **kw)
            if self.scratch is None:
                self.scratch = copy.deepcopy(self._model)
            T = out.shape[1]
            for v in sorted(needed):
                rows = [i for i, s in enumerate(segs) if any(x == v for _, x in s)]
                self.scratch.load_state_dict(self.snapshots[v])
                lp = self.logprobs(self.scratch, batch.rows(torch.tensor(rows)), *args, **kw)
                for r, i in enumerate(rows):
                    bounds = [k for k, _ in segs[i]] + [T]
                    for (k, x), end in zip(segs[i], bounds[1:], strict=True):
                        if x == v:  # response token k is the label at position prompt_len - 1 + k
                            a, b = plens[i] - 1 + k, min(T, plens[i] - 1 + end)
                            out[i, a:b] = lp[r, a:b]
            return out

        return fn
