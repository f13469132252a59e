"""benchmarks/vs_trl.py: both sides get the same learning settings (fast, default suite), and the
--quick run end to end (slow: rlvr and three TRL configurations, 2-7 min on 2 cores depending on load)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

ROOT = REPO
sys.path.insert(0, str(ROOT))
from benchmarks import vs_trl  # noqa: E402


def test_rlvr_side_config_is_the_grpo_setting(tmp_path):
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.recipes import get_recipe

    s = vs_trl.settings(type("A", (), dict(vs_trl.PRESETS["default"]))())
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.json").write_text("{}")  # a model folder as far as the config check goes
    cfg = load_config(TrainConfig, None, vs_trl.rlvr_overrides(s, tmp_path / "sft", tmp_path / "out", 2),
                      base=get_recipe("grpo"))
    a, o, sa = cfg.algo, cfg.optim, cfg.sampling
    assert (a.advantage, a.adv_std, a.adv_eps, a.loss, a.aggregation) == ("grpo", "sample", 1e-4, "grpo_clip",
                                                                          "seq_mean_token_mean")
    assert (a.clip_low, a.clip_high, a.kl_coef, a.epochs_per_rollout_batch) == (0.2, 0.2, 0.0, 1)
    assert (o.lr, o.schedule, o.warmup_steps, o.weight_decay, o.eps, o.grad_clip) == (5e-4, "constant", 0, 0.0, 1e-8, 1.0)
    assert (sa.n_prompts, sa.group_size, sa.max_tokens, sa.temperature) == (64, 8, 4, 1.0)
    assert (cfg.run.steps, cfg.run.seed, cfg.run.num_threads) == (100, 2, 1)


def test_trl_side_config_matches_rlvr():
    pytest.importorskip("trl")
    from trl import GRPOConfig

    s = vs_trl.settings(type("A", (), dict(vs_trl.PRESETS["default"]))())
    for side, gc, bf16 in (("trl", False, False), ("trl_gc", True, False), ("trl_defaults", True, True)):
        t = GRPOConfig(**vs_trl.trl_kwargs(s, Path("/nonexistent-vs-trl"), 2, side))
        assert (t.gradient_checkpointing, bool(t.bf16)) == (gc, bf16), side
        assert t.per_device_train_batch_size * t.gradient_accumulation_steps == 64 * 8
        assert t.steps_per_generation == 1 and t.num_iterations == 1  # one optimizer step per rollout batch
        assert (t.num_generations, t.max_completion_length, t.learning_rate, t.max_steps) == (8, 4, 5e-4, 100)
        assert (t.loss_type, t.scale_rewards, t.beta, t.epsilon, t.top_k, t.shuffle_dataset) == (
            "grpo", "group", 0.0, 0.2, 0, False)
    with pytest.raises(ValueError, match="unknown side"):
        vs_trl.trl_kwargs(s, Path("x"), 0, "trl_fast")


def test_rlvr_advantage_settings_equal_trl_formula():
    """adv_std=sample, adv_eps=1e-4 is TRL's (r - mean) / (nanstd + 1e-4): hand-computed for [1, 0, 0, 0]
    (mean 0.25, Bessel std sqrt(0.75 / 3) = 0.5)."""
    import torch

    from rlvr.algo.advantages import grpo

    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    got = grpo(r, 4, eps=1e-4, std="sample")
    want = torch.tensor([0.75 / 0.5001] + [-0.25 / 0.5001] * 3 + [0.0] * 4)
    torch.testing.assert_close(got, want)
    trl_utils = pytest.importorskip("trl.trainer.utils")
    g = r.view(-1, 4)
    trl_adv = ((g - g.mean(1, keepdim=True)) / (trl_utils.nanstd(g, dim=1).unsqueeze(1) + 1e-4)).reshape(-1)
    torch.testing.assert_close(got, trl_adv)


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path):
    pytest.importorskip("trl")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_trl.py"), "--quick", "--out", str(tmp_path / "w"),
                           "--results-dir", str(tmp_path), "--results-name", "q"],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "q.json").read_text())
    assert "| rlvr |" in proc.stdout and "| trl |" in proc.stdout and (tmp_path / "q.md").exists()
    q = vs_trl.PRESETS["quick"]
    assert set(res["sides"]) == set(vs_trl.SIDES)
    eff = {}
    for side, runs in res["runs"].items():
        assert len(runs) == q["rounds"]
        for r in runs:
            assert len(r["steps"]) == q["steps"], side
            assert r["same_prompts_as_rlvr"], side
            for st in r["steps"]:
                for k in ("s", "generate", "score", "train"):
                    assert math.isfinite(st[k]) and st[k] >= 0, (side, k, st)
                assert st["generate"] + st["score"] <= st["s"] + 1e-9
                assert 0.0 <= st["reward"] <= 1.0
            assert 0.0 <= r["acc_after"] <= 1.0 and 0.0 < r["peak_rss_gb"] < 64 and r["startup_s"] > 0
            eff[side] = r["effective"]
    # the sides ran the same settings: everything equal but TRL's performance knobs on its two defaults rows
    perf = {"gradient_checkpointing", "bf16"}
    for side in ("trl", "trl_gc", "trl_defaults"):
        assert {k: v for k, v in eff[side].items() if k not in perf} == {k: v for k, v in eff["rlvr"].items()
                                                                           if k not in perf}, side
    assert eff["trl"]["gradient_checkpointing"] is False and eff["trl"]["bf16"] is False
    assert eff["trl_defaults"]["gradient_checkpointing"] is True and eff["trl_defaults"]["bf16"] is True
    assert eff["rlvr"]["steps"] == q["steps"] and eff["rlvr"]["responses_per_optimizer_step"] == 16 * 8
    assert 0.0 <= res["acc_before"] <= 1.0
    cl = res["compute_limit"]
    assert cl["gflop/train"] > cl["gflop/generate"] > 0 and cl["gflop_per_s"] > 0
    assert cl["limit_s"] == pytest.approx(cl["gflop/total"] / cl["gflop_per_s"], rel=1e-2)
    assert 0 < cl["share_of_limit"] < 5
