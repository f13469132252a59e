"""`rlvr distill` (offline distillation: a teacher's verified answers as the student's SFT data): DistillConfig
and which teacher answers are kept (TracesConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from rlvr.config import ConfigError
from rlvr.train.config.checks import Checks
from rlvr.train.config.data import DataConfig, check_thinking_mode, refuse_score_while_generating
from rlvr.train.config.judge import refuse_judge
from rlvr.train.config.model import ModelConfig, TeacherConfig
from rlvr.train.config.run import OptimConfig, RunConfig
from rlvr.train.config.sampling import RolloutConfig, SamplingConfig
from rlvr.train.config.sft import SFTAlgoConfig, SFTConfig, SFTSamplingConfig


@dataclass
class TracesConfig:
    """Which teacher answers `rlvr distill` keeps as the student's SFT data (rlvr.train.distill)."""

    samples: int = 4
    """Teacher answers sampled per training problem (sampling.temperature > 0 for more than one)."""
    max_per_question: int = 1
    """Keep at most this many verified answers per problem (after de-duplication, in sample order); 0 = all."""
    dedup: bool = True
    """Keep a verified answer once per problem when several samples have the same text."""
    problems_per_call: int = 32
    """Training problems per teacher generate call (each with `samples` answers)."""
    keep_unverified: bool = False
    """Keep every teacher answer, verified or not (the lecture's plain imitation; default: verified only)."""

    def validate(self) -> None:
        c = Checks("traces")
        c.at_least("samples", self.samples, 1)
        c.at_least("max_per_question", self.max_per_question, 0)
        c.at_least("problems_per_call", self.problems_per_call, 1)
        c.done()


@dataclass
class DistillConfig:
    """Offline distillation: a teacher answers the training problems, its verified answers are kept, the student
    is fine-tuned on them: `rlvr distill` (rlvr.train.distill)."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(disable_dropout=False))
    """The student (fine-tuned as `rlvr sft` does)."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The teacher that writes the traces (teacher.model is required)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The task: its training problems are what the teacher answers; its held-out ones evaluate the student."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=1.0))
    """The teacher's decoding (max_tokens, temperature, stop, ...; n_prompts and group_size are not read: see
    traces.*); max_tokens also bounds the student's evaluation."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine of the teacher's sampling and of the student's evaluation."""
    traces: TracesConfig = field(default_factory=TracesConfig)
    """Which teacher answers are kept."""
    algo: SFTAlgoConfig = field(default_factory=SFTAlgoConfig)
    """The student's SFT objective and batching."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=20, schedule="cosine"))
    """The student's optimizer."""
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="runs/distill", steps=400))
    """Run directory (traces.jsonl and the student's run in student/) and the SFT steps."""

    def validate(self) -> None:
        refuse_judge(self.data, "rlvr distill")
        refuse_score_while_generating(self.data, "rlvr distill")
        check_thinking_mode(self.data, self.sampling, "rlvr distill")
        if not self.teacher.model:
            raise ConfigError("teacher.model is required: the folder, run directory, checkpoint or hub id of the "
                              "model whose answers the student learns from")
        if self.data.sft_path:
            raise ConfigError("data.sft_path: `rlvr distill` writes the student's SFT pairs itself (traces.jsonl); "
                              "to fine-tune on a file of pairs use `rlvr sft data.sft_path=...`")
        if self.traces.samples > 1 and self.sampling.temperature == 0:
            raise ConfigError(f"traces.samples={self.traces.samples} with sampling.temperature=0: greedy answers of a "
                              "problem are all the same; sample (temperature > 0) or traces.samples=1")
        self.data.check_problem_counts(("train", "test"))
        self.rollout.check_placement(self.model)
        self.sft_config("traces.jsonl").validate()

    def sft_config(self, traces_path: str) -> SFTConfig:
        """The student's `rlvr sft` config: these sections with data.sft_path = the traces and its run directory
        RUN/student."""
        s = self.sampling
        sft_sampling = SFTSamplingConfig(top_p=s.top_p, max_tokens=s.max_tokens, stop=list(s.stop),
                                         keep_stop=s.keep_stop, thinking_budget=s.thinking_budget,
                                         stop_thinking_text=s.stop_thinking_text)
        return SFTConfig(model=self.model, data=replace(self.data, sft_path=traces_path), sampling=sft_sampling,
                         rollout=self.rollout, algo=self.algo, optim=self.optim,
                         run=replace(self.run, out_dir=str(Path(self.run.out_dir) / "student")))
