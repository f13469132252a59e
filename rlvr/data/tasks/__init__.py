"""Task registry: `TASKS[name]` / `get_task(name)`. One module per task defines `TASK`."""

from __future__ import annotations

import importlib
import importlib.util

from rlvr.data.tasks.base import Task

# Task modules in rlvr/data/tasks/; a listed module that does not exist (yet) is skipped.
_TASK_MODULES = ("gsm8k", "math", "arithmetic", "countdown", "code", "steps")

TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add a task to the registry (name clash -> error)."""
    if task.name in TASKS and TASKS[task.name] is not task:
        raise ValueError(f"task {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


for _mod in _TASK_MODULES:
    if importlib.util.find_spec(f"rlvr.data.tasks.{_mod}") is not None:
        register_task(importlib.import_module(f"rlvr.data.tasks.{_mod}").TASK)


def get_task(name: str) -> Task:
    """Task by name; unknown name -> KeyError listing the known ones. `reasoning_gym:<dataset>` names one of
    reasoning-gym's generators (rlvr.data.tasks.reasoning_gym: built on first use, not registered up front)."""
    if isinstance(name, str) and name.startswith("reasoning_gym:"):
        from rlvr.data.tasks.reasoning_gym import rg_task

        return rg_task(name)
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}, or "
                       "reasoning_gym:<dataset>") from None


__all__ = ["TASKS", "Task", "get_task", "register_task"]
