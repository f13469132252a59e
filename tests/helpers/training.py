"""A tiny in-process trainer and a task with a reward spread, for tests that run `rlvr.train.pg.loop.train` for a
few steps (tests/train/pg/test_train_recipe_book.py, test_train_curriculum.py, tests/models/test_prefix.py,
test_packing.py, tests/distributed/test_cuda_paths.py)."""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.config import load_config
from rlvr.data.example import Example
from rlvr.rewards.types import Reward, Status
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import train
from rlvr.train.pg.recipes import get_recipe
from rlvr.train.tasks import TaskData

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "run.num_threads=1", "run.progress=false", "sampling.max_tokens=3", "data.num_eval=0"]


def spread_task(n_always=4, n_never=4, n_mixed=4) -> TaskData:
    """Problems a scripted reward always, never or sometimes passes: 'mixed' passes a response whose
    first character has an even code point (an untrained tiny model writes both kinds)."""
    kinds = ["always"] * n_always + ["never"] * n_never + ["mixed"] * n_mixed
    train_ex = [Example(id=f"p{i}", question=f"{i % 10}+{i // 10}=", reference="0", meta={"kind": k})
                for i, k in enumerate(kinds)]

    def reward(text, ex):
        kind = ex.meta["kind"]
        ok = kind == "always" or (kind == "mixed" and bool(text) and ord(text[0]) % 2 == 0)
        return Reward(1.0 if ok else 0.0, status=Status.CORRECT if ok else Status.INCORRECT)

    return TaskData("spread", train_ex, [], lambda e: e.question, reward, lambda e: e.reference)


def shared_prefix_run(tmp_path, shared: str, *extra, monkeypatch=None):
    """3 steps of TINY with algo.shared_prefix = rollout.shared_prefix = `shared` on a task whose every problem is
    'mixed' (groups have a reward spread, so the gradient is not 0): (metrics rows, samples.jsonl rows)."""
    cfg = load_config(TrainConfig, None, TINY + [
        f"run.out_dir={tmp_path / shared}", "sampling.n_prompts=4", "sampling.group_size=4", "run.steps=3",
        "run.log_samples_every=1", "run.num_log_samples=4", "optim.lr=1e-2", f"algo.shared_prefix={shared}",
        f"rollout.shared_prefix={shared}", *extra])
    if monkeypatch is not None:  # no plots at the end: they would take most of this test's time
        import rlvr.train.session as session

        monkeypatch.setattr(session, "finish_run", lambda path, last: {})
    rows = []
    res = train(cfg, data=spread_task(n_always=0, n_never=0, n_mixed=8), on_step=lambda s, m: rows.append(m))
    samples = [json.loads(x) for x in (Path(res.run_dir) / "samples.jsonl").read_text().splitlines()]
    return rows, samples


def grpo_algo(*extra):
    """The grpo recipe's algo section with a KL and an entropy term (and `extra` overrides)."""
    return load_config(TrainConfig, None, ["algo.kl_coef=0.05", "algo.entropy_coef=0.01", *extra],
                       base=get_recipe("grpo")).algo
