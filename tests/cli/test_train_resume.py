"""Resume: N steps in one go == N/2 steps, SIGKILL right after the checkpoint, `--resume` to N.

Runs the real `rlvr train` command as a subprocess. On CPU the two runs must agree exactly:
every non-timing metric of every step and every weight of the final checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "data.num_train=80",
    "data.num_eval=8",
    "data.digits=1",
    "data.reward=language",  # dense reward: a random tiny model gets signal, so weights and Adam state move
    "sampling.n_prompts=4",
    "sampling.group_size=4",
    "sampling.max_tokens=4",
    "algo.train_batch_size=8",  # 2 optimizer steps per rollout batch: Adam state and scheduler matter
    "algo.kl_coef=0.05",  # reference model in play
    "algo.ref_refresh_every=2",  # refreshed at 2, 4, 6: the resume from step 3 needs the step-2 reference
    "optim.lr=1e-3",
    "optim.warmup_steps=2",
    "optim.schedule=cosine",
    "run.steps=6",
    "run.checkpoint_every=3",
    "run.log_samples_every=2",
    "run.progress=false",
    "run.num_threads=1",
]
TIMING = ("time", "time/", "tokens_per_s", "mem/", "perf/")  # wall-clock and memory figures differ between runs


def _rlvr(*args: str, check: bool = True, kill_at: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off"}
    if kill_at:
        env["RLVR_DEBUG_KILL_AT_STEP"] = str(kill_at)  # the trainer's test hook: SIGKILL after that checkpoint
    cmd = [sys.executable, "-m", "rlvr.cli", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if check and res.returncode != 0:
        raise AssertionError(f"{cmd} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    latest = (run / "checkpoints" / "latest").read_text().strip()
    model_dir = run / "checkpoints" / latest / "model"
    out: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_killed_and_resumed_run_matches_uninterrupted_run(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    _rlvr("train", "--recipe", "grpo", *TINY, f"run.out_dir={full}")

    killed = _rlvr("train", "--recipe", "grpo", *TINY, f"run.out_dir={cut}", check=False, kill_at=3)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (cut / "checkpoints" / "latest").read_text().strip() == "step_000003"
    assert len(_metrics(cut)) == 3

    _rlvr("train", "--resume", str(cut))

    a, b = _metrics(full), _metrics(cut)
    assert [r["step"] for r in a] == [1, 2, 3, 4, 5, 6]
    assert a == b  # rewards, losses, grad norms, KL, lr, eval: all identical
    assert a[-1]["kl"] > 0  # the reference really was used
    wa, wb = _weights(full), _weights(cut)
    assert wa.keys() == wb.keys() and wa
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    # samples.jsonl was truncated at the checkpoint and continued: the same rows as the full run
    assert (full / "samples.jsonl").read_text() == (cut / "samples.jsonl").read_text()
