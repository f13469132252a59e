"""The Ray placement with a vLLM generator actor (distributed.placement=ray, rollout.backend=vllm): the
engine runs in-process inside its actor, the learner's weights reach it through the actor's
load_weights after every step, and every push is verified by the push check. Through `rlvr train`
in a fresh process (it starts its own local Ray cluster, 2 CPUs). Marked vllm: `make test-vllm`
(whose venv has the ray extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import TESTS

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("ray")

TOL = 1e-4


def test_rlvr_train_with_a_vllm_generator_actor(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TORCHINDUCTOR_"))}
    env["RLVR_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])  # dense_reward
    res = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", "model.hidden_size=64", "model.num_heads=2",
         "model.intermediate_size=128", "rollout.backend=vllm", "rollout.dtype=float32", "rollout.enforce_eager=true",
         "rollout.gpu_memory_utilization=0.06", "rollout.max_model_len=256", "run.num_threads=1", "run.steps=3",
         f"run.out_dir={out}", "sampling.n_prompts=4", "sampling.group_size=4", "optim.lr=3e-3",
         "data.reward=helpers.dense_reward:letter_share", "run.progress=false", "distributed.placement=ray", "distributed.generator_cpus=1",
         "distributed.scorer_cpus=0.5"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/logprob_diff_max"] < TOL  # sampled in the actor by version step-1, scored by it
        assert r["rollout/push_gap_mean"] < TOL  # each push reached the actor's engine
    assert all(r["grad_norm"] > 0 for r in rows)  # the policy moved every step: each push carried new weights
