"""Trainers: SFT and the policy-gradient (GRPO family) loop, their configs, named recipes, the demo.

    from rlvr.train import TrainConfig, train, get_recipe
    from rlvr.config import load_config
    cfg = load_config(TrainConfig, "run.yaml", ["optim.lr=1e-4"], base=get_recipe("dr_grpo"))
    result = train(cfg)                      # TrainResult(run_dir, steps, last_metrics, eval)

See docs/training.md (the loop, batch arithmetic, resume) and docs/recipes.md.
"""

from rlvr.train.batching import BatchConfigError, BatchPlan, plan_batches
from rlvr.train.config import (
    AlgoConfig,
    DataConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SamplingConfig,
    SFTAlgoConfig,
    SFTConfig,
    TrainConfig,
)
from rlvr.train.demo import DemoConfig, DemoResult, run_demo
from rlvr.train.pg import TrainResult, accumulate_gradients, train, validate_train_config
from rlvr.train.recipes import RECIPES, get_recipe
from rlvr.train.sft import train_sft, validate_sft_config
from rlvr.train.tasks import TaskData, TaskDataError, load_task_data

__all__ = [
    "AlgoConfig",
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
