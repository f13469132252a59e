"""Learning tests with step budgets and fixed seeds (never wall-clock): SFT lowers the loss and
raises accuracy; GRPO with only the verifier then raises held-out accuracy of that partly trained
model. Task: three single-digit terms ("3+5+7=" -> "15"), held-out problems from the test split.
"""

from __future__ import annotations

import json

import pytest

from rlvr.config import load_config
from rlvr.data import get_task
from rlvr.rewards import get_reward_fn
from rlvr.train.config import SFTConfig, TrainConfig
from rlvr.train.pg import train
from rlvr.train.sft import train_sft
from rlvr.train.tasks import TaskData

MODEL = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.intermediate_size=128",
         "model.tie_embeddings=true"]
COMMON = ["sampling.max_tokens=4", "data.num_eval=80", "run.num_threads=1", "run.progress=false"]


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def task() -> TaskData:
    t = get_task("arithmetic")
    train_ex = t.generate(600, "train", 0, digits=1, operands=3)
    held_out = t.generate(80, "test", 0, digits=1, operands=3)
    assert not {e.question for e in train_ex} & {e.question for e in held_out}
    return TaskData("arith3", train_ex, held_out, lambda e: e.question, get_reward_fn("arithmetic"),
                    lambda e: e.reference)


@pytest.fixture(scope="module")
def sft_run(task, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    cfg = load_config(SFTConfig, None, MODEL + COMMON + [
        "run.steps=100", f"run.out_dir={out}", "run.eval_every=25", "optim.lr=3e-3", "optim.schedule=constant",
        "algo.batch_size=32"])
    train_sft(cfg, data=task)
    return out


def test_sft_lowers_loss_and_raises_accuracy(sft_run):
    rows = _rows(sft_run)
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [25, 50, 75, 100]
    # Measured with this seed: loss 1.66 at step 25 -> 0.80 at step 100, greedy held-out accuracy
    # 5% -> 19%. Margins leave room for float differences across machines, not for a broken loop.
    assert evals[-1]["loss"] < 0.65 * evals[0]["loss"]
    assert evals[-1]["eval/accuracy"] >= evals[0]["eval/accuracy"] + 0.08
    assert (sft_run / "checkpoints" / "latest").exists()


def test_grpo_raises_held_out_accuracy_of_a_partly_trained_model(task, sft_run, tmp_path):
    start = [r for r in _rows(sft_run) if "eval/accuracy" in r][-1]["eval/accuracy"]
    assert 0.05 <= start <= 0.5  # partly right: room to improve, signal to learn from
    cfg = load_config(TrainConfig, None, MODEL + COMMON + [
        f"model.init_from={sft_run}", "run.steps=30", f"run.out_dir={tmp_path / 'rl'}", "run.eval_every=10",
        "optim.lr=1e-3", "sampling.n_prompts=16", "sampling.group_size=8"])
    res = train(cfg, data=task)
    rows = _rows(res.run_dir)
    end = rows[-1]["eval/accuracy"]
    # Measured with this seed: 19% -> 40% greedy on the 80 held-out problems after 30 steps.
    assert end >= start + 0.10, (start, end)
    assert all(r["verifier/errors"] == 0 and r["verifier/timeouts"] == 0 for r in rows)
