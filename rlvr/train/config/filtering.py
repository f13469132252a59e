"""`rlvr filter` (keep a task's training problems by pass rate): FilterConfig, which problems are kept
(FilterSelectConfig, each key with a flag: FILTER_FLAGS), the k samples' decoding (FilterSamplingConfig) and
the seed, threads and output (FilterRunConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.config import ConfigError
from rlvr.train.config.checks import Checks
from rlvr.train.config.data import DataConfig, check_thinking_mode
from rlvr.train.config.judge import refuse_judge
from rlvr.train.config.model import ModelConfig
from rlvr.train.config.sampling import DecodingConfig, RolloutConfig


@dataclass
class FilterSamplingConfig(DecodingConfig):
    """How the k answers per problem are sampled (k itself is filter.k)."""

    temperature: float = 1.0
    """Sampling temperature; pass rates are meant at the temperature you will train with (0 = greedy: one answer
    per problem, so filter.k and filter.no_reasoning_k must be 1)."""
    batch_size: int = 64
    """Problems per generate call (each with k samples; on CPU with the hf engine also at most 16384 tokens a
    call, rlvr.eval.CPU_EVAL_TOKENS); the progress bar advances per call."""

    def validate(self) -> None:
        c = Checks("sampling")
        c.at_least("batch_size", self.batch_size, 1)
        c.at_least("temperature", self.temperature, 0)
        self.check_decoding(c)
        c.done()


@dataclass
class FilterRunConfig:
    """Seed, threads and output of `rlvr filter`."""

    seed: int = 0
    """Sampling seed."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS or torch's default."""
    out_dir: str = "filtered"
    """Output directory: train.jsonl, pass_rates.jsonl, histogram.png, report.json, report.md."""
    overwrite: bool = False
    """Replace the files of an earlier filter in run.out_dir."""

    def validate(self) -> None:
        c = Checks("run")
        c.at_least("num_threads", self.num_threads, 0)
        c.need("out_dir", self.out_dir, bool(self.out_dir.strip()), "a directory path")
        c.done()


# The command-line flag of each filter.* key (`rlvr filter --k 8` sets filter.k); messages name both.
FILTER_FLAGS = {"k": "--k", "band": "--band", "no_reasoning_k": "--no-reasoning-k",
                "no_reasoning_max_rate": "--no-reasoning-max-rate", "decontaminate_against": "--decontaminate-against",
                "ngram": "--ngram", "overlap": "--overlap", "drop_multiple_choice": "--drop-multiple-choice"}


@dataclass
class FilterSelectConfig:
    """Which problems `rlvr filter` keeps: pass rates of k samples in a band, after the optional
    multiple-choice, decontamination and no-reasoning steps (docs/filtering.md). Each key has a flag of the same name."""

    k: int = 8
    """Samples per problem for its pass rate (a pass rate is a multiple of 1/k)."""
    band: str = "medium"
    """Pass rates kept: a name (medium = (0, 1), never-solved = [0, 0], not-always-solved = [0, 1),
    solved-at-least-once = (0, 1], all = [0, 1]) or an interval such as '[0.25, 0.75]' ('['/']' include the end,
    '('/')' exclude it)."""
    no_reasoning_k: int = 0
    """First sample this many answers per problem with a closed, empty think block and drop the problems solved
    without reasoning (Qwen3); 0 = off."""
    no_reasoning_max_rate: float = 0.0
    """With no_reasoning_k: drop a problem whose no-reasoning pass rate is above this (0 = solved once)."""
    decontaminate_against: list[str] = field(default_factory=list)
    """Drop training problems that overlap these evaluation problems: JSONL files (question / problem / prompt
    key) or 'eval' (the task's held-out split)."""
    ngram: int = 8
    """Decontamination: word n-gram size."""
    overlap: float = 0.5
    """Decontamination: drop when this share of a training problem's n-grams is in one evaluation problem
    (0 = any shared n-gram)."""
    drop_multiple_choice: bool = False
    """Drop multiple-choice questions before sampling (Kimi k1.5: a guessed option is no evidence of reasoning):
    options labelled (A), (B), (C) ... or 'A.' lines (rlvr.data.filters.multiple_choice)."""

    def validate(self) -> None:
        """Ranges, the band's syntax and that the evaluation files exist."""
        from pathlib import Path

        from rlvr.data.filters import Band  # rlvr.data costs `rlvr --help` time: only here

        c = Checks("filter")

        def bad(key: str, value: object, why: str) -> None:
            c.error(f"filter.{key} / {FILTER_FLAGS[key]} {value}: {why}")

        if self.k < 1:
            bad("k", self.k, "samples per problem must be >= 1")
        try:
            Band.parse(self.band)
        except ValueError as exc:
            c.error(f"filter.band / --band {exc}")
        if self.no_reasoning_k < 0:
            bad("no_reasoning_k", self.no_reasoning_k, "must be >= 0 (0 = off)")
        if not 0.0 <= self.no_reasoning_max_rate <= 1.0:
            bad("no_reasoning_max_rate", self.no_reasoning_max_rate, "must be in [0, 1]")
        if not all(s.strip() for s in self.decontaminate_against):
            bad("decontaminate_against", self.decontaminate_against, "each entry is a JSONL file or 'eval'")
        for path in self.decontaminate_against:  # its lines are read before the model loads (rlvr.train.filtering)
            if path.strip() and path != "eval" and not Path(path).is_file():
                bad("decontaminate_against", path, "is a directory, not a file" if Path(path).is_dir() else "no such file")
        if self.ngram < 1:
            bad("ngram", self.ngram, "must be >= 1")
        if not 0.0 <= self.overlap <= 1.0:
            bad("overlap", self.overlap, "must be in [0, 1]")
        c.done()


@dataclass
class FilterConfig:
    """Keep a task's training problems by pass rate: `rlvr filter` (rlvr.train.filtering.filter_problems)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy whose pass rates are measured (model.name or model.init_from)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Task and training problems (data.train_path or the task's generator, data.num_train of them)."""
    sampling: FilterSamplingConfig = field(default_factory=FilterSamplingConfig)
    """Decoding of the k samples per problem."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine (hf or vllm)."""
    filter: FilterSelectConfig = field(default_factory=FilterSelectConfig)
    """Samples per problem, the band kept, decontamination and the no-reasoning check."""
    run: FilterRunConfig = field(default_factory=FilterRunConfig)
    """Seed, threads, output directory."""

    def validate(self) -> None:
        """After the sections' own checks: greedy decoding gives one answer per problem, so k > 1 samples of it
        (filter.k, filter.no_reasoning_k) would be copies, and a pass rate 0 or 1."""
        refuse_judge(self.data, "rlvr filter")
        check_thinking_mode(self.data, self.sampling)
        if self.sampling.temperature == 0:
            for key in ("k", "no_reasoning_k"):
                k = getattr(self.filter, key)
                if k > 1:
                    raise ConfigError(f"filter.{key} / {FILTER_FLAGS[key]} {k} with sampling.temperature=0: greedy "
                                      f"answers of a problem are all the same, so its pass rate would be 0 or 1 "
                                      f"from {k} copies of one answer; sample (sampling.temperature > 0) or set "
                                      f"filter.{key}=1")
        self.data.check_problem_counts(("train",))
