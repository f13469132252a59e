"""LoRA with the Ray placement (`make test-ray`): the generator actors hold their own copy of the policy and
receive merged pushes under the base model's names; the run equals the local one (the same samples and
losses at every step)."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")
pytest.importorskip("peft")

from rlvr.config import load_config  # noqa: E402
from rlvr.train.config import TrainConfig  # noqa: E402
from rlvr.train.pg.loop import train  # noqa: E402

TINY = [
    "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
    "model.lora_rank=4", "model.lora_alpha=8", "optim.lr=2e-2", "algo.kl_coef=0.05",
    "data.num_train=80", "data.num_eval=8", "data.digits=1", "data.reward=language",
    "sampling.n_prompts=4", "sampling.group_size=4", "sampling.max_tokens=4", "algo.train_batch_size=8",
    "run.steps=3", "run.progress=false", "run.num_threads=1",
    "distributed.generator_cpus=0.5", "distributed.scorer_cpus=0.5", "distributed.learner_cpus=0.5",
]
VOLATILE = ("time", "time/", "tokens_per_s", "mem/", "perf/", "ray/", "async/")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    os.environ.setdefault("RLVR_NUM_THREADS", "1")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _rows(out, *extra) -> list[dict]:
    rows: list[dict] = []
    train(load_config(TrainConfig, None, [*TINY, f"run.out_dir={out}", *extra]),
          on_step=lambda step, m: rows.append({k: v for k, v in m.items() if not k.startswith(VOLATILE) and v == v}))
    return rows


def test_lora_on_ray_generators_equals_the_local_run(tmp_path):
    local = _rows(tmp_path / "local")
    remote = _rows(tmp_path / "ray", "distributed.placement=ray")
    assert len(local) == len(remote) == 3
    # The actors sample from merged weights (W + s B A), the local generator runs the peft module (x W + s x A B):
    # the same function up to float rounding, so only the sampler-vs-learner logprob gap may differ, at noise level.
    noise = "rollout/logprob_diff"
    assert max(r[k] for r in local + remote for k in r if k.startswith(noise + "_mean")) < 1e-5
    strip = [[{k: v for k, v in r.items() if not k.startswith(noise)} for r in rows] for rows in (local, remote)]
    assert strip[0] == strip[1]  # the same samples, rewards, losses, KL, gradients at every step
    assert local[-1]["kl"] > 0  # the adapter moved

