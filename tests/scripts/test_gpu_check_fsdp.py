"""scripts/gpu_check_fsdp.py in its CPU mode (`--dry-run`: tiny shape, float32, gloo): the four runs (plain,
fsdp2 as a group of one under torchrun, and both with LoRA) go through, every check passes on CPU, and the
report names each run and check. On a GPU the same script is the sharded learner's NCCL / bf16 check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

ROOT = REPO


@pytest.mark.scale
def test_the_fsdp_gpu_check_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu_fsdp.md"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check_fsdp.py"), "--dry-run", "--work",
                          str(tmp_path / "work"), "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    text = out.read_text()
    for name in ("| local |", "| fsdp2 |", "| local_lora |", "| fsdp2_lora |"):
        assert name in text
    data = json.loads(out.with_suffix(".json").read_text())
    assert len(data["checks"]) == 5 and all(ok for _, ok, _ in data["checks"])
    # the step-1 gradient norms really were compared, and they are not zero (the steps moved the weights)
    assert sum("step-1 gradient norm" in name for name, _, _ in data["checks"]) == 2
    assert all(rows[0]["grad_norm"] > 1e-3 for rows in data["rows"].values())
