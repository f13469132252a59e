"""Data: the Example record, one module per task (rows -> Example, prompt, checker), JSONL/HF
loaders with validation, prompt templates and synthetic tasks with held-out splits."""

from rlvr.data.example import Example
from rlvr.data.filters import filter_by_pass_rate, pass_rates
from rlvr.data.jsonl import DataError, iter_jsonl, read_jsonl, write_jsonl
from rlvr.data.loaders import (
    SFTExample,
    load_gsm8k,
    load_hf,
    load_math,
    load_sft,
    load_task_file,
    sft_examples,
)
from rlvr.data.task_data import TaskData, TaskDataError
from rlvr.data.tasks import TASKS, Task, get_task, register_task
from rlvr.data.templates import PROMPT_TEMPLATES, render_prompt, template_text

__all__ = [
    "DataError",
    "Example",
    "PROMPT_TEMPLATES",
    "SFTExample",
    "TASKS",
    "filter_by_pass_rate",
    "pass_rates",
    "Task",
    "TaskData",
    "TaskDataError",
    "get_task",
    "iter_jsonl",
    "load_gsm8k",
    "load_hf",
    "load_math",
    "load_sft",
    "load_task_file",
    "read_jsonl",
    "register_task",
    "render_prompt",
    "sft_examples",
    "template_text",
    "write_jsonl",
]
