"""`rlvr train ... data.reward=judge judge.url=http://127.0.0.1:PORT/v1` on a tiny model for 2 steps against a
loopback judge (tests/rewards/test_judge.py's server): the judge's verdicts are the training rewards, and judge/* (and
eval/judge/*) reach metrics.jsonl, every one documented in docs/runs.md."""

from __future__ import annotations

import json

from helpers import REPO
from helpers.judge_server import JudgeServer
from typer.testing import CliRunner

from rlvr.cli import app

TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "data.num_train=40",
    "data.num_eval=4",
    "data.digits=1",
    "sampling.n_prompts=2",
    "sampling.group_size=4",
    "sampling.max_tokens=3",
    "run.steps=2",
    "run.log_samples_every=1",
    "run.num_log_samples=2",
    "run.num_threads=1",
]


def test_rlvr_train_with_a_loopback_judge_logs_judge_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_PROGRESS", "plain")
    with JudgeServer(lambda answer, reference: "EQUIVALENT") as server:  # every answer is right, says the judge
        run = tmp_path / "run"
        res = CliRunner().invoke(app, ["train", *TINY, "data.reward=judge", f"judge.url={server.url}",
                                       "judge.model=loop", f"run.out_dir={run}"])
        assert res.exit_code == 0, res.output
        requests = len(server.requests)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("judge/calls", "judge/cache_hits", "judge/failures", "judge/fallbacks"):
            assert key in r, key
        assert r["judge/failures"] == 0 and r["judge/fallbacks"] == 0
    assert "eval/judge/calls" in rows[-1]
    # every request the server saw is counted once: the steps' and the final evaluation's
    assert requests == sum(r["judge/calls"] for r in rows) + rows[-1]["eval/judge/calls"] > 0
    # the judge says EQUIVALENT to everything: a response with an answer is correct, whatever the symbolic
    # checker thinks (a random tiny model is almost never right by itself)
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["status"] in ("correct", "unparsable") for s in samples)
    answered = [s for s in samples if s["status"] == "correct"]
    assert answered and all(s["reward"] == 1.0 for s in answered)
    assert any(r.get("judge/agree_symbolic", 1.0) < 1.0 for r in rows)  # the checker disagreed somewhere
    doc = (REPO / "docs" / "runs.md").read_text()
    logged = {k for r in rows for k in r} - {"step", "time"}
    undocumented = sorted(k for k in logged if f"`{k}`" not in doc and not k.startswith(("reward/", "eval/")))
    assert not undocumented, f"metrics logged but not in docs/runs.md: {undocumented}"


def test_rlvr_train_with_an_unreachable_judge_stops_at_the_first_step(tmp_path, monkeypatch):
    """Issue 36, item 4 (in process; tests/cli/test_cli_judge_failures.py runs the script): every judge request of
    step 1 fails (connection refused), so the run says so once and stops with `error: ...` (exit 1), before
    any update, instead of training on the symbolic fallback."""
    import socket

    monkeypatch.setenv("RLVR_PROGRESS", "plain")
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", *TINY, "data.reward=judge", f"judge.url={url}", "judge.model=m",
                                   f"run.out_dir={run}"])
    assert res.exit_code == 1, res.output
    said = [x for x in res.output.splitlines() if x.startswith("warning: the judge failed")]
    assert len(said) == 1 and f"judge.url={url}" in said[0] and "cannot reach the judge" in said[0], res.output
    errors = [x for x in res.output.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: step 1: ") and "judge requests failed" in errors[0]
    assert not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip()


def test_rlvr_train_refuses_a_judge_reward_without_a_judge(tmp_path):
    res = CliRunner().invoke(app, ["train", *TINY, "data.reward=judge:1,format:0.1", f"run.out_dir={tmp_path / 'x'}"])
    assert res.exit_code == 2 and "set judge.url" in res.output
    res = CliRunner().invoke(app, ["train", *TINY, "data.reward=judge", "judge.url=127.0.0.1:8000/v1",
                                   f"run.out_dir={tmp_path / 'x'}"])
    assert res.exit_code == 2 and "judge.url='127.0.0.1:8000/v1' must start with http://" in res.output
    assert not (tmp_path / "x").exists()


def test_rlvr_eval_with_a_judge_writes_judge_metrics(tmp_path):
    """`rlvr eval data.reward=judge judge.url=...` (EvalConfig's judge section): the judge's verdicts grade the
    held-out responses and judge/* is in run.out."""
    with JudgeServer(lambda answer, reference: "EQUIVALENT") as server:
        res = CliRunner().invoke(app, ["eval", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
                                       "data.digits=1", "data.num_eval=6", "sampling.max_tokens=3",
                                       "data.reward=judge", f"judge.url={server.url}", f"run.out={tmp_path / 'e.json'}"])
        assert res.exit_code == 0, res.output
        requests = len(server.requests)
    out = json.loads((tmp_path / "e.json").read_text())
    assert out["judge/calls"] == requests and out["judge/failures"] == 0
    rows = [json.loads(x) for x in (tmp_path / "e.samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    answered = sum(r["status"] == "correct" for r in rows)  # the judge said EQUIVALENT to each answer
    assert answered == out["judge/calls"] + out["judge/cache_hits"] > 0
    assert all(r["status"] in ("correct", "unparsable") for r in rows)
    assert out["accuracy"] == answered / 6
