"""The stages (SFT, the policy-gradient loop, expert iteration, evaluation, difficulty filtering), their
configs, named recipes, the demo.

    from rlvr.train import TrainConfig, train, get_recipe
    from rlvr.config import load_config
    cfg = load_config(TrainConfig, "run.yaml", ["optim.lr=1e-4"], base=get_recipe("dr_grpo"))
    result = train(cfg)                      # TrainResult(run_dir, steps, last_metrics, eval)

See docs/training.md (the loop, batch arithmetic, resume) and docs/recipes.md.

Names are imported lazily (as in rlvr.runs): `rlvr --help`, `rlvr grade` and the other commands import
rlvr.train.config for their help tables, and an eager import of the loops here pulled torch and
transformers (~2 s) into every command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BatchConfigError": "rlvr.train.batching",
    "BatchPlan": "rlvr.train.batching",
    "plan_batches": "rlvr.train.batching",
    "AlgoConfig": "rlvr.train.config",
    "DataConfig": "rlvr.train.config",
    "EvalConfig": "rlvr.train.config",
    "ModelConfig": "rlvr.train.config",
    "OptimConfig": "rlvr.train.config",
    "RunConfig": "rlvr.train.config",
    "SamplingConfig": "rlvr.train.config",
    "SFTAlgoConfig": "rlvr.train.config",
    "SFTConfig": "rlvr.train.config",
    "TrainConfig": "rlvr.train.config",
    "EIConfig": "rlvr.train.config",
    "train_ei": "rlvr.train.ei",
    "Critic": "rlvr.train.critic",
    "ProblemSource": "rlvr.train.curriculum",
    "DemoConfig": "rlvr.train.config",
    "FilterConfig": "rlvr.train.config",
    "evaluate_policy": "rlvr.train.evaluation",
    "filter_problems": "rlvr.train.filtering",
    "DemoResult": "rlvr.train.demo",
    "run_demo": "rlvr.train.demo",
    "TrainResult": "rlvr.train.session",
    "accumulate_gradients": "rlvr.train.objective",
    "train": "rlvr.train.pg",
    "validate_train_config": "rlvr.train.pg",
    "RECIPES": "rlvr.train.recipes",
    "get_recipe": "rlvr.train.recipes",
    "train_sft": "rlvr.train.sft",
    "validate_sft_config": "rlvr.train.sft",
    "TaskData": "rlvr.train.tasks",
    "TaskDataError": "rlvr.train.tasks",
    "load_task_data": "rlvr.train.tasks",
}

__all__ = [
    "AlgoConfig",
    "Critic",
    "FilterConfig",
    "evaluate_policy",
    "filter_problems",
    "EIConfig",
    "ProblemSource",
    "train_ei",
    "BatchConfigError",
    "BatchPlan",
    "DataConfig",
    "DemoConfig",
    "DemoResult",
    "EvalConfig",
    "ModelConfig",
    "OptimConfig",
    "RECIPES",
    "RunConfig",
    "SFTAlgoConfig",
    "SFTConfig",
    "SamplingConfig",
    "TaskData",
    "TaskDataError",
    "TrainConfig",
    "TrainResult",
    "accumulate_gradients",
    "get_recipe",
    "load_task_data",
    "plan_batches",
    "run_demo",
    "train",
    "train_sft",
    "validate_sft_config",
    "validate_train_config",
]
assert set(__all__) == set(_EXPORTS)

if TYPE_CHECKING:
    from rlvr.train.batching import BatchConfigError, BatchPlan, plan_batches
    from rlvr.train.config import (
        AlgoConfig,
        DataConfig,
        EIConfig,
        EvalConfig,
        FilterConfig,
        ModelConfig,
        OptimConfig,
        RunConfig,
        SamplingConfig,
        SFTAlgoConfig,
        SFTConfig,
        TrainConfig,
    )
    from rlvr.train.critic import Critic
    from rlvr.train.curriculum import ProblemSource
    from rlvr.train.demo import DemoConfig, DemoResult, run_demo
    from rlvr.train.ei import train_ei
    from rlvr.train.evaluation import evaluate_policy
    from rlvr.train.filtering import filter_problems
    from rlvr.train.objective import accumulate_gradients
    from rlvr.train.pg import train, validate_train_config
    from rlvr.train.recipes import RECIPES, get_recipe
    from rlvr.train.session import TrainResult
    from rlvr.train.sft import train_sft, validate_sft_config
    from rlvr.train.tasks import TaskData, TaskDataError, load_task_data


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlvr.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
