"""Environments for multi-turn (agent) rollouts: the interface (rlvr.envs.base), the rollout
driver (rlvr.envs.rollout), the trainer glue (rlvr.envs.task) and the built-in environments:
calculator / python_tool (arithmetic word problems with a tool) and code_repair (a git repo in a
sandbox directory, tools, hidden tests, integrity detectors). See docs/agents.md."""

import importlib

from rlvr.envs.base import (
    ENVIRONMENTS,
    INTEGRITY_POLICIES,
    Environment,
    EpisodeLog,
    Flag,
    StepResult,
    ToolError,
    get_env,
    make_env,
    register_env,
)
from rlvr.envs.format import CHAT_MODES, TurnFormat
from rlvr.envs.rollout import Episode, episode_metrics, run_episodes

for _mod in ("calculator", "code_repair"):
    try:
        importlib.import_module(f"rlvr.envs.{_mod}")
    except ModuleNotFoundError as _exc:  # a module not written yet
        if _exc.name != f"rlvr.envs.{_mod}":
            raise

__all__ = [
    "CHAT_MODES",
    "ENVIRONMENTS",
    "INTEGRITY_POLICIES",
    "Environment",
    "Episode",
    "EpisodeLog",
    "Flag",
    "StepResult",
    "ToolError",
    "TurnFormat",
    "episode_metrics",
    "get_env",
    "make_env",
    "register_env",
    "run_episodes",
]
