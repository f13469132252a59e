"""Issue 37, item 8: a tool call that cannot be carried out is an observation for the policy (counted in
EpisodeLog.tool_errors), never an exception out of env.step that ends the episode (or, before the
rollout driver caught those, the training run). Each hostile turn of the issue (a directory or a file's
child as a write target, a NUL in a path or a git argument, a 300-character name) and its relatives on
the other tools (read, cat, grep, python, git diff / status, a path over the length limit, a lone
surrogate in model text, a sandbox run that turns a file into a directory) returns "error: <the
problem>", changes nothing in the workspace, raises no integrity flag, and the episode goes on: a
scripted agent that sends all of them and then the fix still earns reward 1."""

from __future__ import annotations

import os

import pytest

from rlvr.envs import make_env
from rlvr.envs.code_repair import CodeRepairEnv
from rlvr.envs.demos import play
from rlvr.models import build_char_tokenizer

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")

EXAMPLE = CodeRepairEnv.generate_examples(1, "test", 0)[0]  # calc.py, tests/test_calc.py
LONG = "a" * 300
DEEP = "d/" * 600 + "x.py"  # every name short, the whole path 1204 bytes

# (turn, a phrase its observation must contain)
HOSTILE = {
    "write_dot": ('<write path=".">x = 1\n</write>', ". is a directory"),
    "write_tests_dir": ('<write path="tests">x = 1\n</write>', "tests is a directory"),
    "write_under_a_file": ('<write path="calc.py/x">x = 1\n</write>', "calc.py is a file"),
    "write_nul_path": ('<write path="a\0b.py">x = 1\n</write>', "NUL"),
    "write_300_char_name": (f'<write path="{LONG}.py">x = 1\n</write>', "longer than 255 bytes"),
    "write_path_too_long": (f'<write path="{DEEP}">x = 1\n</write>', "longer than 1024 bytes"),
    "write_blank_path": ('<write path=" ">x = 1\n</write>', ". is a directory"),
    "git_diff_nul": ("<shell>git diff a\0b</shell>", "NUL"),
    "git_status_nul": ("<shell>git status a\0b</shell>", "NUL"),
    "git_diff_300_char_name": (f"<shell>git diff {LONG}</shell>", "longer than 255 bytes"),
    "read_nul": ("<read>a\0b</read>", "NUL"),
    "read_300_char_name": (f"<read>{LONG}</read>", "longer than 255 bytes"),
    "read_directory": ("<read>tests</read>", "tests is a directory"),
    "cat_300_char_name": (f"<shell>cat {LONG}</shell>", "longer than 255 bytes"),
    "cat_directory": ("<shell>cat tests</shell>", "tests is a directory"),
    "grep_300_char_name": (f"<shell>grep add {LONG}</shell>", "longer than 255 bytes"),
    "python_300_char_name": (f"<shell>python {LONG}</shell>", "longer than 255 bytes"),
}


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_failing_tool_call_is_an_error_observation(name):
    turn, phrase = HOSTILE[name]
    env = make_env("code_repair")
    try:
        env.reset(EXAMPLE)
        files = env._files()
        res = env.step(turn)  # must not raise
        assert phrase in res.observation, res.observation
        assert not res.done
        assert env.log.tool_errors == 1 and sum(env.log.tool_calls.values()) == 1
        assert env.log.flags == []  # a bad call, not an integrity hack
        assert env._files() == files  # nothing was written
        assert str(env.root) not in res.observation  # the episode directory stays out of the model's view
        # the episode goes on: the next call works
        assert env.step("<read>calc.py</read>").observation == EXAMPLE.meta["source"]
    finally:
        env.close()


def test_every_hostile_turn_then_the_fix_still_solves_the_episode(tok):
    """Through the real episode driver: all the failing calls, then the fix; reward 1, each failure counted."""
    fix = f'<write path="calc.py">{EXAMPLE.meta["fixed"]}</write>'
    turns = [HOSTILE[n][0] for n in sorted(HOSTILE)] + [fix, "<run_tests></run_tests>", "<submit></submit>"]
    ep = play(lambda: make_env("code_repair", max_turns=len(turns)), EXAMPLE, turns, tok, max_tokens_total=1 << 16)
    assert ep.log.tool_errors == len(HOSTILE), ep.log
    assert ep.reward.total == 1.0 and ep.reward.parts == {"hidden_tests": 1.0}, ep.reward
    assert ep.log.flags == [] and ep.log.tool_calls["submit"] == 1
    assert all(phrase in ep.rollout.text for _, phrase in HOSTILE.values())


def test_a_sandbox_run_that_turns_a_file_into_a_directory_is_applied_not_raised():
    """python FILE whose program replaces calc.py by a directory calc.py/ (and tests/ by a file): the run's
    files reach the workspace in order (deletions first), and a file the workspace cannot take is named."""
    prog = ('import os, shutil\nos.remove("calc.py")\nos.makedirs("calc.py")\nopen("calc.py/x", "w").write("1")\n'
            'p = "/".join(["d" * 200] * 6)\nos.makedirs(p)\nopen(p + "/f", "w").write("1")\n')
    env = make_env("code_repair")
    try:
        env.reset(EXAMPLE)
        env.step(f'<write path="h.py">{prog}</write>')
        res = env.step("<shell>python h.py</shell>")
        assert "not applied" in res.observation and "longer than 1024 bytes" in res.observation, res.observation
        assert env.log.tool_errors == 1
        assert sorted(env._files()) == ["calc.py/x", "h.py", "tests/test_calc.py"]
        res = env.step("<run_tests></run_tests>")  # calc is now a package directory without add: the tests fail
        assert "0 passed, 1 failed" in res.observation
    finally:
        env.close()


def test_text_utf8_cannot_encode_never_raises():
    """A lone surrogate in model text (a path, a file's text, python_tool code) and in a file name a sandbox
    run created (which the tokenizer would refuse in the observation)."""
    env = make_env("code_repair")
    try:
        env.reset(EXAMPLE)
        assert env.step('<write path="s\ud800.py">x = "\ud800"\n</write>').observation == "wrote s?.py"
        assert env._files()["s?.py"] == 'x = "?"\n'
        env.step('<write path="h.py">open(b"\\xff.py", "wb").write(b"1")\n</write>')
        env.step("<shell>python h.py</shell>")
        ls = env.step("<shell>ls</shell>").observation
        ls.encode("utf-8")  # no lone surrogate reaches the tokenizer
        assert "s?.py" in ls
    finally:
        env.close()
    env = make_env("python_tool")
    ex = env.generate_examples(1, "test", 0)[0]
    env.reset(ex)
    res = env.step("<python>print('\ud800')</python>")
    assert res.observation == "<out>?</out>" and env.log.tool_errors == 0
