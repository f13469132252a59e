"""`rlvr sft` and `rlvr demo` as a user runs them: the installed console script in a subprocess, a few
steps at toy size, then the run directories are checked (issue 5: "CLI tests run the real `rlvr`
command as a subprocess"; `rlvr train` is covered by test_cli_train.py and test_train_resume.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

TINY_MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64"]


def _rlvr(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "rlvr"  # the console script pyproject.toml installs
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlvr.cli"]
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off"}
    res = subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, f"{args} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_rlvr_sft_subprocess_writes_a_run_directory(tmp_path):
    run = tmp_path / "sft"
    _rlvr("sft", *TINY_MODEL, "data.digits=1", "data.num_train=80", "data.num_eval=8", "algo.batch_size=8",
          "run.steps=4", "run.eval_every=4", "run.checkpoint_every=4", "optim.lr=3e-3", "sampling.max_tokens=3",
          f"run.out_dir={run}", "--threads", "1")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["run"]["steps"] == 4 and cfg["optim"]["lr"] == 3e-3  # the overrides were resolved and saved
    rows = _rows(run / "metrics.jsonl")
    train_rows = [r for r in rows if "loss" in r]
    assert sorted({r["step"] for r in train_rows}) == [1, 2, 3, 4]
    assert all(r["loss"] > 0 and r["grad_norm"] >= 0 for r in train_rows)
    assert any("eval/accuracy" in r and 0 <= r["eval/accuracy"] <= 1 for r in rows if r["step"] == 4)
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000004"
    assert (run / "checkpoints" / "step_000004" / "model" / "config.json").exists()


def test_rlvr_demo_subprocess_at_toy_size(tmp_path):
    res = _rlvr("demo", f"out_dir={tmp_path}", "hidden_size=32", "num_train=600", "sft_examples=300",
                "num_eval=20", "sft_steps=10", "sft_eval_every=10", "rl_steps=2", "n_prompts=4", "group_size=4",
                "progress=false", "--threads", "1")
    # the before/after table and where the runs are, as README promises
    assert "after SFT" in res.stdout and "after GRPO" in res.stdout and "greedy accuracy" in res.stdout
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert set(summary) >= {"before", "after"}
    for side in ("before", "after"):
        assert 0 <= summary[side]["greedy/accuracy"] <= 1 and 0 <= summary[side]["sampled/accuracy"] <= 1
    rl_rows = [r for r in _rows(next(tmp_path.rglob("grpo/metrics.jsonl"))) if "reward/mean" in r]
    assert [r["step"] for r in rl_rows] == [1, 2]
    assert list(tmp_path.rglob("grpo/plots/*.png"))
