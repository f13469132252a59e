"""What a run reports and leaves behind (issue 16, "the first hour", the items that involve a run, the
trainers' side): a task without a held-out set trains and says it is not evaluated; a diverging run stops
naming the step and keeps its last good checkpoint; the run directory appears only when the run starts (a
failed start does not block the rerun); --resume says where it resumes, records the new config, refuses to
move the run, and has nothing to do on a finished run; SFT writes samples; a fully filtered DAPO step says why
there is no loss. Each runs the installed `rlvr` script in a subprocess, as a user does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.shared_data import require_shared

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.digits=1", "data.num_train=40", "data.num_eval=4", "sampling.n_prompts=2", "sampling.group_size=2",
        "sampling.max_tokens=4"]
SFT_TINY = [x for x in TINY if not x.startswith(("sampling.n_prompts", "sampling.group_size"))]  # RL-only keys


def _rlvr(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "rlvr"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlvr.cli"]
    e = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off", **(env or {})}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=e, timeout=300, cwd=cwd)


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_gsm8k_without_eval_path_trains_and_says_it_is_not_evaluated(tmp_path):
    """Item 1: no data.eval_path used to end in `TypeError: unsupported format string passed to
    NoneType.__format__` after the whole run."""
    data = require_shared("data", "gsm8k")  # development data (../shared): skipped in a clone
    found = [p for p in sorted(data.glob("*.jsonl")) if "train" in p.name]
    if not found:
        pytest.skip(f"no GSM8K training file under {data} (../shared is for development only)")
    train = found[0]
    run = tmp_path / "run"
    res = _rlvr("train", *TINY[:4], "data.task=gsm8k", f"data.train_path={train}", "data.template=r1_zero",
                "data.num_train=8", "sampling.n_prompts=2", "sampling.group_size=2", "sampling.max_tokens=4",
                "run.steps=1", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    assert "no held-out problems (set data.eval_path)" in res.stderr
    assert "held-out: not evaluated" in res.stdout and "Traceback" not in res.stderr
    assert not any(k.startswith("eval/") for k in _rows(run)[-1])


def test_a_reward_function_of_your_own_from_the_config(tmp_path):
    """data.reward='module:function': a checker of the user's, importable (here via PYTHONPATH), scores
    the rollouts of `rlvr train`; its parts reach the metrics, and a response it crashes on scores 0
    (an ERROR status) instead of ending the run."""
    (tmp_path / "my_checker.py").write_text(
        "from rlvr.rewards.types import Reward, Status\n"
        "def digits(response, example):\n"
        "    if '9' in response:\n"
        "        raise RuntimeError('checker bug')\n"
        "    share = sum(c.isdigit() for c in response) / max(len(response), 1)\n"
        "    return Reward(share, {'digits': share}, Status.CORRECT if share > 0.5 else Status.INCORRECT)\n")
    run = tmp_path / "run"
    res = _rlvr("train", *TINY, "data.reward=my_checker:digits", "run.steps=2", f"run.out_dir={run}",
                cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines() if x.strip()]
    assert samples
    for r in rows:
        assert 0.0 <= r["reward/digits"] <= 1.0
    for smp in samples:  # every logged sample scored by the user's function (or counted as its error)
        text = smp["response"]
        want = 0.0 if "9" in text else sum(c.isdigit() for c in text) / max(len(text), 1)
        assert smp["reward"] == pytest.approx(want), smp
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["reward"] == "my_checker:digits"


def test_a_diverging_run_stops_naming_the_step_and_keeps_its_last_checkpoint(tmp_path):
    """Item 3: a run whose loss becomes NaN used to train on NaN for every step, save a NaN
    checkpoint and exit 0. A huge learning rate without clipping makes the logits overflow."""
    run = tmp_path / "run"
    res = _rlvr("train", *TINY, "data.reward=language", "optim.lr=1e30", "optim.grad_clip=0", "run.steps=6",
                "run.checkpoint_every=1", f"run.out_dir={run}", "run.seed=1")
    assert res.returncode == 1, (res.stdout, res.stderr)
    line = [x for x in res.stderr.splitlines() if x.startswith("error: ")][-1]
    assert "step " in line and ("nan" in line or "inf" in line), line
    bad_step = int(line.split("step ")[1].split(":")[0])
    saved = sorted((run / "checkpoints").glob("step_*"))
    # every checkpoint is from before the step that diverged; none holds non-finite weights
    assert all(int(p.name.split("_")[1]) < bad_step for p in saved)
    assert "Traceback" not in res.stderr


def test_failed_start_leaves_nothing_that_blocks_the_rerun(tmp_path):
    """Item 6: a directory holding a run that stopped before its first checkpoint (a crash, an
    early Ctrl-C) is started over with a note; a real run with a checkpoint is refused at once,
    naming --resume and run.overwrite=true."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')  # what an interrupted start leaves
    res = _rlvr("train", *TINY, "run.steps=1", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    assert "stopped before its first checkpoint; starting it over" in res.stderr
    t0 = time.perf_counter()
    again = _rlvr("train", *TINY, "run.steps=1", f"run.out_dir={run}")
    assert again.returncode == 2 and "run.overwrite=true" in again.stderr and f"--resume {run}" in again.stderr
    assert "Traceback" not in again.stderr
    assert time.perf_counter() - t0 < 60  # refused before any model work (a loose bound: loaded CI)


def test_resume_says_where_records_new_steps_and_has_nothing_to_do_when_finished(tmp_path):
    """Item 10."""
    run = tmp_path / "run"
    assert _rlvr("train", *TINY, "run.steps=1", f"run.out_dir={run}").returncode == 0
    res = _rlvr("train", "--resume", str(run), "run.steps=2")
    assert res.returncode == 0, res.stderr
    assert f"resuming {run} at step 1 of 2" in res.stderr
    assert yaml.safe_load((run / "config.yaml").read_text())["run"]["steps"] == 2  # the config as resumed
    assert [r["step"] for r in _rows(run)] == [1, 2]
    done = _rlvr("train", "--resume", str(run))
    assert done.returncode == 0 and "nothing to do" in done.stderr and "run.steps=2" in done.stderr
    moved = _rlvr("train", "--resume", str(run), f"run.out_dir={tmp_path / 'elsewhere'}")
    assert moved.returncode == 2 and "cannot move it" in moved.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_tiny_size_keys_with_init_from_are_reported_as_ignored(tmp_path):
    """Item 10: `model.hidden_size=...` with `model.init_from` used to be silently ignored while
    config.yaml recorded it."""
    src = tmp_path / "src"
    assert _rlvr("sft", *SFT_TINY, "run.steps=1", f"run.out_dir={src}").returncode == 0
    res = _rlvr("train", *TINY[1:], "model.hidden_size=48", f"model.init_from={src}", "run.steps=1",
                f"run.out_dir={tmp_path / 'rl'}")
    assert res.returncode == 0, res.stderr
    assert "model.hidden_size" in res.stderr and "ignored with model.init_from" in res.stderr


def test_sft_writes_samples_and_says_what_it_loads(tmp_path):
    """Item 13: SFT's samples.jsonl stayed empty; commands printed nothing while loading."""
    run = tmp_path / "sft"
    res = _rlvr("sft", *SFT_TINY, "run.steps=2", "run.eval_every=1", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    assert "loading model tiny" in res.stderr
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2} and all(s["source"] == "eval" for s in samples)
    assert {"prompt", "response", "reference", "status"} <= set(samples[0])


def test_dapo_with_every_group_filtered_says_why_there_is_no_loss(tmp_path):
    """Item 13: `--recipe dapo` on a fresh model showed loss=None with no hint (every group had the
    same reward 0, and dynamic sampling drops such groups)."""
    res = _rlvr("train", "--recipe", "dapo", *TINY, "run.steps=1", f"run.out_dir={tmp_path / 'r'}")
    assert res.returncode == 0, res.stderr
    assert "filter_zero_variance dropped them all: no update" in res.stderr
