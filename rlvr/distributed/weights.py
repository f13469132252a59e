"""Weight push: how the learner's weights reach the generators, one interface, three strategies.

    push = weight_push(...)            # chosen by the placement, never by the trainer
    push.push(model.named_parameters(), version=step)

- InProcessPush: the generator lives in this process; its update_weights is called directly
  (the HF backend shares the learner's module, so nothing is copied).
- ObjectStorePush: one CPU copy of the weights is put in Ray's object store once per version and
  every generator actor loads it from there (ray.put once, N readers). Actor calls run in order,
  so a generate() submitted after a push samples with the pushed weights.
- The vLLM adapter is the generator side: a generator actor whose backend is vllm loads the
  tensors through VLLMGenerator.update_weights, i.e. the pinned vLLM's own path
  (model.load_weights in-process, collective_rpc otherwise; rlvr.rollout.vllm_generator).
  Only the GPU check (scripts/gpu_check.sh) exercises it.

Every rollout carries the version it was sampled with (Rollout.weight_version).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch


class WeightPush(Protocol):
    """Deliver a new policy version to every generator."""

    version: int

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...


class InProcessPush:
    """The generator is an object of this process: call its update_weights."""

    def __init__(self, generator):
        self.generator = generator
        self.version = generator.weight_version

    def push(self, named_tensors, version: int) -> None:
        self.generator.update_weights(named_tensors, version=version)
        self.version = int(version)


def cpu_state(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the tensors (what goes in the object store)."""
    return {n: t.detach().to("cpu", copy=True) for n, t in named_tensors}


class ObjectStorePush:
    """ray.put the weights once per version; each actor's `load_weights(ref, version)` reads them.

    actors: the generator actor handles (rlvr.distributed.actors.GeneratorWorker). wait=True
    blocks until every actor has loaded (synchronous training); wait=False only enqueues the load
    (the actor applies it before any generate() submitted later). `latest` keeps the newest
    (ref, version) so a restarted actor can be brought up to date."""

    def __init__(self, actors: list, *, wait: bool = True):
        self.actors = actors
        self.wait = wait
        self.version = 0
        self.latest = None  # (ObjectRef, version)

    def push(self, named_tensors, version: int) -> None:
        import ray

        ref = ray.put(cpu_state(named_tensors))
        self.latest = (ref, int(version))
        calls = [a.load_weights.remote(ref, int(version)) for a in self.actors]
        if self.wait:
            ray.get(calls)
        self.version = int(version)

    def resend(self, actor) -> None:
        """Load the newest version into one (restarted) actor and wait for it."""
        import ray

        if self.latest is not None:
            ray.get(actor.load_weights.remote(*self.latest))
