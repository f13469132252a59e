"""The stages and their configs: the API of rlvr.train, one stage function per command.

    stage function                       its config       the command
    train(cfg)                           TrainConfig      rlvr train     the policy-gradient loop (rlvr.train.pg)
    train_sft(cfg)                       SFTConfig        rlvr sft
    train_ei(cfg)                        EIConfig         rlvr ei        expert iteration
    distill(cfg)                         DistillConfig    rlvr distill   teacher traces, then SFT on them
    evaluate_policy(cfg)                 EvalConfig       rlvr eval
    filter_problems(cfg)                 FilterConfig     rlvr filter    difficulty filtering, decontamination
    run_pipeline(path_or_spec)           (a YAML file)    rlvr pipeline  stages in order, each one's output the next one's input
    run_demo(cfg)                        DemoConfig       rlvr demo

    from rlvr.config import load_config
    from rlvr.train import TrainConfig, train
    from rlvr.train.pg.recipes import get_recipe
    cfg = load_config(TrainConfig, "run.yaml", ["optim.lr=1e-4"], base=get_recipe("dr_grpo"))
    result = train(cfg)                      # TrainResult(run_dir, steps, last_metrics, eval)

Inside (docs/design.md, "Layers"): the configs (`config/`, torch-free, one module per stage), the run kit
every stage stands on (`session`, `policy`, `optimizer`, `precision`, `schedules`, `batching`, `tasks`,
`judge`, `run_settings`), the RL learner (`pg/`), and the stage modules above. Every other name has one
address, its module.

Names are imported lazily (as in rlvr.runs): `rlvr --help`, `rlvr grade` and the other commands import
rlvr.train.config for their help tables, and an eager import of the loops here pulled torch and
transformers (~2 s) into every command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "train": "rlvr.train.pg.loop",
    "TrainConfig": "rlvr.train.config",
    "train_sft": "rlvr.train.sft",
    "SFTConfig": "rlvr.train.config",
    "train_ei": "rlvr.train.ei",
    "EIConfig": "rlvr.train.config",
    "distill": "rlvr.train.distill",
    "DistillConfig": "rlvr.train.config",
    "evaluate_policy": "rlvr.train.evaluation",
    "EvalConfig": "rlvr.train.config",
    "filter_problems": "rlvr.train.filtering",
    "FilterConfig": "rlvr.train.config",
    "run_pipeline": "rlvr.train.pipeline",
    "run_demo": "rlvr.train.demo",
    "DemoConfig": "rlvr.train.config",
}

__all__ = [
    "train", "TrainConfig", "train_sft", "SFTConfig", "train_ei", "EIConfig", "distill", "DistillConfig",
    "evaluate_policy", "EvalConfig", "filter_problems", "FilterConfig", "run_pipeline", "run_demo", "DemoConfig",
]
assert __all__ == list(_EXPORTS)

if TYPE_CHECKING:
    from rlvr.train.config import (
        DemoConfig,
        DistillConfig,
        EIConfig,
        EvalConfig,
        FilterConfig,
        SFTConfig,
        TrainConfig,
    )
    from rlvr.train.demo import run_demo
    from rlvr.train.distill import distill
    from rlvr.train.ei import train_ei
    from rlvr.train.evaluation import evaluate_policy
    from rlvr.train.filtering import filter_problems
    from rlvr.train.pg.loop import train
    from rlvr.train.pipeline import run_pipeline
    from rlvr.train.sft import train_sft


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlvr.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
