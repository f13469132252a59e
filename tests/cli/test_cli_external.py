"""`rlvr train data.env=external` as a user runs it: the agent program (tests/fixtures/agents/mixed_agent.py, the
official openai client) per episode through the gateway. Episodes that crash or print a broken reward line are
reported, unscored (advantage 0, out of their group's baseline) and the run goes on; resume continues the run;
Ctrl-C twice while agents hang stops at once and leaves no agent running."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from helpers import TESTS
from helpers.cli import cli_env, rlvr_command, run_rlvr

pytest.importorskip("openai")
pytestmark = pytest.mark.cli
AGENT = f"{shlex.quote(sys.executable)} {TESTS / 'fixtures' / 'agents' / 'mixed_agent.py'}"
SMALL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
         "sampling.n_prompts=2", "sampling.group_size=2", "sampling.max_tokens=5", "data.num_eval=0",
         "run.progress=false", "run.log_samples_every=1", "run.num_log_samples=2"]


def _problems(path, modes, **meta):
    path.write_text("".join(json.dumps({"id": f"p{i}-{m}", "question": f"{i}+1=", "reference": str(i + 1),
                                        "meta": {"mode": m, **meta}}) + "\n" for i, m in enumerate(modes)))
    return path


def _rows(run, name="metrics.jsonl"):
    p = run / name
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def test_failed_episodes_are_reported_unscored_and_the_run_goes_on_then_resumes(tmp_path):
    data = _problems(tmp_path / "train.jsonl", ["ok", "crash", "silent", "garbage"])
    run = tmp_path / "run"
    args = ["train", "data.env=external", f"external.command={AGENT}", "external.timeout_s=60",
            f"data.train_path={data}", "data.task=arithmetic", *SMALL, f"run.out_dir={run}", "run.seed=3"]
    res = run_rlvr(*args, "run.steps=2", "run.checkpoint_every=1", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["gateway/error_frac"] for r in rows] == [0.5, 0.5]  # each step: one of its two groups failed
    samples = _rows(run, "samples.jsonl")  # the first episode of each group
    failed = [s for s in samples if s["status"] == "error"]
    assert len(failed) == 2 and all(s["advantage"] == 0.0 for s in failed)  # unscored: out of the baseline
    scored = [s for s in samples if s["status"] != "error"]
    assert {s["reference"] for s in scored} == {"1", "3"}  # the ok and silent problems
    assert any(s["reward"] == 0.5 for s in scored)  # the ok agent's own reward line
    # the run's reward error log names the failures
    err_log = (run / "reward_errors.jsonl").read_text() if (run / "reward_errors.jsonl").exists() else res.stderr
    assert "exited with status 2" in err_log and "not valid JSON" in err_log
    # resume: one more step, from the checkpoint of step 2
    res = run_rlvr("train", "--resume", str(run), "run.steps=3", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["step"] for r in _rows(run)] == [1, 2, 3]


def test_ctrl_c_twice_while_agents_hang_stops_at_once_and_kills_them(tmp_path):
    pids = tmp_path / "pids"
    data = _problems(tmp_path / "train.jsonl", ["hang", "hang"], pidfile=str(pids))
    run = tmp_path / "run"
    proc = subprocess.Popen([*rlvr_command(), "train", "data.env=external", f"external.command={AGENT}",
                             "external.timeout_s=300", f"data.train_path={data}", "data.task=arithmetic", *SMALL,
                             "sampling.n_prompts=1", "run.steps=5", f"run.out_dir={run}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        deadline = time.monotonic() + 120
        while not pids.exists() or len(pids.read_text().split()) < 2:  # both agents of the group are running
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the agents did not start"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 30  # not the agents' 300 s limit
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted again: the step in flight was abandoned" in err and "Traceback" not in err
    time.sleep(0.5)
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
