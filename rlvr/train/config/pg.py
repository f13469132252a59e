"""`rlvr train` (policy-gradient RL, the GRPO family): TrainConfig and the rules that involve more than one of
its sections (the objective with the sampling, data and rollout keys, the batch arithmetic, what asynchronous
rollouts, sharding, LoRA and a teacher combine with) or that are `rlvr train`'s own (RL samples). TrainConfig.
validate runs them in a fixed order after the sections' own checks; the first problem raises. The rules of the
algo section alone are AlgoConfig.validate's (rlvr.train.config.algo)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.config import ConfigError, validate_sections
from rlvr.train.batching import BatchPlan, plan_batches
from rlvr.train.config.algo import AlgoConfig
from rlvr.train.config.checks import changed, default_of
from rlvr.train.config.data import DataConfig, check_thinking_mode
from rlvr.train.config.external import ExternalConfig
from rlvr.train.config.judge import JudgeConfig
from rlvr.train.config.model import ModelConfig, TeacherConfig
from rlvr.train.config.run import DistributedConfig, OptimConfig, RunConfig
from rlvr.train.config.sampling import RolloutConfig, SamplingConfig


@dataclass
class TrainConfig:
    """Policy-gradient (GRPO family) training: `rlvr train`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and references."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Rollout sampling."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout engine."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Objective."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run directory and logging."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Placement of generators, scorers and learners (local or Ray); asynchronous rollouts."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """On-policy distillation: a teacher model as the KL reference."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Model judge of data.reward=judge."""
    external: ExternalConfig = field(default_factory=ExternalConfig)
    """Agent programs behind the rollout gateway: data.env=external (external.command) or verifiers:<env>."""

    def validate(self) -> None:
        """Every rule of `rlvr train` across its sections, after the sections' own checks: training reads both
        splits; the objective with the other sections; the batch arithmetic; what sampling ahead and partial
        rollouts combine with. rlvr.config runs it when the config is loaded, and the trainer again
        (validate_train_config) for a config built in Python, before any model: for that one validate_sections
        first runs the algo, optim and run sections' own checks (the objective, the learning rate, the steps: what
        this method re-checked when those rules lived here; a no-op at load, which has run them). The other
        sections of a config built in Python may hold on purpose what the loader refuses (a registered rollout
        backend, a test's placement), so they are not re-checked."""
        validate_sections(self, "algo", "optim", "run")
        self.data.check_problem_counts(("train", "test"))
        self.rollout.check_placement(self.model)
        check_thinking_mode(self.data, self.sampling)
        check_policy_gradient(self)
        check_inert(self)
        self.batch_plan()
        check_asynchronous(self)
        check_score_while_generating(self)
        check_sharded(self)
        check_teacher(self)
        check_lora(self)
        self.judge.check_reward(self.data, self.distributed)
        self.external.check_env(self.data.env)

    def loss_length_cap(self) -> int:
        """The most sampled tokens one response can have when sampling.max_tokens does not bound them, else 0:
        with a thinking budget the reasoning and the answer (thinking_budget + max_tokens), in a multi-turn
        episode its model turns (at most data.env_max_tokens). Dr. GRPO's constant (algo.aggregation=
        seq_mean_token_sum_norm with algo.norm_length=0) takes it, since the loss sums those tokens."""
        s = self.sampling
        if self.data.env:
            return self.data.env_max_tokens
        if s.thinking_budget >= 0:
            return s.thinking_budget + s.max_tokens
        return 0

    def batch_plan(self) -> BatchPlan:
        """The rollout batch split into minibatches and micro-batches (rlvr.train.batching); raises
        ConfigError / BatchConfigError naming the keys to change."""
        a, s = self.algo, self.sampling
        train_batch = a.train_batch_size
        if a.num_minibatches:
            rollout = s.n_prompts * s.group_size
            if a.train_batch_size:
                raise ConfigError(f"algo.num_minibatches={a.num_minibatches} and algo.train_batch_size="
                                  f"{a.train_batch_size} both set the minibatch size; set only one (0 = unset)")
            if rollout % a.num_minibatches:
                raise ConfigError(
                    f"algo.num_minibatches={a.num_minibatches} does not divide the rollout batch "
                    f"sampling.n_prompts*sampling.group_size={s.n_prompts}*{s.group_size}={rollout}")
            train_batch = rollout // a.num_minibatches
        return plan_batches(s.n_prompts, s.group_size, train_batch, a.micro_batch_size, a.epochs_per_rollout_batch)


def check_policy_gradient(cfg: TrainConfig) -> None:
    """The objective's combinations with the other sections, and what RL needs of them; the first problem raises
    ConfigError naming its keys (the algo section's own rules: AlgoConfig.validate)."""
    a, s = cfg.algo, cfg.sampling
    if s.group_size < 2 and a.advantage not in ("no_baseline", "zero"):
        raise ConfigError(
            f"sampling.group_size={s.group_size}: the {a.advantage!r} advantage compares responses within a "
            "group, so every advantage would be 0; use sampling.group_size >= 2 or algo.advantage=no_baseline"
        )
    if a.length_reward == "dapo_overlong" and not 0 < a.overlong_buffer <= s.max_tokens:
        raise ConfigError(
            f"algo.overlong_buffer={a.overlong_buffer} must be in (0, sampling.max_tokens={s.max_tokens}]"
        )
    if cfg.data.env and a.length_reward == "dapo_overlong":
        raise ConfigError("data.env with algo.length_reward='dapo_overlong': an episode's model turns are not bounded "
                          "by sampling.max_tokens (a per-turn cap), so the overlong window has no end to sit before; "
                          "use algo.length_reward=kimi (group-relative) or '' with data.env")
    if cfg.data.env and a.advantage == "process":
        raise ConfigError("data.env: algo.advantage=process needs per-step rewards of a text response; "
                          "episodes give one reward at the end (use grpo, rloo, ppo, ...)")
    d = cfg.distributed
    if cfg.data.env and (d.max_staleness or d.queue_size or d.segment_tokens):
        raise ConfigError("data.env: multi-turn episodes are sampled turn by turn within a step; they do not "
                          "combine with distributed.max_staleness, queue_size or segment_tokens (leave those 0)")
    if cfg.data.env and s.thinking_budget >= 0:
        raise ConfigError("data.env: a thinking budget renders its own prompts; multi-turn episodes need "
                          "sampling.thinking_budget=-1")
    if s.temperature <= 0:
        raise ConfigError(f"sampling.temperature={s.temperature}: RL needs sampling (> 0); greedy has no spread")


def check_inert(cfg: TrainConfig) -> None:
    """Refuse the rollout-correction keys set to a non-default value that the correction in force makes do nothing
    (issue 36), all at once, each line naming both keys and what to do: algo.rollout_correction=auto is token_tis
    with rollout.backend=vllm and none with hf. The other inert algo keys are the algo section's
    (inert_algo_problems), the data section's its own (DataConfig.inert_problems) and the judge's
    JudgeConfig.check_reward."""
    a, backend = cfg.algo, cfg.rollout.backend
    out = []
    # the sampler/trainer correction (rlvr.algo.correction): the cap of every mode, the low bound of the masks
    mode = a.rollout_correction
    if mode == "auto":
        mode = "token_tis" if backend == "vllm" else "none"  # rlvr.train.pg.objective.resolve_rollout_correction
    said = (f"algo.rollout_correction={a.rollout_correction!r}" if a.rollout_correction != "auto" else
            f"algo.rollout_correction='auto' (= {mode} with rollout.backend={backend})")
    if mode == "none" and changed(a, "rollout_correction_cap"):
        out.append(f"algo.rollout_correction_cap={a.rollout_correction_cap} bounds the importance weights of a "
                   f"rollout correction, and {said} corrects nothing: set algo.rollout_correction (token_tis, "
                   f"token_mask, seq_tis, seq_mask), or leave algo.rollout_correction_cap="
                   f"{default_of(a, 'rollout_correction_cap')}")
    if mode not in ("token_mask", "seq_mask") and changed(a, "rollout_correction_low"):
        out.append(f"algo.rollout_correction_low={a.rollout_correction_low} is the lower bound of the token_mask / "
                   f"seq_mask corrections, and {said} masks nothing: set algo.rollout_correction=token_mask or "
                   f"seq_mask, or leave algo.rollout_correction_low={default_of(a, 'rollout_correction_low')}")
    if out:
        raise ConfigError(out)


def check_asynchronous(cfg: TrainConfig) -> None:
    """What sampling ahead (distributed.max_staleness / queue_size) and partial rollouts
    (distributed.segment_tokens) combine with: the sampler wrappers of rlvr.distributed cannot render a
    thinking budget's second prompt, and the two are alternatives."""
    d, s, a = cfg.distributed, cfg.sampling, cfg.algo
    if not (d.max_staleness or d.queue_size or d.segment_tokens):
        return
    what = "distributed.segment_tokens" if d.segment_tokens else "distributed.max_staleness"
    if s.thinking_budget >= 0:
        raise ConfigError(f"{what} does not combine with sampling.thinking_budget; leave one of them unset")
    if d.segment_tokens:
        if d.max_staleness or d.queue_size:
            raise ConfigError("distributed.segment_tokens (partial rollouts) and distributed.max_staleness "
                              "(sampling ahead) are two ways to go asynchronous; set only one")
        if a.filter_zero_variance and a.refill_rounds:
            raise ConfigError("distributed.segment_tokens does not combine with algo.refill_rounds")


def check_score_while_generating(cfg: TrainConfig) -> None:
    """data.score_while_generating=true needs a sampler that hands rollouts on as they finish: the hf sampler of the
    synchronous source (rlvr.train.pg.rollout_source.score_while_generating); everywhere else it would do nothing."""
    if not cfg.data.score_while_generating:
        return
    d, s = cfg.distributed, cfg.sampling
    why = ("rollout.backend=vllm returns a batch's rollouts all at once" if cfg.rollout.backend != "hf" else
           "data.env's episodes are rewarded by the environment" if cfg.data.env else
           "a thinking budget samples in two phases and returns the answers together" if s.thinking_budget >= 0 else
           "sampling ahead (distributed.max_staleness / queue_size) scores on the generator actors"
           if d.max_staleness or d.queue_size else
           "partial rollouts (distributed.segment_tokens) finish across steps" if d.segment_tokens else
           "the Ray placement's generator actors return a batch at once" if d.placement == "ray" else None)
    if why:
        raise ConfigError(f"data.score_while_generating=true: {why}, so it would do nothing; leave it false")


def check_sharded(cfg: TrainConfig) -> None:
    """What distributed.learner=fsdp2 (rlvr.train.sharded) does not combine with."""
    if cfg.distributed.learner != "fsdp2":
        return
    a = cfg.algo
    if a.critic == "separate":
        raise ConfigError("distributed.learner='fsdp2' shards the policy, whose trunk a shared critic uses: "
                          "set algo.critic=shared (algo.critic=separate is not sharded yet)")
    if a.ref_refresh_every:
        raise ConfigError("distributed.learner='fsdp2' keeps the reference frozen at the start policy: "
                          "algo.ref_refresh_every must be 0")
    if cfg.model.lora_rank and cfg.rollout.backend == "vllm":
        raise ConfigError("distributed.learner='fsdp2' with model.lora_rank > 0 and rollout.backend=vllm: the "
                          "adapter-only push from shards is not built yet (use rollout.backend=hf, or lora_rank=0)")
    if cfg.model.compile_layers:
        raise ConfigError("distributed.learner='fsdp2' with model.compile_layers=true: compiling the sharded "
                          "layers is not built or measured yet (set model.compile_layers=false)")


def check_lora(cfg: TrainConfig) -> None:
    """model.lora_rank > 0: the reference is the frozen base (the adapter off), which no refresh can move."""
    if cfg.model.lora_rank and cfg.algo.ref_refresh_every:
        raise ConfigError(f"algo.ref_refresh_every={cfg.algo.ref_refresh_every} with model.lora_rank>0: the reference "
                          "of a LoRA policy is its frozen base (the adapter switched off), which no refresh can move; "
                          "set algo.ref_refresh_every=0, or model.lora_rank=0 to train (and refresh from) every weight")


def check_teacher(cfg: TrainConfig) -> None:
    """teacher.model: the KL term is what reads the teacher, so it must be on, and the reference stays the teacher."""
    if not cfg.teacher.model:
        return
    a = cfg.algo
    if a.kl_coef <= 0:
        raise ConfigError(f"teacher.model={cfg.teacher.model!r} is read through the KL term: set algo.kl_coef > 0 "
                          "(on-policy distillation: algo.kl_in=reward algo.kl_coef=1)")
    if a.ref_refresh_every:
        raise ConfigError("teacher.model: the reference is the teacher, never refreshed from the policy; "
                          "algo.ref_refresh_every must be 0")
    if cfg.distributed.learner == "fsdp2":
        raise ConfigError("teacher.model with distributed.learner=fsdp2 is not built yet (the teacher is not sharded)")
    if cfg.model.lora_rank:
        raise ConfigError("teacher.model with model.lora_rank > 0: a LoRA run's reference is its own base (the "
                          "adapter off); a separate teacher is not combined with it yet")
