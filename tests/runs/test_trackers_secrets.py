"""No secret in a run directory or its console output (issue 37's acceptance; marker `trackers`, `make
test-trackers`, which installs the wandb, trackio and mlflow extras). `rlvr train` (a tiny model, 2 steps, then
`--resume` to 3) with every tracker on (tensorboard, wandb offline, trackio local, mlflow), the model judge on
(a loopback fake judge that says EQUIVALENT, its API key in an environment variable) and credentials in the
environment (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, HF_TOKEN) and in MLFLOW_TRACKING_URI
(`http://rlvr:PASSWORD@127.0.0.1:PORT`: SQLite refuses user:password@, so a tracking server that is down,
whose failure the run must warn about without repeating the password, as MLflow's own error message does).
Every file under the run directory (binary ones too) and stdout + stderr of both runs are searched for each
secret: none is found. 127.0.0.1 only."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.judge_server import JudgeServer
from helpers.trackers import ALL, TINY, tracker_env

from rlvr.runs.rundir import read_jsonl

pytestmark = pytest.mark.trackers

SECRETS = {
    "judge": "SECRET-J-judge-91b7c2",
    "wandb": "SECRET-W-wandb-0123456789abcdef0123456789abcdef",
    "mlflow-uri": "SECRET-M-mlflow-77d1",
    "mlflow-token": "SECRET-T-mlflow-token-3c9a",
    "hf": "SECRET-H-hf-5e20",
}


def _closed_port() -> int:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(env: dict, *args: str) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", *TINY, "--threads", "1", *args],
                         capture_output=True, text=True, env=env, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_no_secret_in_the_run_directory_or_the_console(tmp_path):
    run_dir = tmp_path / "secret-run"
    mlflow_uri = f"http://rlvr:{SECRETS['mlflow-uri']}@127.0.0.1:{_closed_port()}"
    env = tracker_env(tmp_path, RLVR_TEST_JUDGE_KEY=SECRETS["judge"], WANDB_API_KEY=SECRETS["wandb"],
               MLFLOW_TRACKING_URI=mlflow_uri, MLFLOW_TRACKING_TOKEN=SECRETS["mlflow-token"],
               MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="5", HF_TOKEN=SECRETS["hf"])
    with JudgeServer(lambda answer, reference: "EQUIVALENT") as judge:
        judged = ["data.reward=judge", f"judge.url={judge.url}", "judge.model=loop",
                  "judge.api_key_env=RLVR_TEST_JUDGE_KEY"]
        first = _train(env, *judged, "run.steps=2", "run.log_samples_every=1", f"run.out_dir={run_dir}",
                       f"run.report_to={ALL}")
        resumed = _train(env, "--resume", str(run_dir), "run.steps=3")
        keys = {h.get("Authorization") for _, h, _ in judge.requests}
    # the secrets were there to leak: the judge got its key on every request, the trackers ran
    assert keys == {f"Bearer {SECRETS['judge']}"}
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["judge/calls"] >= 0 for r in rows)
    assert list((run_dir / "wandb").glob("offline-run-*")) and (run_dir / "trackio").is_dir()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    # no secret anywhere: every file under the run directory, bytes as they are, and both runs' console
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > 10
    found = [(name, str(p.relative_to(run_dir))) for p in files for name, secret in SECRETS.items()
             if secret.encode() in p.read_bytes()]
    for name, res in (("first run", first), ("resume", resumed)):
        for stream in ("stdout", "stderr"):
            found += [(key, f"{name} {stream}") for key, secret in SECRETS.items() if secret in getattr(res, stream)]
    assert not found, found
    # the MLflow server is down: each run warns once, naming the tracker and the redacted URI
    for res in (first, resumed):
        assert res.stderr.count("run.report_to=mlflow: opening the run failed") == 1, res.stderr[-3000:]
        assert "http://rlvr:***@127.0.0.1" in res.stderr


def test_the_run_folder_search_finds_a_planted_secret(tmp_path):
    """The search above is not vacuous: a secret written into a binary file of a run dir is found."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.db").write_bytes(b"\x00\x01" + SECRETS["wandb"].encode() + b"\xff")
    assert [p.name for p in Path(tmp_path).rglob("*") if p.is_file() and SECRETS["wandb"].encode() in p.read_bytes()] \
        == ["x.db"]
