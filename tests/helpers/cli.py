"""The installed `rlvr` console script in a subprocess, as a user runs it (tests/cli/), and the tiny sizes those
runs use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.digits=1", "data.num_train=40", "data.num_eval=4", "sampling.n_prompts=2", "sampling.group_size=2",
        "sampling.max_tokens=4"]


def rlvr_command() -> list[str]:
    """The console script pyproject.toml installs (or `python -m rlvr.cli` where it is absent)."""
    script = Path(sys.executable).parent / "rlvr"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rlvr.cli"]


def cli_env(**extra: str) -> dict:
    """This process's environment, one thread, no progress bars, no hub access, and `extra`."""
    return {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off", "HF_HUB_OFFLINE": "1", **extra}


def run_rlvr(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`rlvr ARGS...` in a subprocess (environment: cli_env(**env)), its output captured."""
    return subprocess.run([*rlvr_command(), *args], capture_output=True, text=True, env=cli_env(**env),
                          timeout=timeout)


def refused(res: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2 with exactly one stderr line, `error: ...`, containing every needle (a "loading model" status
    line before it aside); returns it."""
    lines = [x for x in res.stderr.splitlines() if x.strip() and not x.startswith("loading model")]
    assert res.returncode == 2, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]
