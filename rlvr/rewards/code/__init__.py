"""Code rewards: run candidate programs against hidden tests in a sandbox, and guard the reward
against hacking. See docs/code_rewards.md for the task format, the extraction rules, what the
isolation guarantees (and what it does not), and the integrity flags.

    from rlvr.rewards.code import code_reward, run_tests, task_from_meta
    reward = code_reward(response, example)      # example.meta holds the task (tests, limits)
    report = run_tests(program, task_from_meta(meta))   # per-test typed results + integrity flags

Registered reward names (rlvr.rewards.get_reward_fn): "code" (fraction of tests passed),
"code_all_or_nothing", "code_format". Integrity flags zero the reward by default; use
make_code_reward(integrity="report") to only report them.
"""

from rlvr.rewards.code.extract import extract_code, is_empty_program
from rlvr.rewards.code.rewards import (
    CODE_REWARD_FUNCTIONS,
    INTEGRITY_POLICIES,
    TEST_AGGREGATES,
    code_all_or_nothing,
    code_format_reward,
    code_reward,
    make_code_reward,
    score_code,
)
from rlvr.rewards.code.runner import ExecutionReport, IntegrityFlag, TestResult, TestStatus, run_tests
from rlvr.rewards.code.sandbox import Isolation, SandboxLimits, isolation
from rlvr.rewards.code.task import CallCase, CodeTask, CodeTaskError, IOCase, task_from_meta, values_equal

__all__ = [
    "CODE_REWARD_FUNCTIONS",
    "INTEGRITY_POLICIES",
    "TEST_AGGREGATES",
    "CallCase",
    "CodeTask",
    "CodeTaskError",
    "ExecutionReport",
    "IOCase",
    "IntegrityFlag",
    "Isolation",
    "SandboxLimits",
    "TestResult",
    "TestStatus",
    "code_all_or_nothing",
    "code_format_reward",
    "code_reward",
    "extract_code",
    "is_empty_program",
    "isolation",
    "make_code_reward",
    "run_tests",
    "score_code",
    "task_from_meta",
    "values_equal",
]
