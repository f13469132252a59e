"""Ray placement (distributed.placement=ray): the same training as one process, data-parallel learners,
bounded staleness, a killed generator actor, and resume after killing the driver.

One local Ray cluster for the module (num_cpus=2); marked `ray` (deselected by default; `make test-ray`).
Every run is the tiny model on the digits task for a few steps, on CPU with one thread per process,
so runs are deterministic and the local placement is the reference.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from safetensors.torch import load_file  # noqa: E402

from rlvr.config import load_config  # noqa: E402
from rlvr.train.config import TrainConfig  # noqa: E402
from rlvr.train.pg.loop import train  # noqa: E402
from rlvr.train.pg.recipes import get_recipe  # noqa: E402

TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "data.num_train=80",
    "data.num_eval=8",
    "data.digits=1",
    "data.reward=language",  # dense reward: the tiny model gets signal, so weights and Adam state move
    "sampling.n_prompts=4",
    "sampling.group_size=4",
    "sampling.max_tokens=4",
    "algo.train_batch_size=8",  # 2 optimizer steps per rollout batch
    "algo.kl_coef=0.05",
    "algo.ref_refresh_every=2",
    "optim.lr=1e-3",
    "optim.warmup_steps=2",
    "optim.schedule=cosine",
    "run.steps=4",
    "run.checkpoint_every=2",
    "run.log_samples_every=2",
    "run.progress=false",
    "run.num_threads=1",
    "distributed.generator_cpus=0.5",
    "distributed.scorer_cpus=0.5",
    "distributed.learner_cpus=0.5",
]
RAY = ["distributed.placement=ray"]
VOLATILE = ("time", "time/", "tokens_per_s", "mem/", "perf/", "ray/", "async/")  # wall clock, memory, placement-only


@pytest.fixture(scope="module", autouse=True)
def cluster():
    os.environ.setdefault("RLVR_NUM_THREADS", "1")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _train(out: Path, *extra: str) -> list[dict]:
    cfg = load_config(TrainConfig, None, [*TINY, f"run.out_dir={out}", *extra], base=get_recipe("grpo"))
    rows: list[dict] = []
    train(cfg, on_step=lambda step, m: rows.append(dict(m)))
    return rows


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE) and k != "step" and v == v}
            for r in rows]  # v == v: no NaN


def _diff(a: list[dict], b: list[dict]) -> list:
    """(step index, key, a's value, b's value) of every metric that differs."""
    assert len(a) == len(b)
    return [(i, k, x.get(k), y.get(k)) for i, (x, y) in enumerate(zip(_stable(a), _stable(b), strict=True))
            for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    latest = (run / "checkpoints" / "latest").read_text().strip()
    out: dict[str, torch.Tensor] = {}
    for f in sorted((run / "checkpoints" / latest / "model").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "run"
    return out, _train(out)


def test_sync_ray_is_bit_identical_to_local(local_run, tmp_path):
    local, local_rows = local_run
    rows = _train(tmp_path / "ray", *RAY)
    assert len(rows) == 4
    assert not _diff(rows, local_rows)  # every metric of every step, exactly
    assert rows[-1]["loss"] != 0 and rows[-1]["grad_norm"] > 0  # the runs did learn something
    assert "time/busy_generator" in rows[0] and rows[0]["ray/restarts"] == 0
    w_local, w_ray = _weights(local), _weights(tmp_path / "ray")
    assert w_local.keys() == w_ray.keys()
    for k in w_local:
        assert torch.equal(w_local[k], w_ray[k]), k
    init = _weights_at_init()
    assert any(not torch.equal(init[k], w_local[k]) for k in init)  # weights moved


def _weights_at_init() -> dict[str, torch.Tensor]:
    from rlvr.train.policy import policy_from_config

    cfg = load_config(TrainConfig, None, TINY, base=get_recipe("grpo"))
    model, _ = policy_from_config(cfg.model, seed=cfg.run.seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_two_data_parallel_learners_match_one(tmp_path):
    # The plain forward (algo.shared_prefix=false) on both sides: with the shared prefix, each learner
    # forwards the prompts of its own half, so the gradients differ from one learner's by float noise
    # (~1e-8, tests/models/test_prefix.py checks the split), and Adam turns noise on a near-zero gradient into
    # a step of size lr: after 8 optimizer steps the weights differ by up to ~lr * 4, which would hide
    # a real error. Without it every row's forward is the same computation in both runs.
    plain = "algo.shared_prefix=false"
    local = tmp_path / "local"
    local_rows = _train(local, plain)
    rows = _train(tmp_path / "dp", *RAY, "distributed.num_learners=2", plain)
    w1, w2 = _weights(local), _weights(tmp_path / "dp")
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < 1e-5, worst  # float summation order only (two halves summed vs one batch)
    for a, b in zip(local_rows, rows, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-7)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["entropy"] == pytest.approx(a["entropy"], rel=1e-5)


def test_staleness_bound_is_kept_and_drops_are_counted(tmp_path):
    # queue of 1 = max_staleness: steps >= 2 train on rollouts of the previous-but-one version, none dropped
    rows = _train(tmp_path / "a1", *RAY, "distributed.max_staleness=1")
    assert [r["rollout/staleness"] for r in rows] == [0, 1, 1, 1]
    assert [r["async/dropped_rollouts"] for r in rows] == [0, 0, 0, 0]
    # the ratio's denominator is the behaviour policy (its version's weights), not the learner's:
    # it matches the sampler's own logprobs to float precision even for stale rollouts
    assert max(r["rollout/logprob_diff_max"] for r in rows) < 1e-4
    # a queue deeper than the bound: batches sampled 2-3 versions back are dropped and resampled
    rows = _train(tmp_path / "a3", *RAY, "distributed.max_staleness=1", "distributed.queue_size=3")
    assert all(r["rollout/staleness"] <= 1 for r in rows)
    n = 4 * 4  # rollouts per step
    assert [r["async/dropped_rollouts"] for r in rows] == [0, 0, n, n]
    assert rows[-1]["async/dropped_total"] == 2 * n


def test_generator_actor_killed_mid_step_is_restarted_and_nothing_is_lost(local_run, tmp_path, monkeypatch):
    from rlvr.distributed.placement import RayPlacement

    local, local_rows = local_run
    made = []
    original = RayPlacement.generator

    def capture(self, *args, **kwargs):
        made.append(original(self, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(RayPlacement, "generator", capture)
    killed = []

    def slow_down(worker) -> None:
        # runs inside the actor (Ray's __ray_call__): its next generate sleeps 2 s first, so the kill lands
        # mid-call; the restarted actor is a fresh one, without the delay
        import time

        inner = worker.gen.generate

        def slow(*args, **kwargs):
            time.sleep(2.0)
            return inner(*args, **kwargs)

        worker.gen.generate = slow

    def on_step(step: int, m: dict) -> None:
        rows.append(dict(m))
        if step == 1:  # kill the actor inside step 2's generate call
            gen = made[0]
            pid = ray.get(gen.actors[0].pid.remote())
            ray.get(gen.actors[0].__ray_call__.remote(slow_down))
            killed.append(pid)
            threading.Timer(0.8, lambda: os.kill(pid, signal.SIGKILL)).start()

    rows: list[dict] = []
    cfg = load_config(TrainConfig, None, [*TINY, *RAY, f"run.out_dir={tmp_path / 'kill'}"], base=get_recipe("grpo"))
    train(cfg, on_step=on_step)
    assert [r["ray/restarts"] for r in rows] == [0, 1, 1, 1]  # restarted once, during step 2
    # the restarted actor got the step-1 weights again and the call was resubmitted: same rollouts,
    # same metrics and weights as the local run
    assert not _diff(rows, local_rows)
    w1, w2 = _weights(local), _weights(tmp_path / "kill")
    for k in w1:
        assert torch.equal(w1[k], w2[k]), k


def _cli(*args: str, kill_at: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off"}
    if kill_at:
        env["RLVR_DEBUG_KILL_AT_STEP"] = str(kill_at)
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_a_ray_run_prints_no_core_worker_error_line(tmp_path):
    """Issue 25 item 16: every Ray run printed Ray's E-level `core_worker.cc: Actor ... has constructor
    arguments in the object store and max_restarts > 0` line (the policy was the generator actors'
    constructor argument; it is now given by a build call after creation)."""
    addr = ray.get_runtime_context().gcs_address
    res = _cli("train", *TINY, *RAY, f"distributed.ray_address={addr}", "run.steps=1", f"run.out_dir={tmp_path / 'r'}")
    assert res.returncode == 0, res.stderr[-3000:]
    noise = [x for x in res.stderr.splitlines() if "core_worker" in x or "constructor arguments" in x]
    assert not noise, noise


def test_resume_after_killing_the_driver_matches_uninterrupted(local_run, tmp_path):
    local, local_rows = local_run
    addr = ray.get_runtime_context().gcs_address
    cut = tmp_path / "cut"
    over = [*TINY, *RAY, f"distributed.ray_address={addr}", f"run.out_dir={cut}"]
    killed = _cli("train", "--recipe", "grpo", *over, kill_at=2)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (cut / "checkpoints" / "latest").read_text().strip() == "step_000002"
    time.sleep(1.0)  # Ray frees the dead driver's actors and placement group
    resumed = _cli("train", "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(x) for x in (cut / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert not _diff(rows, local_rows)  # == the uninterrupted run (== local, first test)
    w1, w2 = _weights(local), _weights(cut)
    for k in w1:
        assert torch.equal(w1[k], w2[k]), k
