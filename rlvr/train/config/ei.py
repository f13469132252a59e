"""`rlvr ei` (expert iteration: sample, keep the verified answers, fine-tune on them, repeat): EIConfig and
which samples a round keeps and the SFT on them (EIAlgoConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.algo.names import LossAggregationName
from rlvr.config import ConfigError
from rlvr.train.config.checks import Checks
from rlvr.train.config.data import DataConfig, check_thinking_mode, refuse_score_while_generating
from rlvr.train.config.judge import refuse_judge
from rlvr.train.config.model import ModelConfig
from rlvr.train.config.run import OptimConfig, RunConfig
from rlvr.train.config.sampling import RolloutConfig, SamplingConfig


@dataclass
class EIAlgoConfig:
    """Expert iteration: which verified samples a round keeps, and the SFT on them (rlvr.train.ei)."""

    max_per_question: int = 0
    """Keep at most this many verified responses per question (after de-duplication, in sample order); 0 = all."""
    dedup: bool = True
    """Keep a verified response once per question when several samples of it have the same text."""
    epochs: int = 1
    """SFT passes (E) over each round's kept pairs."""
    batch_size: int = 32
    """Kept pairs per optimizer step (the last minibatch of an epoch may be smaller)."""
    micro_batch_size: int = 0
    """Kept pairs per forward/backward; 0 = batch_size (no accumulation)."""
    aggregation: LossAggregationName = "token_mean"
    """How the response tokens' NLL becomes one number (rlvr.algo.LOSS_AGGREGATIONS), as in `rlvr sft`."""
    exact_entropy: bool = False
    """Metric `entropy` from a no-grad forward over every sample: the exact entropy of logits / temperature cut to
    top_k / top_p (EOS allowed); false = the sampled tokens' mean negative sampler logprob (free), which estimates the
    entropy of what the sampler drew from: also EOS-banned before sampling.min_tokens, so not the same number then."""

    def validate(self) -> None:
        """Ranges and the aggregation name (a Literal of rlvr.algo.LOSS_AGGREGATIONS' names)."""
        c = Checks("algo")
        c.choices(self)
        c.at_least("max_per_question", self.max_per_question, 0)
        c.at_least("epochs", self.epochs, 1)
        c.at_least("batch_size", self.batch_size, 1)
        c.at_least("micro_batch_size", self.micro_batch_size, 0)
        if self.micro_batch_size > self.batch_size >= 1:
            c.error(f"algo.micro_batch_size={self.micro_batch_size} must be <= algo.batch_size={self.batch_size}")
        c.done()


@dataclass
class EIConfig:
    """Expert iteration: sample answers, keep the verified ones, fine-tune on them, repeat: `rlvr ei`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy."""
    data: DataConfig = field(default_factory=DataConfig)
    """Questions and references (the references are read only by the checker)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling of each round: sampling.n_prompts questions x sampling.group_size answers."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout engine."""
    algo: EIAlgoConfig = field(default_factory=EIAlgoConfig)
    """Which verified answers are kept, and the SFT on them."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer; the learning-rate schedule (warmup, decay) counts rounds, not optimizer steps."""
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="runs/ei", steps=20))
    """Run directory and logging; run.steps counts rounds."""

    def validate(self) -> None:
        """After the sections' own checks: expert iteration reads both splits, G > 1 identical greedy
        samples would only repeat one answer, and rlvr train's online problem selection is refused."""
        refuse_judge(self.data, "rlvr ei")
        check_thinking_mode(self.data, self.sampling)
        if self.sampling.mask_truncated:
            raise ConfigError("sampling.mask_truncated masks the policy-gradient loss of `rlvr train`; expert "
                              "iteration fine-tunes on verified answers only (leave it false)")
        self.data.check_problem_counts(("train", "test"))
        self.rollout.check_placement(self.model)
        s = self.sampling
        if s.temperature == 0 and s.group_size > 1:
            raise ConfigError(f"sampling.temperature=0 with sampling.group_size={s.group_size}: greedy samples of a "
                              "question are all the same answer; sample (temperature > 0) or use group_size=1")
        refuse_score_while_generating(self.data, "rlvr ei")
        # the data section is rlvr train's; its online problem selection is not wired into expert iteration,
        # which reads the plain shuffled stream: refused by name rather than silently ignored
        for key in ("filter_band", "curriculum"):
            if getattr(self.data, key):
                raise ConfigError(f"data.{key}={getattr(self.data, key)!r} applies to rlvr train only; expert "
                                  f"iteration reads the shuffled training stream (leave data.{key} empty)")
