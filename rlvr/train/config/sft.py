"""`rlvr sft` (supervised fine-tuning on prompt/response pairs): SFTConfig, its objective (SFTAlgoConfig) and
the decoding of its periodic evaluation (SFTSamplingConfig). `rlvr distill` fine-tunes its student with it."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.algo.names import LossAggregationName
from rlvr.config import validate_sections
from rlvr.train.batching import BatchConfigError
from rlvr.train.config.checks import Checks
from rlvr.train.config.data import DataConfig, check_thinking_mode
from rlvr.train.config.judge import refuse_judge
from rlvr.train.config.model import ModelConfig
from rlvr.train.config.run import OptimConfig, RunConfig
from rlvr.train.config.sampling import DecodingConfig, RolloutConfig


@dataclass
class SFTAlgoConfig:
    """Supervised fine-tuning objective and batching."""

    batch_size: int = 32
    """Examples per optimizer step."""
    micro_batch_size: int = 0
    """Examples per forward/backward; 0 = batch_size (no accumulation)."""
    aggregation: LossAggregationName = "token_mean"
    """How token losses are normalized (rlvr.algo.LOSS_AGGREGATIONS): token_mean, seq_mean_token_mean, ..."""
    max_length: int = 256
    """Truncate prompt + response to this many tokens."""

    def validate(self) -> None:
        """Ranges and the aggregation name (a Literal of rlvr.algo.LOSS_AGGREGATIONS' names)."""
        c = Checks("algo")
        c.choices(self)
        c.at_least("batch_size", self.batch_size, 1)
        c.at_least("micro_batch_size", self.micro_batch_size, 0)
        c.at_least("max_length", self.max_length, 1)
        c.done()


@dataclass
class SFTSamplingConfig(DecodingConfig):
    """How `rlvr sft` decodes its periodic evaluation (greedy, or run.eval_temperature)."""

    min_tokens: int = 0
    """End-of-sequence and stop strings are ignored before this many response tokens."""

    def spec_extras(self) -> dict[str, int]:
        return {"n": 1, "top_k": 0, "min_tokens": self.min_tokens}

    def validate(self) -> None:
        """Ranges of the evaluation decoding."""
        c = Checks("sampling")
        c.at_least("min_tokens", self.min_tokens, 0)
        self.check_decoding(c)
        c.done()


@dataclass
class SFTConfig:
    """Supervised fine-tuning on prompt/response pairs, loss on response tokens only: `rlvr sft`."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(disable_dropout=False))
    """Policy (trained with the model's own dropout, as TRL's SFT; model.disable_dropout=true turns it off)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Examples; the response is the task's worked solution or its reference answer."""
    sampling: SFTSamplingConfig = field(default_factory=SFTSamplingConfig)
    """Decoding of the periodic evaluation (max_tokens, stop)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine of the periodic evaluation."""
    algo: SFTAlgoConfig = field(default_factory=SFTAlgoConfig)
    """Objective."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=20, schedule="cosine"))
    """Optimizer."""
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="runs/sft", steps=400))
    """Run directory and logging."""

    def validate(self) -> None:
        """After the sections' own checks: SFT builds the task's training and held-out problems; the judge and
        the thinking-mode switch are refused; the batch arithmetic. Also for a config built in Python
        (rlvr.train.sft.validate_sft_config runs this): then validate_sections first runs the algo, optim and
        run sections' own checks (a no-op at load, which has run them)."""
        validate_sections(self, "algo", "optim", "run")
        refuse_judge(self.data, "rlvr sft")
        check_thinking_mode(self.data, self.sampling, "rlvr sft")
        self.data.check_problem_counts(("train", "test"))
        self.rollout.check_placement(self.model)
        self.batch_sizes()

    def batch_sizes(self) -> tuple[int, int]:
        """(examples per optimizer step, examples per forward/backward); raises BatchConfigError when the
        micro-batch does not divide the batch."""
        a = self.algo
        if a.batch_size < 1:
            raise BatchConfigError(f"algo.batch_size must be >= 1, got {a.batch_size}")
        micro = a.micro_batch_size or a.batch_size
        if micro > a.batch_size or a.batch_size % micro:
            raise BatchConfigError(
                f"algo.micro_batch_size={micro} must divide algo.batch_size={a.batch_size}; "
                f"use a divisor of {a.batch_size} such as {a.batch_size // 2 or 1} or {a.batch_size}"
            )
        return a.batch_size, micro
