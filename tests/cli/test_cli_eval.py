"""`rlvr eval` as a user runs it (issue 9 item 5, issue 16 items 1, 2, 9, 11): the installed
console script in a subprocess on a run directory made here (a tiny model saved as a checkpoint
next to the config.yaml a trainer writes), a thinking-budget sweep, a task evaluated from a file
without any training data, and the errors that must come before the model loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.shared_data import needs_shared, shared_path
from typer.testing import CliRunner

from rlvr.cli import app

SHARED_DATA = shared_path("data")  # ../shared/data: development data a clone does not have
# The run's task differs from eval's defaults (digits=3, operands=2, num_eval=200, seed=1234,
# max_tokens=16), so the printed line and the problems show whose settings were used.
RUN_DATA = {"task": "arithmetic", "digits": 1, "operands": 3, "num_train": 80, "num_eval": 5, "seed": 7}
RUN_MAX_TOKENS = 3


def _rlvr(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "rlvr"  # the console script pyproject.toml installs
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlvr.cli"]
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off"}
    res = subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=300)
    if ok:
        assert res.returncode == 0, f"{args} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run directory as `rlvr sft` leaves it: config.yaml (an SFTConfig) and checkpoints/step_000003
    holding a tiny model; plus a plain model folder (no run around it) under `policy/`."""
    from rlvr.config import dump_yaml, load_config
    from rlvr.models import build_tiny_model, save_policy
    from rlvr.runs.checkpoint import save_checkpoint
    from rlvr.train.config import SFTConfig

    root = tmp_path_factory.mktemp("eval")
    run = root / "run"
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    overrides = [f"data.{k}={v}" for k, v in RUN_DATA.items()] + [f"sampling.max_tokens={RUN_MAX_TOKENS}"]
    dump_yaml(load_config(SFTConfig, None, overrides), run / "config.yaml")
    save_checkpoint(run, 3, model=model, tokenizer=tok)
    save_policy(model, tok, root / "policy")
    return run


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_eval_of_a_run_checkpoint_takes_the_run_task_and_prints_pass_and_maj_at_k(run_dir, tmp_path):
    from rlvr.data.tasks.arithmetic import generate

    out = tmp_path / "eval.json"
    res = _rlvr("eval", f"model.init_from={run_dir / 'checkpoints' / 'step_000003'}", "sampling.n=4",
                "sampling.temperature=1", f"run.out={out}")
    first = res.stdout.splitlines()[0]
    # one line says what is evaluated: the run's task and problem count, the decoding, where from
    assert first.startswith(f"evaluating {run_dir}/checkpoints/step_000003/model (run {run_dir}) on arithmetic")
    assert "(template question_only, reward arithmetic): 5 held-out problems" in first
    assert f"sampled T=1, n=4, max_tokens={RUN_MAX_TOKENS}" in first and f"from {run_dir}/config.yaml" in first
    assert "loading model" in res.stderr  # the startup is not silent
    for row in ("accuracy", "pass@1", "pass@2", "pass@4", "maj@2", "maj@4", "format_rate", "len/correct",
                "len/incorrect", "time/eval_s"):
        assert f"│ {row} " in res.stdout, row
    assert "time: loading" in res.stdout
    metrics = json.loads(out.read_text())
    assert 0 <= metrics["maj@4"] <= metrics["pass@4"] <= 1 and metrics["pass@1"] == pytest.approx(metrics["accuracy"])
    assert metrics["len/max"] <= RUN_MAX_TOKENS  # the run's sampling.max_tokens, not eval's 16
    samples = _rows(out.with_suffix(".samples.jsonl"))
    assert len(samples) == 5 * 4 and {"answer", "correct", "status", "num_tokens"} <= set(samples[0])
    # the problems are the run's held-out split (digits=1, operands=3, seed=7), e.g. "3+5+7="
    run_problems = [ex.question for ex in generate(5, "test", 7, digits=1, operands=3)]
    assert [s["prompt"] for s in samples[::4]] == run_problems


def test_thinking_budget_sweep_prints_one_row_per_budget(run_dir, tmp_path):
    out = tmp_path / "sweep.json"
    res = _rlvr("eval", f"model.init_from={run_dir}", "data.num_eval=2", "--thinking-budget", "0,2",
                f"run.out={out}")
    assert "thinking budget 0/2" in res.stdout.splitlines()[0]
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("│ ")]
    assert [r.split("│")[1].strip() for r in rows] == ["0", "2"]  # one table row per budget
    assert "thinking budget" in res.stdout and "accuracy" in res.stdout
    metrics = json.loads(out.read_text())
    assert set(metrics) == {"thinking_budget=0", "thinking_budget=2"}
    samples = _rows(out.with_suffix(".samples.jsonl"))
    assert [s["thinking_budget"] for s in samples] == [0, 0, 2, 2]
    # budget 2: two reasoning tokens, then the forced stop-thinking text, then the answer. The lengths count what
    # the policy sampled (issue 36): at most 2 + max_tokens, the forced text apart (it was 70 tokens of len/*)
    assert metrics["thinking_budget=2"]["len/max"] <= 2 + RUN_MAX_TOKENS
    assert all(s["num_tokens"] <= 2 + RUN_MAX_TOKENS for s in samples[2:])
    assert any(s["unsampled_tokens"] > 0 for s in samples[2:])  # the forced text, counted apart
    assert all(s["unsampled_tokens"] == 0 for s in samples[:2])  # budget 0: the empty block is in the prompt


@needs_shared("data", "math500", "test.jsonl")
def test_eval_from_an_eval_file_needs_no_training_data(run_dir):
    # issue 16 item 2: math has no built-in data; evaluation reads only data.eval_path
    res = _rlvr("eval", f"model.name={run_dir.parent / 'policy'}", "data.task=math",
                f"data.eval_path={SHARED_DATA / 'math500' / 'test.jsonl'}", "data.num_eval=3", "sampling.max_tokens=4")
    first = res.stdout.splitlines()[0]
    assert "on math (template r1_zero, reward r1_zero): 3 held-out problems (first 3 of 500" in first
    assert "stop='</answer>'" in first  # the task's stop string reaches the sampler
    assert "│ accuracy " in res.stdout


def test_task_without_held_out_problems_fails_before_loading_the_model(run_dir):
    # issue 16 item 1: gsm8k has no built-in held-out split
    res = _rlvr("eval", f"model.name={run_dir.parent / 'policy'}", "data.task=gsm8k", ok=False)
    assert res.returncode == 2
    assert "error: task 'gsm8k' has no built-in held-out problems: set data.eval_path=FILE" in res.stderr
    assert "loading model" not in res.stderr


def _invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_format_rate_is_na_for_a_reward_without_format_part(run_dir):
    # The language reward scores the script of the words and has no format part: "n/a", not 0.0%
    r = _invoke("eval", f"model.name={run_dir.parent / 'policy'}", "data.digits=1", "data.num_eval=3",
                "data.reward=language", "sampling.max_tokens=2")
    assert r.exit_code == 0, r.output
    assert [ln.split("│")[2].strip() for ln in r.output.splitlines() if "│ format_rate " in ln] == ["n/a"]


def test_bad_thinking_budget_and_bad_paths_fail_with_status_2(tmp_path):
    r = _invoke("eval", "--thinking-budget", "0,lots")
    assert r.exit_code == 2 and "--thinking-budget '0,lots'" in r.output
    r = _invoke("eval", "--thinking-budget", "-5")
    assert r.exit_code == 2 and ">= 0" in r.output
    r = _invoke("eval", f"model.init_from={tmp_path / 'nothing'}")
    assert r.exit_code == 2 and "model.init_from" in r.output
    r = _invoke("eval", "data.task=math", f"data.eval_path={tmp_path / 'missing.jsonl'}")
    assert r.exit_code == 2 and "missing.jsonl" in r.output


def test_rlvr_eval_is_evaluate_policy_of_its_config(run_dir, tmp_path):
    """One evaluation stage: the library call writes the file `rlvr eval` writes, for the same config."""
    from rlvr.config import load_config
    from rlvr.train.config import EvalConfig
    from rlvr.train.evaluation import evaluate_policy

    keys = [f"model.name={run_dir.parent / 'policy'}", "data.digits=1", "data.num_eval=3", "sampling.max_tokens=2"]
    ev = evaluate_policy(load_config(EvalConfig, None, [*keys, f"run.out={tmp_path / 'lib.json'}"]))
    assert ev.problems == 3 and ev.budgets == [-1] and ev.out == tmp_path / "lib.json"
    assert len(ev.results[-1].samples) == 3 and ev.metrics()["accuracy"] == ev.results[-1].metrics()["accuracy"]
    r = _invoke("eval", *keys, f"run.out={tmp_path / 'cli.json'}")
    assert r.exit_code == 0, r.output

    def untimed(name: str) -> dict:
        return {k: v for k, v in json.loads((tmp_path / name).read_text()).items() if not k.startswith("time/")}

    assert untimed("lib.json") == untimed("cli.json") and untimed("lib.json")["problems"] == 3
    assert (tmp_path / "lib.samples.jsonl").read_text() == (tmp_path / "cli.samples.jsonl").read_text()
