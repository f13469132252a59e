"""The R1-Zero path learns on CPU, through the real CLI: an SFT warm-up that teaches the r1_zero
format, then `rlvr train` with the r1_zero template and its `</answer>` stop (nothing set by hand)
gets non-zero format and answer rewards from step 1, and GRPO raises held-out accuracy.

Task: sums of three single digits. The SFT file mixes two kinds of rows for the same training
problems: "3+5+7=" -> "15" (a short context, where a 2-layer model learns to attend to the digits
within a few hundred steps) and the r1_zero prompt -> " </think> <answer>15</answer>" (the format).
With r1_zero rows alone the 445-token prompt dilutes attention so much that the same model stays
near chance (6% after 200 steps, measured); the digits are the only digits in either prompt, so
what is learned on the short rows carries over. Evaluation and RL see only r1_zero prompts.

Measured with the test's kernels pinned (tests/conftest.py), 1 thread: SFT greedy held-out 6% at
step 50, 21% at 250 (0% at 300: a format wobble of the constant lr), 36% at 450 with format rate
1.0; GRPO step 1 format 0.95, answer 0.19; held-out 75% at step 10, 72.5% at step 20. Slow: 20
minutes on 2 heavily loaded cores, about 8 unloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.data import get_task
from rlvr.data.templates import render_prompt

pytestmark = pytest.mark.slow

MODEL = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.intermediate_size=128",
         "model.tie_embeddings=true"]
DATA = ["data.task=arithmetic", "data.digits=1", "data.operands=3", "data.num_train=600", "data.num_eval=80",
        "data.template=r1_zero"]


def _rlvr(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "rlvr"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlvr.cli"]
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off"}
    res = subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=1800)
    assert res.returncode == 0, res.stderr
    return res


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_r1_zero_grpo_after_a_format_warm_up(tmp_path):
    sft_file = tmp_path / "sft.jsonl"
    with sft_file.open("w") as f:
        for ex in get_task("arithmetic").generate(600, "train", 1234, digits=1, operands=3):
            f.write(json.dumps({"prompt": ex.question, "response": ex.reference}) + "\n")
            f.write(json.dumps({"prompt": render_prompt(ex.question, "r1_zero"),
                                "response": f" </think> <answer>{ex.reference}</answer>"}) + "\n")
    sft, rl = tmp_path / "sft", tmp_path / "rl"
    _rlvr("sft", *MODEL, *DATA, f"data.sft_path={sft_file}", "run.steps=450", "algo.batch_size=32",
          "algo.max_length=512", "optim.lr=3e-3", "optim.schedule=constant", "optim.warmup_steps=10",
          "sampling.max_tokens=32", "run.eval_every=50", f"run.out_dir={sft}")
    start = _rows(sft)[-1]
    assert start["eval/format_rate"] == 1.0
    assert 0.15 <= start["eval/accuracy"] <= 0.85, start  # partly right: signal to learn from, room to grow

    _rlvr("train", "--recipe", "grpo", *DATA, f"model.init_from={sft}", "run.steps=20", "sampling.n_prompts=16",
          "sampling.group_size=8", "sampling.max_tokens=32", "optim.lr=3e-4", "algo.kl_coef=0",
          "run.eval_every=10", f"run.out_dir={rl}")
    rows = _rows(rl)
    cfg = (rl / "config.yaml").read_text()
    assert "stop: []" in cfg  # nothing set by hand: the stop string came from the task
    first = rows[0]
    assert first["reward/format"] > 0.5 and first["reward/answer"] > 0.05, first
    samples = [json.loads(x) for x in (rl / "samples.jsonl").read_text().splitlines()]
    assert any(s["response"].endswith("</answer>") for s in samples)  # the stop string is kept
    end = rows[-1]["eval/accuracy"]
    assert end >= start["eval/accuracy"] + 0.10, (start["eval/accuracy"], end)
    assert all(r["verifier/errors"] == 0 and r["verifier/timeouts"] == 0 for r in rows)
