"""How a training run runs: the optimizer (OptimConfig), the run directory, length, logging and checkpoints
(RunConfig), and where rollouts, scoring and learning are placed (DistributedConfig)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal

from rlvr.runs.trackers import report_to_problems
from rlvr.train.config.checks import Checks
from rlvr.train.schedules import LR_SCHEDULES

# optim.schedule: the keys of rlvr.train.schedules.LR_SCHEDULES (torch-free, so read here: one list)
LrSchedule = Literal[tuple(LR_SCHEDULES)]


@dataclass
class OptimConfig:
    """AdamW, warmup, schedule and clipping."""

    lr: float = 1e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 0
    """Linear warmup from 0 to lr over this many optimizer steps."""
    schedule: LrSchedule = "constant"
    """Learning-rate schedule after warmup: constant, linear, cosine (to min_lr_ratio * lr at the last step)."""
    min_lr_ratio: float = 0.0
    """Final learning rate as a fraction of lr for linear/cosine."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 = no clipping."""

    def validate(self) -> None:
        """AdamW ranges and the schedule name (a Literal of rlvr.train.schedules.LR_SCHEDULES' keys)."""
        c = Checks("optim")
        c.choices(self)
        c.need("lr", self.lr, self.lr > 0, "> 0")
        c.at_least("weight_decay", self.weight_decay, 0)
        c.need("beta1", self.beta1, 0 <= self.beta1 < 1, "in [0, 1)")
        c.need("beta2", self.beta2, 0 <= self.beta2 < 1, "in [0, 1)")
        c.need("eps", self.eps, self.eps > 0, "> 0")
        c.at_least("warmup_steps", self.warmup_steps, 0)
        c.need("min_lr_ratio", self.min_lr_ratio, 0 <= self.min_lr_ratio <= 1, "in [0, 1]")
        c.at_least("grad_clip", self.grad_clip, 0)
        c.done()


@dataclass
class RunConfig:
    """Run directory, length, seeds, logging and checkpoints."""

    out_dir: str = "runs/train"
    """Run directory (created; resume with --resume out_dir)."""
    overwrite: bool = False
    """Replace an existing rlvr run in out_dir (what the run wrote is deleted; other files stay; a folder of other
    files is refused either way); else refuse."""
    steps: int = 60
    """Training steps (RL: rollout batches; SFT: optimizer steps)."""
    seed: int = 0
    """Seed of the model init, sampling and data order; the sampler's seed at step s is derived from (seed, s)."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS or torch's default."""
    eval_every: int = 0
    """Evaluate on the held-out set every k steps; 0 = only at the end."""
    eval_greedy: bool = True
    """Evaluation uses greedy decoding (else samples at eval_temperature)."""
    eval_temperature: float = 1.0
    """Sampling temperature of sampled evaluation."""
    eval_batch_size: int = 256
    """Prompts per generate call during evaluation (on CPU with the hf engine also at most 16384 tokens a call:
    rows x (longest prompt + max_tokens), rlvr.eval.CPU_EVAL_TOKENS)."""
    log_samples_every: int = 10
    """Write a few generations (prompt, response, reference, reward parts, entropy) every k steps; 0 = never."""
    num_log_samples: int = 4
    """Generations written each time samples are logged."""
    checkpoint_every: int = 100
    """Save a checkpoint every k steps (and always at the end, and on Ctrl-C / SIGTERM); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep on disk."""
    progress: bool = True
    """Show a live progress bar."""
    report_to: str = "tensorboard"
    """Where metrics go besides metrics.jsonl, a comma list: tensorboard (RUN/tb), wandb (offline in RUN/wandb unless WANDB_MODE is set), trackio (RUN/trackio unless TRACKIO_DIR is set), mlflow (sqlite:///RUN/mlflow.db unless MLFLOW_TRACKING_URI is set), none. Each but tensorboard an extra: pip install 'rlvr[wandb]' (docs/runs.md, "Experiment trackers")."""
    peak_tflops: float = 0.0
    """The device's bf16 dense peak TFLOP/s that perf/mfu divides by; 0 = from the GPU's name (rlvr.runtime.PEAK_BF16_TFLOPS: H100/H200 989, A100 312, ...; on CPU or an unknown GPU perf/mfu is not logged). Read by `rlvr train` (RL) only."""

    def validate(self) -> None:
        """Ranges of the run section."""
        c = Checks("run")
        c.at_least("peak_tflops", self.peak_tflops, 0)
        c.need("out_dir", self.out_dir, bool(self.out_dir), "a directory path")
        c.at_least("steps", self.steps, 1)
        c.at_least("num_threads", self.num_threads, 0)
        c.at_least("eval_every", self.eval_every, 0)
        c.at_least("eval_temperature", self.eval_temperature, 0)
        c.at_least("eval_batch_size", self.eval_batch_size, 1)
        c.at_least("log_samples_every", self.log_samples_every, 0)
        c.at_least("num_log_samples", self.num_log_samples, 0)
        c.at_least("checkpoint_every", self.checkpoint_every, 0)
        c.at_least("keep_checkpoints", self.keep_checkpoints, 0)
        for problem in report_to_problems(self.report_to):
            c.error(problem)
        c.done()


@dataclass
class DistributedConfig:
    """Where rollouts, reward scoring and learning run (rlvr.distributed; docs/distributed.md)."""

    placement: Literal["local", "ray"] = "local"
    """local: everything in this process (no Ray import); ray: generators and reward scorers as Ray actors."""
    ray_address: str = ""
    """ray: address of a running cluster ('auto', 'host:port'); '' = start a local one."""
    num_generators: int = 1
    """ray: generator actors; the prompts of a step are split between them."""
    generator_cpus: float = 1.0
    """ray: CPUs reserved per generator actor (its placement-group bundle)."""
    generator_gpus: float = 0.0
    """ray: GPUs reserved per generator actor (vLLM engines)."""
    scorer_cpus: float = 1.0
    """ray: CPUs reserved for the reward-scoring actor."""
    num_learners: int = 1
    """Data-parallel learners: > 1 splits each minibatch's backward over that many Ray actors, gradients all-reduced (gloo)."""
    learner_cpus: float = 1.0
    """ray: CPUs reserved per data-parallel learner actor (num_learners > 1)."""
    learner: Literal["local", "fsdp2"] = "local"
    """local: the learner holds the whole model (one process, or num_learners Ray copies); fsdp2: PyTorch FSDP2 shards parameters, gradients and optimizer state over the processes torchrun starts (docs/multi_gpu.md)."""
    max_staleness: int = 0
    """Policy versions a rollout may lag the learner; 0 = synchronous. > 0 needs placement=ray."""
    queue_size: int = 0
    """Steps the generators sample ahead (bounded queue); 0 = max_staleness. Batches staler than max_staleness are dropped and resampled."""
    segment_tokens: int = 0
    """Partial rollouts: sample at most this many tokens of a response per round; unfinished ones continue next step under the newer policy. 0 = off."""
    max_restarts: int = 3
    """ray: restarts of a dead generator actor; its generate call is retried under the latest weights."""

    def validate(self) -> None:
        """Names and ranges; async needs the ray placement; ray must be installed when chosen."""
        c = Checks("distributed")
        c.choices(self)
        if self.placement == "ray":
            if importlib.util.find_spec("ray") is None:
                c.error("distributed.placement='ray' needs the ray package: pip install 'rlvr[ray]' (in a checkout: "
                        "`make test-ray` installs that extra into .venv); or distributed.placement=local")
        c.at_least("num_generators", self.num_generators, 1)
        c.need("generator_cpus", self.generator_cpus, self.generator_cpus > 0, "> 0 (a Ray bundle needs resources)")
        c.at_least("generator_gpus", self.generator_gpus, 0)
        c.need("scorer_cpus", self.scorer_cpus, self.scorer_cpus > 0, "> 0 (a Ray bundle needs resources)")
        c.at_least("num_learners", self.num_learners, 1)
        c.need("learner_cpus", self.learner_cpus, self.learner_cpus > 0, "> 0 (a Ray bundle needs resources)")
        c.at_least("max_staleness", self.max_staleness, 0)
        c.at_least("queue_size", self.queue_size, 0)
        c.at_least("max_restarts", self.max_restarts, 0)
        c.at_least("segment_tokens", self.segment_tokens, 0)
        if (self.max_staleness or self.queue_size) and self.placement != "ray":
            c.error("distributed.max_staleness / queue_size sample ahead on generator actors: "
                    "set distributed.placement=ray")
        if self.learner == "fsdp2":
            if self.num_learners > 1:
                c.error(f"distributed.learner='fsdp2' shards one learner over the processes torchrun starts; "
                        f"distributed.num_learners={self.num_learners} (Ray data-parallel copies) is the other way: "
                        "keep num_learners=1")
            if self.max_staleness or self.queue_size or self.segment_tokens:
                c.error("distributed.learner='fsdp2' samples synchronously on rank 0: distributed.max_staleness, "
                        "queue_size and segment_tokens must be 0")
        if self.num_learners > 1 and self.placement != "ray":
            c.error(f"distributed.num_learners={self.num_learners} runs learner actors: set distributed.placement=ray")
        c.done()
