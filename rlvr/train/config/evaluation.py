"""`rlvr eval` (a policy on a task's held-out problems): EvalConfig, its decoding (EvalSamplingConfig) and its
seed, threads and output (EvalRunConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.config import ConfigError
from rlvr.train.config.checks import Checks
from rlvr.train.config.data import DataConfig, check_thinking_mode
from rlvr.train.config.judge import JudgeConfig
from rlvr.train.config.model import ModelConfig
from rlvr.train.config.sampling import DecodingConfig, RolloutConfig


@dataclass
class EvalSamplingConfig(DecodingConfig):
    """Decoding of `rlvr eval`."""

    n: int = 1
    """Samples per problem (n > 1 adds pass@k and maj@k; needs sampling.temperature > 0: greedy answers are all
    the same)."""
    temperature: float = 0.0
    """0 = greedy (one answer per problem: sampling.n=1)."""
    batch_size: int = 256
    """Prompts per generate call (on CPU with the hf engine also at most 16384 tokens a call: rows x (longest
    prompt + max_tokens), rlvr.eval.CPU_EVAL_TOKENS; long prompts in 256-prompt calls were several times slower)."""

    def spec_extras(self) -> dict[str, int]:
        return {"n": self.n, "top_k": 0, "min_tokens": 0}

    def validate(self) -> None:
        """Ranges of `rlvr eval`'s decoding."""
        c = Checks("sampling")
        c.at_least("n", self.n, 1)
        c.at_least("batch_size", self.batch_size, 1)
        c.at_least("temperature", self.temperature, 0)
        self.check_decoding(c)
        c.done()


@dataclass
class EvalRunConfig:
    """Seed, threads and output of `rlvr eval`."""

    seed: int = 0
    """Sampling seed."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS or torch's default."""
    out: str = ""
    """Write metrics (JSON) here, and the scored samples next to it as .samples.jsonl; '' = print only."""

    def validate(self) -> None:
        c = Checks("run")
        c.at_least("num_threads", self.num_threads, 0)
        c.done()


@dataclass
class EvalConfig:
    """Evaluate a policy on a task's held-out problems: `rlvr eval`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy (model.init_from = run directory / checkpoint / model folder)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Task and held-out problems (data.num_eval of them)."""
    sampling: EvalSamplingConfig = field(default_factory=EvalSamplingConfig)
    """Decoding."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine (hf or vllm)."""
    run: EvalRunConfig = field(default_factory=EvalRunConfig)
    """Seed, threads, output file."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Model judge of data.reward=judge."""

    def validate(self) -> None:
        """After the sections' own checks: evaluation reads only held-out problems; n > 1 greedy samples would
        be n copies of one answer (a flat pass@k)."""
        s = self.sampling
        if s.n > 1 and s.temperature == 0:
            raise ConfigError(f"sampling.n={s.n} with sampling.temperature=0 (greedy, the default): the {s.n} answers "
                              "of a problem would all be the same one, and pass@k flat; sample (sampling.temperature="
                              "1.0, say) or leave sampling.n=1")
        check_thinking_mode(self.data, self.sampling)
        self.data.check_problem_counts(("test",))
        self.rollout.check_placement(self.model)
        self.judge.check_reward(self.data)
