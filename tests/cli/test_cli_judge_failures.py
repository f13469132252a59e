"""Issue 36, item 4: an unreachable model judge is never silent. `rlvr train data.reward=judge judge.url=<a closed
port>` prints one line at the first failure (judge.url and the reason) and stops at the first step where most
judge requests failed (`error: ...`, exit 1, no traceback); it used to train to the end on the symbolic
fallback with judge/failures 148 of 148 and exit 0. `rlvr eval` with such a judge says so in a line. Each runs
the installed `rlvr` script in a subprocess (marker cli: `make test-cli`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.digits=1", "data.num_train=40", "data.num_eval=4", "sampling.n_prompts=2", "sampling.group_size=4",
        "sampling.max_tokens=4"]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rlvr(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "rlvr"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlvr.cli"]
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off"}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


def test_train_with_an_unreachable_judge_says_so_and_stops(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    run = tmp_path / "run"
    res = _rlvr("train", *TINY, "data.reward=judge", f"judge.url={url}", "judge.model=m", "run.steps=3",
                f"run.out_dir={run}", cwd=tmp_path)
    out = f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    assert res.returncode == 1, out
    assert "Traceback" not in res.stderr + res.stdout, out
    lines = res.stderr.splitlines()
    # the first failure: one line naming judge.url and the reason
    said = [x for x in lines if x.startswith("warning: the judge failed")]
    assert len(said) == 1, out
    assert f"judge.url={url}" in said[0] and "cannot reach the judge: Connection refused" in said[0], said[0]
    # then the stop: one `error:` line, at step 1, before any update
    errors = [x for x in lines if x.startswith("error: ")]
    assert len(errors) == 1, out
    for needle in ("step 1", "judge requests failed", f"judge.url={url}", "cannot reach the judge"):
        assert needle in errors[0], (needle, errors[0])
    assert not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip()


def test_eval_with_an_unreachable_judge_says_so(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    # the setup of test_judge_train.py's eval test: a tiny model whose greedy responses have answers to judge
    res = _rlvr("eval", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "data.digits=1",
                "data.num_eval=6", "sampling.max_tokens=3", "data.reward=judge",
                f"judge.url={url}", f"run.out={tmp_path / 'e.json'}", cwd=tmp_path)
    out = f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    assert res.returncode == 0 and "Traceback" not in res.stderr + res.stdout, out
    said = [x for x in res.stderr.splitlines() if "judge requests failed" in x]
    assert len(said) == 1, out
    assert f"judge.url={url}" in said[0] and "cannot reach the judge: Connection refused" in said[0], said[0]
    assert "judge.fallback=symbolic" in said[0], said[0]
