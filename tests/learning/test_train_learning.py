"""Learning tests with step budgets and fixed seeds (never wall-clock): SFT lowers the loss and
raises held-out accuracy; GRPO with only the verifier then raises held-out accuracy of a partly
trained model. Task: three single-digit terms ("3+5+7=" -> "15"), 200 held-out problems.

They must hold on any x86 CPU (a single-seed version with tight margins failed on an AVX2 machine):
- tests/conftest.py pins torch's and MKL's CPU kernels to one code path, so machines compute the
  same floats;
- each scenario runs for three seeds and asserts on medians, with thresholds below the weakest
  median of any three of six seeds measured under two kernel settings: pinned
  (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE; with ",STRICT" the same numbers) and the native
  AVX2 path of an AMD EPYC (ATEN_CPU_CAPABILITY=avx2, MKL_CBWR unset). A machine whose floats still
  differ gets other trajectories from the same spread, and no single one decides.

Measured (pinned / native). SFT: held-out greedy accuracy % at step 50 -> 200, loss at 200 / at 50.
GRPO, 80 steps from the SFT checkpoint of step 100: held-out greedy accuracy % before -> after;
held-out sampled accuracy gain (8 samples a problem, T=1); sampled training reward gain (mean of the
last 5 steps minus the first 5). Gains in points.

    seed | SFT accuracy       | loss ratio  | GRPO greedy                 | sampled       | train reward
    0    | 5.5 -> 94.5 / 94.5 | 0.30 / 0.29 | 27.5 -> 36.0 / 27.0 -> 34.0 |  +4.3 / +11.6 | +10.2 / +12.4
    1    | 5.0 -> 77.0 / 71.0 | 0.37 / 0.38 | 12.0 -> 34.5 / 12.5 -> 35.5 | +12.4 / +13.3 |  +9.0 /  +9.6
    2    | 8.0 -> 21.5 / 26.5 | 0.59 / 0.60 |  4.5 ->  8.5 / 13.5 -> 10.0 |  +3.6 /  +3.1 |  +5.9 /  +6.6
    3    | 7.0 -> 82.5 / 87.0 | 0.36 / 0.35 | 20.0 -> 40.0 / 14.0 -> 36.0 | +11.8 / +11.1 | +13.0 / +11.1
    4    | 8.0 -> 54.0 / 55.0 | 0.47 / 0.47 | 11.5 -> 20.0 / 11.5 -> 28.0 |  +7.5 /  +6.6 |  +7.1 /  +5.7
    5    | 7.5 -> 21.0 / 21.0 | 0.66 / 0.66 |  5.0 -> 11.5 /  5.0 -> 11.0 |  +3.7 /  +3.1 |  +1.2 /  +0.3

Weakest median of three seeds: SFT accuracy +13.5, loss ratio 0.60, GRPO greedy +6, sampled +3.1,
train reward +5.7. A third setting (ATEN_CPU_CAPABILITY=avx2 with the pinned MKL), seeds 0-2: SFT
+83/+62/+27, GRPO greedy -5/+28.5/+4, sampled +9.3/+11.6/+1.4, reward +12.7/+9.5/+6.4: greedy of a
tiny model jumps (seed 0 loses 5 points while its sampled accuracy gains 9), so no seed decides
alone and the steadier sampled measure backs the greedy one. About 95 s on one thread.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.eval import evaluate
from rlvr.models import load_policy
from rlvr.rollout import HFGenerator, SamplingSpec
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import train
from rlvr.train.policy import resolve_model_dir
from rlvr.train.tasks import TaskData

SEEDS = (0, 1, 2)
MODEL = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.intermediate_size=128",
         "model.tie_embeddings=true"]
COMMON = ["sampling.max_tokens=4", "data.num_eval=200", "run.num_threads=1", "run.progress=false"]
SFT_STEPS, RL_FROM_STEP, RL_STEPS = 200, 100, 80


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _evals(run_dir) -> dict[int, dict]:
    return {r["step"]: r for r in _rows(run_dir) if "eval/accuracy" in r}


def _checkpoint(sft_run: Path) -> Path:
    """The SFT checkpoint GRPO starts from (partly trained)."""
    return sft_run / "checkpoints" / f"step_{RL_FROM_STEP:06d}"


def _sampled_accuracy(model_dir: Path, task: TaskData, seed: int) -> float:
    """Held-out accuracy over 8 samples per problem at temperature 1 (what GRPO optimizes; 1600
    responses, so far steadier than greedy argmax of a tiny model). The same seed before and after
    GRPO: both models draw the same random numbers."""
    model, tok = load_policy(resolve_model_dir(model_dir))
    spec = SamplingSpec(n=8, temperature=1.0, max_tokens=4, stop=tuple(task.stop), seed=seed, logprobs=False)
    generator, prompts = HFGenerator(model, tok, batch_size=256), [task.prompt(e) for e in task.eval]
    return evaluate(generator, task.eval, prompts, task.reward_fn, spec).accuracy


@pytest.fixture(scope="module")
def task(arith3_task) -> TaskData:
    return arith3_task


@pytest.fixture(scope="module")
def sft_runs(arith3_sft_runs) -> dict[int, Path]:
    return arith3_sft_runs


def test_sft_lowers_loss_and_raises_accuracy(sft_runs):
    ratios, gains = [], []
    for seed, run in sft_runs.items():
        evals = _evals(run)
        assert sorted(evals) == [50, 100, 150, 200], seed
        first, last = evals[50], evals[SFT_STEPS]
        ratios.append(last["loss"] / first["loss"])
        gains.append(last["eval/accuracy"] - first["eval/accuracy"])
        assert ratios[-1] < 0.9, (seed, first["loss"], last["loss"])  # every seed learns some (worst 0.66)
        assert (run / "checkpoints" / "latest").exists() and _checkpoint(run).exists()
    # Medians of seeds 0-2, pinned kernels: loss ratio 0.37, accuracy +72 pts (table in the docstring).
    assert statistics.median(ratios) < 0.7, ratios
    assert statistics.median(gains) >= 0.10, gains


@pytest.mark.slow  # ~50 s: make test-slow
def test_grpo_raises_held_out_accuracy_of_a_partly_trained_model(task, sft_runs, tmp_path):
    gains, sampled_gains, reward_gains, starts = [], [], [], []
    for seed, sft_run in sft_runs.items():
        start = _evals(sft_run)[RL_FROM_STEP]["eval/accuracy"]
        cfg = load_config(TrainConfig, None, MODEL + COMMON + [
            f"model.init_from={_checkpoint(sft_run)}", f"run.out_dir={tmp_path / 'rl'}{seed}",
            f"run.steps={RL_STEPS}", "run.eval_every=20", f"run.seed={seed}", f"data.seed={seed}",
            "optim.lr=5e-4", "sampling.n_prompts=32", "sampling.group_size=8"])
        run_dir = train(cfg, data=task).run_dir
        rows = _rows(run_dir)
        assert all(r["verifier/errors"] == 0 and r["verifier/timeouts"] == 0 for r in rows)
        reward = [r["accuracy"] for r in rows]  # sampled (T=1) training reward, 256 responses a step
        starts.append(start)
        gains.append(rows[-1]["eval/accuracy"] - start)
        sampled = [_sampled_accuracy(d, task, 1000 + seed) for d in (_checkpoint(sft_run), run_dir)]
        sampled_gains.append(sampled[1] - sampled[0])
        reward_gains.append(statistics.mean(reward[-5:]) - statistics.mean(reward[:5]))
    assert 0.03 <= statistics.median(starts) <= 0.5, starts  # partly right: room to improve, signal to learn
    # Medians of seeds 0-2, pinned kernels: held-out greedy +8.5 pts, held-out sampled +4.3 pts,
    # training reward +9.0 pts (table in the docstring).
    assert statistics.median(gains) >= 0.02, gains
    assert statistics.median(sampled_gains) >= 0.02, sampled_gains
    assert statistics.median(reward_gains) >= 0.03, reward_gains
