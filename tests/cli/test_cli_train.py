"""The real `rlvr` command: a few RL steps as a subprocess (run directory contents), and config
errors that must fail before any work, naming the key (in-process CliRunner: fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from helpers import REPO
from typer.testing import CliRunner

from rlvr.cli import app

TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "data.num_train=80",
    "data.num_eval=8",
    "data.digits=1",
    "sampling.n_prompts=4",
    "sampling.group_size=4",
    "sampling.max_tokens=4",
    "run.steps=3",
    "run.log_samples_every=1",
    "run.num_log_samples=2",
]


def test_rlvr_train_subprocess_writes_a_complete_run_directory(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "plain"}
    res = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", "--recipe", "dr_grpo", *TINY, f"run.out_dir={run}",
         "optim.lr=5e-4", "--threads", "1"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert f"run directory: {run}" in res.stdout
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    # the recipe's knobs, then the overrides, are what was resolved and written
    assert cfg["algo"]["advantage"] == "group_mean" and cfg["algo"]["aggregation"] == "seq_mean_token_sum_norm"
    assert cfg["optim"]["lr"] == 5e-4 and cfg["run"]["num_threads"] == 1
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "format_rate" not in rows[0]  # the arithmetic reward has no format part: no format rate (n/a)
    for key in ("reward/mean", "accuracy", "loss", "grad_norm", "entropy", "clip_frac/low",
                "ratio/mean", "len/mean", "zero_var_groups", "verifier/timeouts", "tokens_per_s",
                "time/generate", "time/score", "time/train", "time/sync", "lr"):
        assert key in rows[0], key
    assert 0.0 <= rows[0]["accuracy"] <= 1.0 and rows[0]["entropy"] > 0
    assert "eval/accuracy" in rows[-1] and "eval/accuracy" not in rows[0]
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 2 and {"prompt", "response", "reference", "parts", "status"} <= set(samples[0])
    assert samples[0]["entropy"] > 0  # log_generations-style samples carry per-response entropy
    # every key the trainer really logged is in docs/runs.md's metric schema (reward/<part> and
    # eval/<metric> rows cover their families), so the documented names cannot drift from the code
    doc = (REPO / "docs" / "runs.md").read_text()
    logged = {k for r in rows for k in r} - {"step", "time"}
    undocumented = sorted(k for k in logged if f"`{k}`" not in doc and not k.startswith(("reward/", "eval/")))
    assert not undocumented, f"metrics logged but not in docs/runs.md: {undocumented}"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"
    assert (run / "checkpoints" / "step_000003" / "model" / "config.json").exists()
    assert (run / "checkpoints" / "step_000003" / "optimizer.pt").exists()
    assert json.loads((run / "checkpoints" / "step_000003" / "trainer_state.json").read_text())["data_pos"] == 12
    assert list((run / "plots").glob("*.png"))


def _invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_wrong_key_fails_before_any_work(tmp_path):
    r = _invoke("train", "algo.lossy=grpo_clip", f"run.out_dir={tmp_path / 'x'}")
    assert r.exit_code == 2 and "algo.lossy" in r.output
    assert not (tmp_path / "x").exists()


def test_wrong_type_names_the_key(tmp_path):
    r = _invoke("train", "optim.lr=fast", f"run.out_dir={tmp_path / 'x'}")
    assert r.exit_code == 2 and "optim.lr" in r.output
    assert not (tmp_path / "x").exists()


def test_impossible_batch_arithmetic_says_what_to_change(tmp_path):
    r = _invoke("train", "sampling.n_prompts=4", "sampling.group_size=4", "algo.train_batch_size=6",
                f"run.out_dir={tmp_path / 'x'}")
    assert r.exit_code == 2
    assert "algo.train_batch_size=6 does not divide the rollout batch" in r.output and "use one of" in r.output
    assert not (tmp_path / "x").exists()


def test_cross_field_rule_fails_at_config_load_not_in_the_trainer(tmp_path, monkeypatch):
    import rlvr.train.pg.loop as pg

    monkeypatch.setattr(pg, "train", lambda *a, **k: pytest.fail("the trainer started (it loads the model)"))
    r = _invoke("train", "algo.advantage=gae", f"run.out_dir={tmp_path / 'x'}")
    assert r.exit_code == 2
    assert "error: algo.advantage='gae' needs a value model: set algo.critic=shared or separate" in r.output
    assert not (tmp_path / "x").exists()


def test_unknown_recipe_and_bad_yaml_line(tmp_path):
    r = _invoke("train", "--recipe", "grpo2")
    assert r.exit_code == 2 and "known:" in r.output and "dr_grpo" in r.output
    bad = tmp_path / "run.yaml"
    bad.write_text("algo:\n  loss: grpo_clip\n  clip_hgh: 0.3\n")
    r = _invoke("train", str(bad))
    assert r.exit_code == 2 and "algo.clip_hgh" in r.output and f"{bad}:3" in r.output


def test_unknown_task_fails_naming_data(tmp_path):
    r = _invoke("sft", "data.task=nope", "run.steps=1", f"run.out_dir={tmp_path / 'x'}", "run.progress=false")
    assert r.exit_code == 2 and "data.task='nope'" in r.output


def test_help_is_generated_from_field_docs():
    r = _invoke("train", "--help")
    assert r.exit_code == 0
    assert "algo.clip_high" in r.output and "DAPO's clip-higher" in r.output
    r = _invoke("recipes")
    assert r.exit_code == 0 and "dr_grpo" in r.output and "reinforce_with_baseline" in r.output
    r = _invoke("recipes", "--markdown")
    assert "| dr_grpo | group_mean | population | grpo_clip | 0.2 | 0.2 | seq_mean_token_sum_norm |" in r.output


def test_rlvr_eval_on_a_saved_policy(tmp_path):
    from rlvr.models import build_tiny_model, save_policy

    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    save_policy(model, tok, tmp_path / "policy")
    out = tmp_path / "eval.json"
    r = _invoke("eval", f"model.init_from={tmp_path / 'policy'}", "data.digits=1", "data.num_train=10",
                "data.num_eval=6", "sampling.n=4", "sampling.temperature=1.0", "sampling.max_tokens=3",
                f"run.out={out}")
    assert r.exit_code == 0, r.output
    metrics = json.loads(out.read_text())
    assert 0.0 <= metrics["accuracy"] <= 1.0 and "pass@4" in metrics and 1 <= metrics["len/mean"] <= 3
    rows = (tmp_path / "eval.samples.jsonl").read_text().splitlines()
    assert len(rows) == 6 * 4
    r = _invoke("eval", f"model.init_from={tmp_path / 'nothing'}")
    assert r.exit_code == 2 and "model.init_from" in r.output


def test_existing_run_is_not_overwritten_unless_asked(tmp_path):
    args = ["train", *TINY, "run.steps=1", f"run.out_dir={tmp_path}", "run.progress=false"]
    assert _invoke(*args).exit_code == 0
    before = (tmp_path / "metrics.jsonl").read_text()
    r = _invoke(*args)
    assert r.exit_code == 2 and "already holds a run" in r.output
    assert (tmp_path / "metrics.jsonl").read_text() == before  # nothing lost
    assert _invoke(*args, "run.overwrite=true").exit_code == 0
