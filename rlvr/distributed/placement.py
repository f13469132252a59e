"""Where the trainer's workers run: one interface, a local and a Ray implementation.

    placement = build_placement(cfg.distributed, num_threads=cfg.run.num_threads)
    generator = placement.generator(cfg.rollout, model, tokenizer, model_source=..., seed=..., default_batch_size=...)
    rewards   = placement.score(rollouts, examples, reward_fn, workers=..., timeout_s=..., isolate=...)
    placement.metrics(); placement.shutdown()

The trainer (rlvr.train.pg.loop) reaches generators and reward scoring only through these calls.

- LocalPlacement (distributed.placement=local, the default): everything in this process, exactly
  the single-process code path (build_generator, score_rollouts); it never imports ray.
- RayPlacement (distributed.placement=ray): the same GeneratorWorker / ScorerWorker classes
  (rlvr.distributed.actors) as Ray actors in one placement group (a bundle per actor with the
  resources of its role: distributed.generator_cpus / generator_gpus / scorer_cpus). The
  generator the trainer holds is a RayGenerator: it implements the Generator protocol, splits a
  call's prompts over the actors, pushes weights through the object store
  (rlvr.distributed.weights.ObjectStorePush), and survives a dead actor (Ray restarts it, the
  latest weights are loaded into it again and its share of the call is resubmitted: same prompts,
  same seed, same weights, so the same rollouts). The learner runs in the driver process.
"""

from __future__ import annotations

import time
from typing import Protocol

from rlvr import rollout
from rlvr.config import ConfigError
from rlvr.distributed.actors import GeneratorWorker, ScorerWorker
from rlvr.distributed.dp import DataParallelGradients, GradientWorker, free_port, shard_bounds
from rlvr.distributed.weights import ObjectStorePush
from rlvr.rewards.batch import score_rollouts
from rlvr.rollout.types import Generator, Rollout, SamplingSpec, sequence_seed


class Placement(Protocol):
    name: str

    def generator(self, rcfg, model, tokenizer, *, model_source=None, seed: int = 0,
                  default_batch_size: int = 64) -> Generator: ...

    def score(self, rollouts, examples, reward_fn, *, workers: int = 1, timeout_s: float = 0.0,
              isolate: bool = False) -> list: ...

    def learners(self, model, grad_fn): ...

    def metrics(self) -> dict[str, float]: ...

    def shutdown(self) -> None: ...


class LocalPlacement:
    """In-process: the single-process trainer's own calls."""

    name = "local"

    def generator(self, rcfg, model, tokenizer, *, model_source=None, seed: int = 0,
                  default_batch_size: int = 64) -> Generator:
        return rollout.build_generator(rcfg, model, tokenizer, model_source=model_source, seed=seed,
                               default_batch_size=default_batch_size)

    def score(self, rollouts, examples, reward_fn, *, workers: int = 1, timeout_s: float = 0.0,
              isolate: bool = False) -> list:
        return score_rollouts(rollouts, examples, reward_fn, workers=workers, timeout_s=timeout_s, isolate=isolate)

    def learners(self, model, grad_fn):
        return None  # the learner is this process

    def metrics(self) -> dict[str, float]:
        return {}

    def shutdown(self) -> None:
        pass


def build_placement(dcfg, *, num_threads: int = 0) -> Placement:
    """The placement distributed.placement names (dcfg: a DistributedConfig or None = local)."""
    name = dcfg.placement if dcfg is not None else "local"
    if name == "local":
        return LocalPlacement()
    if name == "ray":
        return RayPlacement(dcfg, num_threads=num_threads)
    raise ValueError(f"distributed.placement={name!r} is unknown; known: 'local', 'ray'")


def import_ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("distributed.placement=ray needs Ray: pip install 'rlvr[ray]'") from e
    return ray


class RayPlacement:
    """Generators and the reward scorer as Ray actors; see the module docstring."""

    name = "ray"

    def __init__(self, dcfg, *, num_threads: int = 0):
        ray = import_ray()
        self.cfg = dcfg
        self.num_threads = num_threads
        self._started = False
        if not ray.is_initialized():
            ray.init(address=dcfg.ray_address or None, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            self._started = True
        from ray.util.placement_group import placement_group

        n = dcfg.num_generators
        gen_bundle = {"CPU": float(dcfg.generator_cpus)} | ({"GPU": float(dcfg.generator_gpus)}
                                                           if dcfg.generator_gpus else {})
        self.bundles = [gen_bundle] * n + [{"CPU": float(dcfg.scorer_cpus)}]
        n_learners = dcfg.num_learners
        if n_learners > 1:
            self.bundles += [{"CPU": float(dcfg.learner_cpus)}] * n_learners
        need = {r: sum(b.get(r, 0.0) for b in self.bundles) for r in ("CPU", "GPU")}
        have = ray.cluster_resources()
        short = {r: (need[r], have.get(r, 0.0)) for r in need if need[r] > have.get(r, 0.0) + 1e-9}
        hint = ("lower distributed.generator_cpus / scorer_cpus / learner_cpus (fractions such as 0.5 are fine), "
                "distributed.generator_gpus or distributed.num_generators, or join a larger cluster with "
                "distributed.ray_address")
        if short and self._started:  # a local cluster does not grow: fail now, not after a timeout
            ray.shutdown()
            what = ", ".join(f"{v[0]:g} {r} but the cluster has {v[1]:g}" for r, v in short.items())
            raise ConfigError(f"distributed.placement=ray: the actors need {what} (bundles {self.bundles}); {hint}")
        self.pg = placement_group(self.bundles, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=120)
        except Exception as e:
            raise ConfigError(f"distributed.placement=ray: Ray could not reserve {self.bundles} within 120 s; "
                              f"the cluster has {ray.cluster_resources()}; {hint}") from e
        self._scorer = None
        self._generator: RayGenerator | None = None
        self._learners = None

    def _options(self, bundle: int, **kw) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        b = self.bundles[bundle]
        return {"num_cpus": b.get("CPU", 0), "num_gpus": b.get("GPU", 0),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                                       placement_group_bundle_index=bundle)} | kw

    def generator(self, rcfg, model, tokenizer, *, model_source=None, seed: int = 0,
                  default_batch_size: int = 64) -> RayGenerator:
        ray = import_ray()
        cls = ray.remote(GeneratorWorker)
        n = self.cfg.num_generators
        per_actor = max(1, -(-default_batch_size // n))
        # one copy of the policy in the object store for all actors, given to them by build([ref]) after
        # creation (not as a constructor argument: see GeneratorWorker); the reference is kept so that a
        # restarted actor is rebuilt from it (RayGenerator.result)
        init = ray.put((model, tokenizer))
        actors = [cls.options(**self._options(k, max_restarts=self.cfg.max_restarts)).remote(
            rcfg, model_source=model_source, seed=seed, default_batch_size=per_actor,
            num_threads=self.num_threads) for k in range(n)]
        ray.get([a.build.remote([init]) for a in actors])
        self._generator = RayGenerator(actors, max_restarts=self.cfg.max_restarts,
                                       wait_for_push=not (self.cfg.max_staleness or self.cfg.queue_size))
        self._generator.init_ref = init
        return self._generator

    def learners(self, model, grad_fn):
        """None with distributed.num_learners = 1 (the learner is this process), else a
        rlvr.distributed.dp.DataParallelGradients over that many GradientWorker actors, each running
        grad_fn (the trainer's accumulate_gradients) on its share."""
        n = self.cfg.num_learners
        if n <= 1:
            return None
        ray = import_ray()
        addr = f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"
        first = self.cfg.num_generators + 1
        cls = ray.remote(GradientWorker)
        actors = [cls.options(**self._options(first + k)).remote(k, n, addr, model, grad_fn,
                                                                              self.num_threads or 1)
                  for k in range(n)]
        self._learners = DataParallelGradients(actors)
        return self._learners

    def score(self, rollouts, examples, reward_fn, *, workers: int = 1, timeout_s: float = 0.0,
              isolate: bool = False) -> list:
        ray = import_ray()
        if self._scorer is None:
            bundle = self.cfg.num_generators  # bundles: generators, the scorer, then the learners
            self._scorer = ray.remote(ScorerWorker).options(**self._options(bundle, max_restarts=3)).remote(
                self.num_threads or 1)
        return ray.get(self._scorer.score.remote(reward_fn, [r.text for r in rollouts], list(examples),
                                                 workers, timeout_s, isolate))

    def metrics(self) -> dict[str, float]:
        """Seconds each role worked since the last call (time/busy_generator: summed over the
        generator actors; time/busy_scorer) and the generator restarts so far (ray/restarts)."""
        ray = import_ray()
        out: dict[str, float] = {}
        if self._generator is not None:
            busy = ray.get([a.busy_seconds.remote() for a in self._generator.actors])
            out["time/busy_generator"] = self._delta("gen", sum(busy))
            out["ray/restarts"] = self._generator.restarts
        if self._scorer is not None:
            out["time/busy_scorer"] = self._delta("score", ray.get(self._scorer.busy_seconds.remote()))
        return out

    def _delta(self, key: str, total: float) -> float:
        seen = getattr(self, "_seen", {})
        self._seen = seen
        d = total - seen.get(key, 0.0)
        seen[key] = total
        return d

    def shutdown(self) -> None:
        ray = import_ray()
        from ray.util.placement_group import remove_placement_group

        learners = self._learners.actors if self._learners is not None else []
        for a in (self._generator.actors if self._generator else []) + ([self._scorer] if self._scorer else []) + learners:
            ray.kill(a, no_restart=True)
        remove_placement_group(self.pg)
        if self._started:
            ray.shutdown()


class RayGenerator:
    """The Generator the trainer holds under the Ray placement (see the module docstring).

    submit(prompts, spec) -> Pending, result(pending) -> rollouts: generate() is both at once;
    rlvr.distributed.staleness.AheadSampler submits ahead. With one actor a call samples exactly
    as the local generator (same seeds, same batch); with k actors the prompts are cut into k
    contiguous shards and shard i samples with seed sequence_seed(spec.seed, i, 0) (reproducible,
    but not the local placement's streams)."""

    def __init__(self, actors: list, *, max_restarts: int = 3, wait_for_push: bool = True):
        self.actors = actors
        self.push = ObjectStorePush(actors, wait=wait_for_push)
        self.max_restarts = max_restarts
        self.restarts = 0
        self.init_ref = None  # the ObjectRef of the initial (model, tokenizer): RayPlacement.generator sets it

    @property
    def weight_version(self) -> int:
        return self.push.version

    def update_weights(self, named_tensors, version: int) -> None:
        self.push.push(named_tensors, version)

    def sleep(self) -> None:
        for a in self.actors:
            a.sleep.remote()

    def generate(self, prompts: list[str], spec: SamplingSpec, *, prompt_ids=None) -> list[Rollout]:
        return self.result(self.submit(prompts, spec, prompt_ids=prompt_ids))

    def submit(self, prompts: list[str], spec: SamplingSpec, *, prompt_ids=None) -> Pending:
        shards = shard_bounds(len(prompts), len(self.actors))
        calls = []
        for k, (lo, hi) in enumerate(shards):
            sub = spec if len(shards) == 1 or spec.seed is None else _with_seed(spec, sequence_seed(spec.seed, k, 0))
            ids = None if prompt_ids is None else [list(p) for p in prompt_ids[lo:hi]]
            args = (prompts[lo:hi], sub, ids)
            calls.append((k, lo, args, self.actors[k].generate.remote(*args)))
        return Pending(calls)

    def result(self, pending: Pending) -> list[Rollout]:
        ray = import_ray()
        from ray.exceptions import RayActorError

        out: list[Rollout] = []
        for k, lo, args, ref in pending.calls:
            tries = 0
            while True:
                try:
                    ros = ray.get(ref)
                    break
                except RayActorError:
                    tries += 1
                    self.restarts += 1
                    if tries > self.max_restarts:
                        raise
                    actor = self.actors[k]
                    _wait_alive(actor)
                    ray.get(actor.build.remote([self.init_ref]))  # a restart re-runs only the constructor
                    self.push.resend(actor)  # the rebuilt actor holds the initial weights
                    ref = actor.generate.remote(*args)
            for ro in ros:
                ro.group += lo
            out.extend(ros)
        return out


class Pending:
    """Submitted generate calls: (actor index, first prompt index, (prompts, spec, prompt_ids), ObjectRef) each."""

    def __init__(self, calls: list):
        self.calls = calls


def _with_seed(spec: SamplingSpec, seed: int) -> SamplingSpec:
    import dataclasses

    return dataclasses.replace(spec, seed=seed)


def _wait_alive(actor, timeout_s: float = 120.0) -> None:
    """Block until a restarting actor answers again."""
    ray = import_ray()
    from ray.exceptions import RayActorError

    t = time.monotonic()
    while True:
        try:
            ray.get(actor.weight_version.remote(), timeout=timeout_s)
            return
        except RayActorError:
            if time.monotonic() - t > timeout_s:
                raise
            time.sleep(0.2)
