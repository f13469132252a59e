"""Issue 25, item 1: a reward function of the user's (data.reward='module:function') that raises is
never silent. The first occurrence of each distinct message is printed (the reward, the exception,
the example) and written to the run directory (reward_errors.jsonl); a step where most rewards are
errors stops `rlvr train` naming the reward and the message (exit 1, one `error:` line, no
traceback); a reward that raises on some responses only lets the run go on; `rlvr eval` reports the
error count and the first message. Each runs the installed `rlvr` script in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.digits=1", "data.num_train=40", "data.num_eval=4", "sampling.n_prompts=2", "sampling.group_size=2",
        "sampling.max_tokens=4"]

ALWAYS = ("def score(response, example):\n"
          "    raise ValueError('reference has no unit')\n")
# raises on the first of every four calls: at most half of a step's rewards, always the same message
SOMETIMES = ("from rlvr.rewards.types import Reward, Status\n"
             "calls = [0]\n"
             "def score(response, example):\n"
             "    calls[0] += 1\n"
             "    if calls[0] % 4 == 1:\n"
             "        raise KeyError('unit')\n"
             "    return Reward(1.0, {}, Status.CORRECT)\n")


def _rlvr(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "rlvr"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlvr.cli"]
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off", "PYTHONPATH": str(cwd)}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_a_reward_that_always_raises_stops_the_run_naming_it(tmp_path):
    (tmp_path / "my_checker.py").write_text(ALWAYS)
    run = tmp_path / "run"
    res = _rlvr("train", *TINY, "data.reward=my_checker:score", "run.steps=3", f"run.out_dir={run}", cwd=tmp_path)
    assert res.returncode == 1, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    assert "Traceback" not in res.stderr + res.stdout
    errors = [x for x in res.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    for needle in ("step 1", "data.reward='my_checker:score'", "ValueError: reference has no unit", "4 of 4"):
        assert needle in errors[0], (needle, errors[0])
    # the first occurrence was printed once, naming the reward, the exception and the example
    first = [x for x in res.stderr.splitlines() if "reward my_checker:score raised" in x]
    assert len(first) == 1 and "ValueError: reference has no unit" in first[0] and "example" in first[0], res.stderr
    (row,) = _jsonl(run / "reward_errors.jsonl")
    assert row["step"] == 1 and row["reward"] == "my_checker:score" and row["count"] == 4
    assert row["message"] == "ValueError: reference has no unit" and row["example_id"]
    assert (run / "config.yaml").exists()


def test_a_reward_that_raises_on_some_responses_lets_the_run_go_on(tmp_path):
    (tmp_path / "my_checker.py").write_text(SOMETIMES)
    run = tmp_path / "run"
    res = _rlvr("train", *TINY, "data.reward=my_checker:score", "run.steps=3", f"run.out_dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    first = [x for x in res.stderr.splitlines() if "reward my_checker:score raised" in x]
    assert len(first) == 1 and "KeyError: 'unit'" in first[0], res.stderr  # printed once, not every step
    rows = _jsonl(run / "reward_errors.jsonl")
    assert rows and {r["message"] for r in rows} == {"KeyError: 'unit'"}
    assert rows[0]["step"] == 1 and sum(r["count"] for r in rows) == sum(
        m["verifier/errors"] for m in _jsonl(run / "metrics.jsonl"))


def test_eval_reports_the_reward_errors_and_the_first_message(tmp_path):
    (tmp_path / "my_checker.py").write_text(ALWAYS)
    res = _rlvr("eval", *TINY[:5], "data.num_eval=3", "sampling.max_tokens=4", "data.reward=my_checker:score",
                cwd=tmp_path)
    assert "Traceback" not in res.stderr + res.stdout
    out = res.stdout
    assert "reward errors: 3 of 3 responses" in out, out
    assert "ValueError: reference has no unit" in out, out
