"""The worker classes a placement runs: plain Python classes, in-process or as Ray actors.

GeneratorWorker holds a generator (rlvr.rollout.build_generator: hf or vllm) on its own copy of
the policy; ScorerWorker scores responses with a task's reward function (rlvr.rewards.score_batch).
Nothing here imports ray: rlvr.distributed.placement wraps them with ray.remote.
Each worker counts the seconds it spent working (`busy`), from which the placement reports the
idle time of each role.
"""

from __future__ import annotations

import time

from rlvr.rewards import score_batch
from rlvr.rollout import build_generator


class GeneratorWorker:
    """A generator on its own policy copy. policy: (model, tokenizer), the learner's module (pickled to
    the actor, so a copy), a Ray ObjectRef of that pair or a one-item list of one; the learner's current
    weights arrive through load_weights (rlvr.distributed.weights).

    As a Ray actor it is created without the policy and then given it with build([ref]) (RayPlacement):
    a restartable actor whose constructor takes an object-store argument makes Ray's core worker print
    an E-level "constructor arguments in the object store" line on every run, and a restart rebuilds
    from the same reference anyway (RayGenerator.result)."""

    def __init__(self, rcfg, policy=None, *, model_source=None, seed: int = 0, default_batch_size: int = 64,
                 num_threads: int = 0):
        import torch

        if num_threads:
            torch.set_num_threads(num_threads)
        self._settings = dict(rcfg=rcfg, model_source=model_source, seed=seed, default_batch_size=default_batch_size)
        self.gen = None
        self.busy = 0.0
        if policy is not None:
            self.build(policy)

    def build(self, policy) -> int:
        """Build the generator on `policy` (see the class doc); returns its weight version."""
        if isinstance(policy, list):  # [ObjectRef]: nested, so Ray passes the reference unresolved
            policy = policy[0]
        if not isinstance(policy, tuple):
            import ray

            policy = ray.get(policy)
        model, tokenizer = policy
        st = self._settings
        self.gen = build_generator(st["rcfg"], model, tokenizer, model_source=st["model_source"], seed=st["seed"],
                                   default_batch_size=st["default_batch_size"])
        return self.gen.weight_version

    def load_weights(self, state: dict, version: int) -> int:
        """Load a CPU state dict (names as model.named_parameters()) as `version`: the backend's own
        path (HF: copy into the module; vLLM: VLLMGenerator.update_weights -> model.load_weights)."""
        t = time.perf_counter()
        self.gen.update_weights(state.items(), version=version)
        self.busy += time.perf_counter() - t
        return self.gen.weight_version

    def generate(self, prompts: list[str], spec, prompt_ids=None) -> list:
        """Rollouts of these prompts (see Generator.generate), stamped with the loaded version."""
        t = time.perf_counter()
        try:
            return self.gen.generate(prompts, spec, prompt_ids=prompt_ids)
        finally:
            self.busy += time.perf_counter() - t

    def sleep(self) -> None:
        self.gen.sleep()

    def weight_version(self) -> int:
        """The loaded version; -1 before build (a restarted actor answers before it is rebuilt)."""
        return -1 if self.gen is None else self.gen.weight_version

    def busy_seconds(self) -> float:
        return self.busy

    def pid(self) -> int:
        import os

        return os.getpid()


class ScorerWorker:
    """Reward scoring off the learner's process: rlvr.rewards.batch.score_rollouts on texts."""

    def __init__(self, num_threads: int = 1):
        import torch

        torch.set_num_threads(max(1, num_threads))
        self.busy = 0.0

    def score(self, reward_fn, texts: list[str], examples: list, workers: int = 1, timeout_s: float = 0.0,
              isolate: bool = False) -> list:
        t = time.perf_counter()
        try:
            return score_batch(reward_fn, texts, examples, workers=workers, timeout_s=timeout_s or None,
                               isolate=isolate)
        finally:
            self.busy += time.perf_counter() - t

    def busy_seconds(self) -> float:
        return self.busy
