"""Config dataclasses of the stages: one torch-free module per stage, composed of small shared sections.

    checks      the validation kit: Checks (one section's problems, raised together), changed, default_of
    model       ModelConfig (the policy), TeacherConfig, resuming
    data        DataConfig (task, files, reward, online filter, environment), check_thinking_mode
    judge       JudgeConfig (the model judge of data.reward=judge), refuse_judge
    external    ExternalConfig (agent programs behind the rollout gateway: data.env=external / verifiers:<env>)
    sampling    DecodingConfig (the keys every sampling section shares), SamplingConfig, RolloutConfig
    algo        AlgoConfig (the policy-gradient objective), its tables and algo-only rules
    run         OptimConfig, RunConfig, DistributedConfig
    pg          TrainConfig (`rlvr train`) and the rules across its sections
    sft         SFTConfig (`rlvr sft`), SFTAlgoConfig, SFTSamplingConfig
    ei          EIConfig (`rlvr ei`), EIAlgoConfig
    distill     DistillConfig (`rlvr distill`), TracesConfig
    evaluation  EvalConfig (`rlvr eval`), EvalSamplingConfig, EvalRunConfig
    filtering   FilterConfig (`rlvr filter`), FilterSelectConfig, FilterSamplingConfig, FilterRunConfig, FILTER_FLAGS
    demo        DemoConfig (`rlvr demo`)

Every field has a one-line docstring on the line after it (an attribute docstring); `rlvr.config`
reads those for `--help` and `rlvr train --help-config`. A closed set of choices is a `Literal` field
(the help lists the choices; the loader refuses another value naming the key, file and line). A rule
about one section's keys is that section's `validate()`, which reports all its problems at once
(checks.Checks); a rule that involves several sections (the objective with the sampling keys, the
batch-size arithmetic, what asynchronous rollouts combine with) is its stage config's `validate()`
(TrainConfig, SFTConfig, EIConfig, EvalConfig, ...): the one home of each rule. rlvr.config runs them
right after parsing, and each trainer again for a config built in Python, before any model loads.
The sampling sections share their decoding keys through DecodingConfig.

torch-free on import (`rlvr --help` reads the help tables): the built-in names of the rlvr.algo
registries come from rlvr.algo.names (torch-free), and the registries users add to (a loss, an
advantage, a task, an environment) are imported inside the checks that read them (tests/architecture/test_import_graph.py
checks that importing this package imports no torch).

The table below (`__all__`) is the config's public API, the stage configs and their sections: `from
rlvr.train.config import X`. Everything else (the rules, the tables of closed choices, the checks kit) has
one address, its module above.
"""

from __future__ import annotations

from rlvr.train.config.algo import AlgoConfig
from rlvr.train.config.data import SYNTHETIC_TRAIN, DataConfig
from rlvr.train.config.demo import DemoConfig
from rlvr.train.config.distill import DistillConfig, TracesConfig
from rlvr.train.config.ei import EIAlgoConfig, EIConfig
from rlvr.train.config.evaluation import EvalConfig, EvalRunConfig, EvalSamplingConfig
from rlvr.train.config.external import ExternalConfig
from rlvr.train.config.filtering import (
    FILTER_FLAGS,
    FilterConfig,
    FilterRunConfig,
    FilterSamplingConfig,
    FilterSelectConfig,
)
from rlvr.train.config.judge import JudgeConfig
from rlvr.train.config.model import ModelConfig, TeacherConfig, resuming
from rlvr.train.config.pg import TrainConfig
from rlvr.train.config.run import DistributedConfig, OptimConfig, RunConfig
from rlvr.train.config.sampling import DecodingConfig, RolloutConfig, SamplingConfig
from rlvr.train.config.sft import SFTAlgoConfig, SFTConfig, SFTSamplingConfig

__all__ = [
    # the stages
    "TrainConfig",
    "SFTConfig",
    "EIConfig",
    "DistillConfig",
    "EvalConfig",
    "FilterConfig",
    "DemoConfig",
    # the shared sections
    "ModelConfig",
    "TeacherConfig",
    "DataConfig",
    "JudgeConfig",
    "DecodingConfig",
    "SamplingConfig",
    "RolloutConfig",
    "OptimConfig",
    "RunConfig",
    "DistributedConfig",
    # the stages' own sections
    "AlgoConfig",
    "ExternalConfig",
    "SFTAlgoConfig",
    "SFTSamplingConfig",
    "EIAlgoConfig",
    "TracesConfig",
    "EvalSamplingConfig",
    "EvalRunConfig",
    "FilterSelectConfig",
    "FilterSamplingConfig",
    "FilterRunConfig",
    # the rest
    "FILTER_FLAGS",
    "SYNTHETIC_TRAIN",
    "resuming",
]
