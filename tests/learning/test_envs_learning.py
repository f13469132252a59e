"""Learning test (slow): a tiny model that starts with a small share of tool use raises its solve
rate on the calculator environment through `rlvr train data.env=calculator`.

Warm start: 300 SFT steps on 180 scripted episodes of 1-digit word problems ("Eve has 7 bags with 5
pens each. How many pens?"). A fifth of them call the calculator (<calc>7*5</calc><out>35</out>
Answer: 35); the rest write the expression and make up its result (7*5<out>70</out> Answer: 70, off by
a fixed error), so the model's answers are right only when it really calls the tool. Then GRPO for 20
steps (8 problems x 8 episodes) from that checkpoint. Measured on the held-out problems with greedy
decoding (the trainer's own final evaluation vs the same evaluation of the warm start):

    seed   solve rate before -> after   tool calls per episode before -> after
    0      0.14 -> 0.50                 0.12 -> 0.92
    1      0.20 -> 0.72                 0.22 -> 1.00
    2      0.04 -> 0.92                 0.00 -> 1.00
    (50 held-out problems; 7.5 min for the three seeds on 2 CPU cores shared with other jobs)

Deterministic (fixed seeds, the pinned CPU kernels of tests/conftest.py); the margin asserted is
well under the smallest gain measured over the seeds.
"""

from __future__ import annotations

import random

import pytest

from rlvr.config import load_config
from rlvr.envs import TurnFormat, make_env
from rlvr.envs.calculator import CalculatorEnv
from rlvr.envs.demos import play, sft_warm_start
from rlvr.envs.task import EnvRunner
from rlvr.models import build_tiny_model, save_policy
from rlvr.rollout import HFGenerator, SamplingSpec
from rlvr.train.config import TrainConfig

SEEDS = (0, 1, 2)
TOOL_SHARE, SFT_STEPS, RL_STEPS = 0.2, 300, 20
MIN_GAIN = 0.15  # solve-rate gain asserted per seed; measured 0.36 / 0.52 / 0.88 (docstring)


def demonstrations(tok, seed: int):
    rng = random.Random(seed)
    fmt = TurnFormat(tok, "plain")
    eps = []
    for ex in CalculatorEnv.generate_examples(180, "train", 1234, digits=1):
        m = ex.meta
        if rng.random() < TOOL_SHARE:
            turns = [f"<calc>{m['a']}{m['op']}{m['b']}</calc>", f"\nAnswer: {ex.reference}"]
        else:
            off = rng.choice([-10, -1, 1, 10]) if m["op"] != "*" else m["a"] * 9 * m["b"] + 1
            guess = int(ex.reference) + off
            turns = [f"{m['a']}{m['op']}{m['b']}<out>{guess}</out>\nAnswer: {guess}"]
        eps.append(play(lambda: make_env("calculator"), ex, turns, tok, fmt))
    return eps


def _rl_overrides(init_from, out, seed):
    return [f"model.init_from={init_from}", "data.env=calculator", "data.env_chat=plain", "data.digits=1",
            "data.num_train=180", "data.num_eval=50", "data.env_max_turns=3", "data.env_max_tokens=90",
            "sampling.n_prompts=8", "sampling.group_size=8", "sampling.max_tokens=32", f"run.steps={RL_STEPS}",
            "optim.lr=1e-3", "run.progress=false", "run.num_threads=1", f"run.out_dir={out}", f"run.seed={seed}",
            "run.eval_every=0"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_calculator_tool_use_raises_solve_rate(tmp_path, seed, monkeypatch):
    from rlvr.runs import plots
    from rlvr.train.pg.loop import train

    monkeypatch.setattr(plots, "plot_run", lambda *a, **k: None)
    model, tok = build_tiny_model(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, seed=seed)
    sft_warm_start(model, tok, demonstrations(tok, seed), steps=SFT_STEPS, batch_size=16, lr=5e-3, seed=seed)
    save_policy(model, tok, tmp_path / "sft")
    cfg = load_config(TrainConfig, None, _rl_overrides(tmp_path / "sft", tmp_path / "rl", seed))
    # the same held-out evaluation the trainer runs at its last step, on the warm start
    runner = EnvRunner("calculator", tok, max_turns=3, max_tokens=90, chat="plain")
    held_out = CalculatorEnv.generate_examples(50, "test", cfg.data.seed, digits=1)
    before = runner.evaluate(HFGenerator(model, tok), held_out, SamplingSpec(n=1, temperature=0.0, max_tokens=32))
    assert before["env/tool_calls"] < 0.5  # starts with a small share of tool use
    result = train(cfg)
    after = result.eval
    print(f"seed {seed}: solve rate {before['accuracy']:.2f} -> {after['accuracy']:.2f}, tool calls per episode "
          f"{before['env/tool_calls']:.2f} -> {after['env/tool_calls']:.2f}")
    assert after["env/tool_calls"] > before["env/tool_calls"] + 0.3
    assert after["accuracy"] >= before["accuracy"] + MIN_GAIN
